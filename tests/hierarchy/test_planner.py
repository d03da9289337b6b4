"""The planner: seed 004's examples, exhaustive-search equivalence, speed."""

import time

import numpy as np
import pytest

from sglang_hsd.hierarchy.latency import ConstantCosts
from sglang_hsd.hierarchy.planner import exhaustive_search, plan_hierarchy

# Seed 004, Appendix B.3, Table 6 (upper triangle, rows = models 1..5, columns 2..6) and costs.
TABLE_6 = [[0.75, 0.5, 0.25, 0.0, 0.0], [0.75, 0.5, 0.25, 0.05], [0.75, 0.5, 0.3], [0.75, 0.55], [0.8]]
COSTS_1 = (0.00001, 0.003, 0.01, 0.25, 4.0, 33.0)
TABLE_7 = [[0.525, 0.125, 0.0, 0.0, 0.0], [0.6, 0.275, 0.025, 0.0], [0.675, 0.425, 0.225], [0.75, 0.55], [0.8]]
COSTS_2 = (0.00005, 0.0002, 0.05, 2.0, 8.0, 33.0)
RATIO_TOL = 1e-9


def _matrix(rows):
    alpha = np.zeros((len(rows) + 1, len(rows) + 1))
    for i, row in enumerate(rows):
        alpha[i, i + 1 :] = row
    return alpha


def _last_models(rows, costs, count):
    alpha = _matrix(rows)
    ids = list(range(len(costs) - count, len(costs)))
    return alpha[np.ix_(ids, ids)], ConstantCosts(tuple(costs[i] for i in ids))


@pytest.mark.parametrize("rows,costs,latency,speedup", [(TABLE_6, COSTS_1, 14.37, 2.2971), (TABLE_7, COSTS_2, 19.31, 1.7090)])
def test_seed_004_two_model_rows_reproduce(rows, costs, latency, speedup):
    alpha, sub_costs = _last_models(rows, costs, 2)
    result = plan_hierarchy(alpha, sub_costs, t_max=16)
    assert result.best.latency == pytest.approx(latency, abs=0.005)
    assert result.best.speedup == pytest.approx(speedup, abs=0.0005)


@pytest.mark.parametrize("rows,costs", [(TABLE_6, COSTS_1), (TABLE_7, COSTS_2)])
def test_seed_004_more_models_never_hurt_and_beat_single_draft(rows, costs):
    # Seed's Tables 1 and 8 (3..6 models: 10.89, 10.64, 10.63, 10.61 and 15.45, 14.61, 14.46,
    # 14.40) rest on an empirically estimated gamma and do not reproduce with the exact one
    # (we get 11.21, 10.66, 10.64, 10.62 and 17.11, 15.58, 15.52, 15.52); the qualitative claim
    # does: latency falls as models are offered, and the hierarchy beats one drafter.
    latencies = []
    for count in range(2, 7):
        alpha, sub_costs = _last_models(rows, costs, count)
        result = plan_hierarchy(alpha, sub_costs, t_max=16)
        latencies.append(result.best.latency)
        assert result.best.latency <= result.best_single_draft.latency * (1 + RATIO_TOL)
    assert all(b <= a * (1 + RATIO_TOL) for a, b in zip(latencies, latencies[1:]))
    assert latencies[1] < latencies[0] * 0.9


# Seed 004, Appendix B.4, Table 9: A (cost 1024) <- B (cost 256, alpha_BA = 0.5) <- C; alpha_CA is
# the triangle-inequality lower bound. Rows: alpha_CB; columns: cost of C 1, 2, ..., 256.
TABLE_9 = {
    0.0: [1.20] * 9,
    0.3: [1.23, 1.23, 1.22, 1.22, 1.21, 1.20, 1.20, 1.20, 1.20],
    0.5: [1.27, 1.27, 1.27, 1.26, 1.25, 1.23, 1.20, 1.20, 1.20],
    0.7: [1.34, 1.33, 1.33, 1.32, 1.30, 1.28, 1.24, 1.20, 1.20],
    0.8: [1.42, 1.41, 1.40, 1.38, 1.35, 1.31, 1.27, 1.21, 1.20],
    0.9: [1.65, 1.64, 1.63, 1.60, 1.55, 1.48, 1.39, 1.25, 1.20],
}


@pytest.mark.parametrize("alpha_cb", sorted(TABLE_9))
def test_seed_004_table_9_reproduces(alpha_cb):
    for cost_c, expected in zip([1, 2, 4, 8, 16, 32, 64, 128, 256], TABLE_9[alpha_cb]):
        alpha = np.zeros((3, 3))
        alpha[0, 1], alpha[1, 2], alpha[0, 2] = alpha_cb, 0.5, max(0.0, alpha_cb - 0.5)
        result = plan_hierarchy(alpha, ConstantCosts((cost_c, 256.0, 1024.0)), t_max=16)
        assert round(result.best.speedup, 2) == expected, (alpha_cb, cost_c)


def _random_instance(rng, num):
    alpha = np.zeros((num, num))
    for i in range(num):
        for j in range(i + 1, num):
            alpha[i, j] = rng.uniform(0.0, 0.95)
    costs = np.sort(rng.uniform(0.001, 0.5, size=num - 1)).tolist() + [1.0]
    return alpha, ConstantCosts(tuple(costs))


class _LengthCosts:
    """Costs that depend on the draft length and the lower level (the runtime's shape)."""

    def __init__(self, per_level):
        self.per_level = per_level

    def draft_step(self, level):
        return self.per_level[level]

    def verify(self, lower, upper, draft_len):
        return self.per_level[upper] - 0.5 * self.per_level[lower] + 0.01 * draft_len

    def autoregressive_step(self):
        return self.per_level[-1] + 0.01


@pytest.mark.parametrize("seed", range(8))
def test_planner_equals_exhaustive_search(seed):
    rng = np.random.default_rng(seed)
    alpha, costs = _random_instance(rng, 5)
    if seed % 2:
        costs = _LengthCosts(list(costs.costs))
    t_max = 4
    result = plan_hierarchy(alpha, costs, t_max=t_max)
    oracle = exhaustive_search(alpha, costs, t_max=t_max)
    assert result.best.latency == pytest.approx(oracle.latency, rel=1e-12)
    single = exhaustive_search(alpha, costs, t_max=t_max, max_levels=2)
    assert result.best_single_draft.latency == pytest.approx(single.latency, rel=1e-12)
    assert result.best.latency <= result.best_single_draft.latency * (1 + RATIO_TOL)
    capped = plan_hierarchy(alpha, costs, t_max=t_max, max_levels=3)
    assert capped.best.latency == pytest.approx(exhaustive_search(alpha, costs, t_max, max_levels=3).latency, rel=1e-12)
    assert len(capped.best.levels) <= 3


def test_plan_latency_is_its_hierarchy_latency():
    rng = np.random.default_rng(11)
    alpha, costs = _random_instance(rng, 6)
    best = plan_hierarchy(alpha, costs, t_max=8).best
    assert best.levels[-1] == 5 and list(best.levels) == sorted(best.levels)
    assert len(best.buffers) == len(best.levels) - 1 and all(1 <= t <= 8 for t in best.buffers)


def test_planner_speed_30_candidates():
    rng = np.random.default_rng(0)
    num = 31
    layers = np.arange(1, num + 1)
    # alpha grows with depth and closeness (a layered model); costs proportional to depth.
    alpha = np.zeros((num, num))
    for i in range(num):
        for j in range(i + 1, num):
            alpha[i, j] = np.clip(0.2 + 0.75 * layers[i] / num - 0.3 * (j - i) / num + rng.normal(0, 0.02), 0, 1)
    costs = ConstantCosts(tuple((layers / num).tolist()))
    start = time.perf_counter()
    result = plan_hierarchy(alpha, costs, t_max=16)
    elapsed = time.perf_counter() - start
    print(f"planner: 30 candidates x T<=16 in {elapsed:.2f}s -> {result.best.levels} {result.best.buffers}")
    assert result.best.latency <= result.best_single_draft.latency * (1 + RATIO_TOL)
