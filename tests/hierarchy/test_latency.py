"""Closed forms of the latency model: seeds' examples, and agreement with simulation."""

import itertools

import numpy as np
import pytest

from sglang_hsd.hierarchy.latency import (
    ConstantCosts,
    expected_tokens,
    fill_distribution,
    gamma,
    hierarchy_latency,
    seed_latency,
    speculative_speedup,
    three_level_expected_tokens,
    yield_distribution,
)
from sglang_hsd.hierarchy.simulate import simulate_hierarchy

# Monte-Carlo standard error of a per-token cost over ~20k target rounds is < 1%; 3% leaves
# room for unlucky seeds but still catches a missing bonus token (~20-50% off) or overshoot.
MC_REL_TOL = 0.03
EXACT_TOL = 1e-12


def test_two_level_expected_tokens_seed_003():
    # Seed 003: alpha=0.7, K=4, c=0.1 -> E[n] = 2.77, cost factor 1.4, S ~ 1.98.
    assert expected_tokens(0.7, 4) == pytest.approx(2.7731, abs=1e-4)
    assert speculative_speedup(0.7, 4, 0.1) == pytest.approx(1.98, abs=0.005)


def test_seed_003_second_example_does_not_reproduce():
    # Seed 003 states alpha=0.8, K=5, c=0.05 -> E[n] = 3.36, S ~ 2.69. Its own formula gives
    # 3.69 and 2.95; 3.36 is (1 - 0.8^5)/0.2, i.e. the exponent K instead of K + 1.
    assert expected_tokens(0.8, 5) == pytest.approx(3.6893, abs=1e-4)
    assert speculative_speedup(0.8, 5, 0.05) == pytest.approx(2.951, abs=1e-3)
    assert expected_tokens(0.8, 4) == pytest.approx(3.3616, abs=1e-4)


def _three_level_enumeration(alpha, beta, n, m):
    """Seed 002, Table A.1: X = first rejected position (or m(n+1)+1), summed exactly."""
    probs = ([beta] * n + [alpha]) * m
    expect, alive = 0.0, 1.0
    for pos, accept in enumerate(probs, start=1):
        expect += pos * alive * (1 - accept)
        alive *= accept
    return expect + (len(probs) + 1) * alive


@pytest.mark.parametrize("alpha,beta,n,m", [(0.8, 0.6, 2, 3), (0.5, 0.9, 4, 1), (0.95, 0.3, 1, 5), (0.7, 0.7, 0, 4)])
def test_three_level_closed_form_seed_002(alpha, beta, n, m):
    assert three_level_expected_tokens(alpha, beta, n, m) == pytest.approx(
        _three_level_enumeration(alpha, beta, n, m), abs=EXACT_TOL
    )


def test_three_level_special_cases_seed_002():
    # n = 0: plain speculative decoding with m medium-model drafts.
    assert three_level_expected_tokens(0.7, 0.4, 0, 5) == pytest.approx(expected_tokens(0.7, 5))
    # m = 1, alpha = beta: the small model drafting n + 1 tokens.
    assert three_level_expected_tokens(0.6, 0.6, 3, 1) == pytest.approx(expected_tokens(0.6, 4))
    # n -> infinity: 1 / (1 - beta).
    assert three_level_expected_tokens(0.9, 0.5, 200, 3) == pytest.approx(2.0)


def test_yield_and_fill_distributions_sum_to_one():
    draft = np.array([0, 0, 0.3, 0.7])
    y = yield_distribution(0.6, draft)
    assert y.sum() == pytest.approx(1.0)
    assert np.dot(np.arange(len(y)), y) == pytest.approx(0.3 * expected_tokens(0.6, 2) + 0.7 * expected_tokens(0.6, 3))
    rounds, total = fill_distribution(y, 5)
    assert total.sum() == pytest.approx(1.0)
    assert total[:5].sum() == 0.0
    assert rounds >= 5 / len(y)


def test_gamma_matches_fill_distribution_of_a_fixed_draft():
    for alpha, t_lo, t_hi in itertools.product([0.0, 0.4, 0.9, 1.0], [1, 3], [1, 4, 7]):
        point = np.zeros(t_lo + 1)
        point[t_lo] = 1.0
        rounds, _ = fill_distribution(yield_distribution(alpha, point), t_hi)
        assert gamma(alpha, t_lo, t_hi) == pytest.approx(rounds, abs=EXACT_TOL)
    assert gamma(1.0, 3, 8) == 2.0  # 4 tokens per round
    assert gamma(0.0, 3, 8) == 8.0  # 1 token per round


def test_design_formula_equals_seed_theorem_term_by_term():
    rng = np.random.default_rng(1)
    costs = ConstantCosts((0.01, 0.1, 0.4, 1.0))
    for _ in range(20):
        levels = sorted(rng.choice(3, size=rng.integers(1, 4), replace=False).tolist()) + [3]
        buffers = rng.integers(1, 7, size=len(levels) - 1).tolist()
        alphas = rng.uniform(0, 1, size=len(levels) - 1).tolist()
        design = hierarchy_latency(levels, buffers, alphas, costs, exact=False).latency
        assert design == pytest.approx(seed_latency(levels, buffers, alphas, costs.costs), rel=1e-12)


def test_two_levels_exact_equals_design():
    costs = ConstantCosts((0.05, 1.0))
    for alpha, t in itertools.product([0.0, 0.3, 0.8, 1.0], [1, 5, 16]):
        exact = hierarchy_latency([0, 1], [t], [alpha], costs, exact=True)
        design = hierarchy_latency([0, 1], [t], [alpha], costs, exact=False)
        assert exact.latency == pytest.approx(design.latency, rel=1e-12)
        assert exact.latency == pytest.approx((t * 0.05 + 1.0) / expected_tokens(alpha, t), rel=1e-12)


class _LengthCosts:
    """Verification cost grows with the draft length: catches draft-length bookkeeping."""

    def draft_step(self, level):
        return 0.01 * (level + 1)

    def verify(self, lower, upper, draft_len):
        return 0.1 * upper + 0.02 * draft_len + 0.001 * lower

    def autoregressive_step(self):
        return 1.0


@pytest.mark.parametrize(
    "levels,buffers,alphas",
    [
        ([0, 3], [4], [0.7]),
        ([0, 1, 3], [2, 5], [0.8, 0.6]),
        ([0, 2, 3], [3, 3], [0.5, 0.9]),
        ([0, 1, 2, 3], [1, 3, 4], [0.9, 0.7, 0.6]),
    ],
)
def test_exact_model_matches_simulation(levels, buffers, alphas):
    costs = _LengthCosts()
    exact = hierarchy_latency(levels, buffers, alphas, costs, exact=True)
    simulated, tokens = simulate_hierarchy(levels, buffers, alphas, costs, target_rounds=20000, seed=3)
    assert simulated == pytest.approx(exact.latency, rel=MC_REL_TOL)
    assert tokens == pytest.approx(exact.tokens_per_round, rel=MC_REL_TOL)


def test_design_formula_undercounts_tokens_with_overshoot():
    # 3 levels: the intermediate buffer overshoots T_1, so the target sees longer drafts than
    # the DESIGN formula assumes; simulation sides with the exact model.
    costs = ConstantCosts((0.01, 0.2, 1.0))
    exact = hierarchy_latency([0, 1, 2], [4, 4], [0.9, 0.8], costs, exact=True)
    design = hierarchy_latency([0, 1, 2], [4, 4], [0.9, 0.8], costs, exact=False)
    _, tokens = simulate_hierarchy([0, 1, 2], [4, 4], [0.9, 0.8], costs, target_rounds=20000, seed=5)
    assert exact.tokens_per_round > design.tokens_per_round * 1.1
    assert tokens == pytest.approx(exact.tokens_per_round, rel=MC_REL_TOL)
