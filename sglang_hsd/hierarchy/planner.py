"""Exact choice of levels and buffer sizes minimising expected latency per token.

Objective: the paper's latency formula (``hierarchy_latency(..., exact=False)``;
``docs/hierarchy.md``, "Planner"), over every ordered subset of candidate levels that ends at the
target and every buffer T_k in 1..t_max.

Why a dynamic program is exact here (the generalized-shortest-path reduction of seed "Fast
Inference via Hierarchical Speculative Decoding", Section 3.3, specialised to its DAG): the
formula's cost of a fill of level j to T_j tokens only depends on the sub-hierarchy below j
through the cost of one fill of the level i right below it, to t tokens:

    V(j, T) = min( T * draft_step(j),                                   # j drafts itself
                   min_{i < j, t} gamma(a_ij, t, T) * (V(i, t) + verify(i, j, t)) )

and the latency is min_{j, T} (V(j, T) + verify(j, target, T)) / E_tokens(a_j,target, T). Every
multiplier (gamma, 1/E) is positive, so minimising each V(i, t) minimises every hierarchy built on
it: this is the GSP's cheapest augmented path, computed without a general GSP solver because the
graph (levels strictly increase) is acyclic. Unlike the seed's edge set we do not require
t <= T between consecutive levels. ``max_levels`` adds a depth index to the state.
Cost: O(depth * K^2 * t_max^2) edge evaluations; ``tests/hierarchy`` checks it against
exhaustive enumeration.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from sglang_hsd.hierarchy.latency import CostModel, _gamma_table, expected_tokens, hierarchy_latency

_INF = float("inf")


@dataclass(frozen=True)
class Plan:
    """One hierarchy and its predicted behaviour (``runtime.plan_file.PlannedHierarchy.from_plan``
    turns it into the level grammar of a plan file).

    Fields:
        levels: level ids, cheapest first, the target last.
        buffers: T_k per level below the target.
        latency: predicted cost per token (the planner's objective, the paper's formula).
        speedup: autoregressive step cost / latency.
        exact_latency: the same hierarchy under the runtime's exact model (buffer overshoot).
    """

    levels: tuple[int, ...]
    buffers: tuple[int, ...]
    latency: float
    speedup: float
    exact_latency: float

    @property
    def exact_speedup(self) -> float:
        return self.speedup * self.latency / self.exact_latency


@dataclass(frozen=True)
class PlanResult:
    """The planner's answer.

    Fields:
        best: the best hierarchy (any number of levels allowed by ``max_levels``).
        best_single_draft: the best two-level (one drafter) configuration, the runner-up.
    """

    best: Plan
    best_single_draft: Plan


def consecutive_alphas(alpha: np.ndarray, levels: Sequence[int]) -> list[float]:
    """alpha[levels[k-1], levels[k]] for k = 1..m."""
    return [float(alpha[lo, hi]) for lo, hi in zip(levels[:-1], levels[1:])]


def make_plan(levels, buffers, alpha: np.ndarray, costs: CostModel) -> Plan:
    """Score one hierarchy under both latency variants."""
    alphas = consecutive_alphas(alpha, levels)
    design = hierarchy_latency(levels, buffers, alphas, costs, exact=False)
    exact = hierarchy_latency(levels, buffers, alphas, costs, exact=True)
    return Plan(tuple(levels), tuple(buffers), design.latency, design.speedup, exact.latency)


def plan_hierarchy(
    alpha: np.ndarray, costs: CostModel, t_max: int = 16, max_levels: int | None = None
) -> PlanResult:
    """Find the latency-optimal hierarchy.

    Args:
        alpha: float [K + 1, K + 1]; alpha[i, j] (i < j) = acceptance of level i's tokens by
            level j. Ids 0..K-1 are candidate drafters/intermediates (cheapest first), K the target.
        costs: a ``CostModel`` over the same ids.
        t_max: largest buffer considered.
        max_levels: cap on the number of levels including the target (None: no cap; >= 2).
    """
    num = alpha.shape[0]
    target = num - 1
    depth = (num if max_levels is None else max_levels) - 1  # levels below the target
    if depth < 1:
        raise ValueError("max_levels must be >= 2")
    sizes = np.arange(1, t_max + 1)
    # value[d][j]: float [t_max], cheapest fill of level j to T tokens with j at depth <= d + 1
    # below the target (d = 0: j drafts). back[d][j][T - 1] = (i, t) or None.
    value = np.full((depth, target, t_max), _INF)
    back: dict[tuple[int, int, int], tuple[int, int] | None] = {}
    for j in range(target):
        value[0, j] = sizes * costs.draft_step(j)
    for d in range(1, depth):
        value[d] = value[d - 1]
        for j in range(target):
            for i in range(j):
                if not np.isfinite(value[d - 1, i]).any():
                    continue
                verify = np.array([costs.verify(i, j, t) for t in sizes])
                below = value[d - 1, i] + verify  # [t]
                gammas = np.array([_gamma_table(float(alpha[i, j]), int(t), t_max)[1:] for t in sizes])  # [t, T]
                cand = gammas * below[:, None]
                best_t = cand.argmin(axis=0)
                best = cand[best_t, np.arange(t_max)]
                better = best < value[d, j]
                value[d, j] = np.where(better, best, value[d, j])
                for size in np.nonzero(better)[0]:
                    back[(d, j, int(size))] = (i, int(best_t[size]) + 1)
    best_plan = _best_top(value[depth - 1], alpha, costs, t_max)
    single = _best_top(value[0], alpha, costs, t_max)
    return PlanResult(
        best=_unwind(best_plan, depth - 1, back, alpha, costs),
        best_single_draft=_unwind(single, 0, back, alpha, costs),
    )


def _best_top(value: np.ndarray, alpha: np.ndarray, costs: CostModel, t_max: int) -> tuple[int, int]:
    target = value.shape[0]
    best, arg = _INF, (0, 1)
    for j in range(target):
        for size in range(1, t_max + 1):
            total = (value[j, size - 1] + costs.verify(j, target, size)) / expected_tokens(alpha[j, target], size)
            if total < best:
                best, arg = total, (j, size)
    return arg


def _unwind(top: tuple[int, int], d: int, back, alpha, costs) -> Plan:
    levels, buffers = [top[0]], [top[1]]
    j, size = top
    while d > 0:
        step = back.get((d, j, size - 1))
        if step is None:
            d -= 1  # the value at this depth was inherited from a shallower one
            continue
        j, size = step
        levels.append(j)
        buffers.append(size)
        d -= 1
    levels, buffers = levels[::-1], buffers[::-1]
    return make_plan(levels + [alpha.shape[0] - 1], buffers, alpha, costs)


def exhaustive_search(
    alpha: np.ndarray, costs: CostModel, t_max: int, max_levels: int | None = None, exact: bool = False
) -> Plan:
    """Enumerate every subset and buffer assignment (small instances only; the tests' oracle)."""
    target = alpha.shape[0] - 1
    best, best_latency = None, _INF
    cap = target if max_levels is None else max_levels - 1
    for size in range(1, cap + 1):
        for subset in itertools.combinations(range(target), size):
            levels = list(subset) + [target]
            alphas = consecutive_alphas(alpha, levels)
            for buffers in itertools.product(range(1, t_max + 1), repeat=size):
                latency = hierarchy_latency(levels, buffers, alphas, costs, exact=exact).latency
                if latency < best_latency:
                    best, best_latency = (levels, buffers), latency
    return make_plan(best[0], best[1], alpha, costs)
