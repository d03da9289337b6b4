"""Expected latency per emitted token of a speculative hierarchy, in the i.i.d.-acceptance model.

Levels are numbered 0..m, cheapest first; level m is the target. ``alphas[k - 1]`` is the
probability that level k accepts one token of level k - 1 (alpha = 1 - TV(p_{k-1}, p_k)), each
token independently (the idealised model of ``docs/hierarchy.md``, "Latency model").
``buffers[k]`` is T_k for k < m.

Mapping to the runtime (``sglang_hsd/runtime/engine.py``), which this module models exactly up to
the i.i.d. assumption:

* Level 0 (drafter) ``buffer`` T_0: every fill drafts exactly T_0 tokens, one drafter step each
  (lower buffers are always empty after a verification, so no fill starts part-full).
* A verification round of level k >= 1 takes the whole buffer of level k - 1 (D tokens), keeps the
  accepted prefix *and* the corrected/bonus token: it yields ``Y = min(G, D) + 1`` tokens, with
  ``P(G >= g) = alpha^g``. The correction/bonus token counts: it is level k's own token, and the
  level above treats it like any other.
* Level 1 <= k < m with ``buffer`` T_k repeats (fill level k - 1, verify) until it holds >= T_k
  tokens, so its buffer D_k can overshoot T_k by up to max(Y) - 1 tokens. gamma = expected rounds.
* The target runs one round per fill of level m - 1 and commits Y tokens.

By renewal-reward and Wald's identity (rounds are i.i.d. and a fill stops at a stopping time),
latency = E[cost of one target round] / E[tokens per target round].

Two variants:

* ``exact=True``: carries the full distribution of each buffer length D_k (overshoot included);
  this is what the runtime does.
* ``exact=False``: the formula of seed "Fast Inference via Hierarchical Speculative Decoding"
  (Theorem 2.2; ``docs/hierarchy.md``, "Latency model"): sum_i c_i prod_{j>=i} R(alpha_{j-1,j}, j),
  treating every buffer handed up as exactly T_k tokens. R = (1 - a)/(1 - a^{T+1}) at the top,
  ``gamma(a, T_lo, T_hi)`` in between, T_0 at the bottom. The two agree for two levels; for more
  levels the second undercounts the tokens the level above receives. The planner optimises this
  form (it decomposes over consecutive pairs); :func:`hierarchy_latency` with ``exact=True``
  re-scores its choice.

Costs come from a :class:`CostModel` (``ConstantCosts`` for the papers' c_i; measured,
layer-aware costs in ``costs.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol, Sequence

import numpy as np


class CostModel(Protocol):
    """Cost of the pieces of a hierarchy, in any consistent unit (seconds, or target = 1).

    Level ids are the planner's candidate indices; the target is the largest id.
    """

    def draft_step(self, level: int) -> float:
        """One autoregressive step of ``level`` as the drafter."""

    def verify(self, lower: int, upper: int, draft_len: int) -> float:
        """One verification by ``upper`` of ``draft_len`` tokens drafted by ``lower``."""

    def autoregressive_step(self) -> float:
        """One step of plain autoregressive decoding with the target."""


@dataclass(frozen=True)
class ConstantCosts:
    """Each level costs c_i per forward, whatever it does (the seeds' model).

    Fields:
        costs: c_i per level id; the last one is the target.
    """

    costs: tuple[float, ...]

    def draft_step(self, level: int) -> float:
        return self.costs[level]

    def verify(self, lower: int, upper: int, draft_len: int) -> float:
        return self.costs[upper]

    def autoregressive_step(self) -> float:
        return self.costs[-1]


# ----------------------------------------------------------------------------- closed forms
def expected_tokens(alpha: float, draft_len: int) -> float:
    """E[min(G, K) + 1] = (1 - a^{K+1}) / (1 - a): tokens one verification of K drafts yields."""
    if alpha >= 1.0:
        return float(draft_len + 1)
    return (1.0 - alpha ** (draft_len + 1)) / (1.0 - alpha)


def speculative_speedup(alpha: float, draft_len: int, cost_ratio: float) -> float:
    """Two-level speed-up over autoregressive decoding: E[tokens] / (1 + K c)."""
    return expected_tokens(alpha, draft_len) / (1.0 + draft_len * cost_ratio)


def three_level_expected_tokens(alpha: float, beta: float, n: int, m: int) -> float:
    """Seed "An Exploration of Hierarchical Speculative Decoding", Theorem 3.2.

    Its scheme (not our runtime's): m blocks of n small-model tokens (each accepted by the target
    with probability ``beta``) plus one medium-model token (accepted with ``alpha``), all verified
    by the target at once. E = (1-b^{n+1})/(1-b) (1-Q^m)/(1-Q) + Q^m with Q = a b^n.
    """
    q = alpha * beta**n
    first = float(n + 1) if beta >= 1.0 else (1.0 - beta ** (n + 1)) / (1.0 - beta)
    blocks = float(m) if q >= 1.0 else (1.0 - q**m) / (1.0 - q)
    return first * blocks + q**m


# ---------------------------------------------------------------------- distributions
def yield_distribution(alpha: float, draft_len_pmf: np.ndarray) -> np.ndarray:
    """Distribution of the tokens one verification yields, Y = min(G, D) + 1.

    Args:
        alpha: per-token acceptance probability.
        draft_len_pmf: float [Dmax + 1]; entry d is P(D = d).
    Returns:
        float [Dmax + 2]; entry y is P(Y = y) (entry 0 is 0).
    """
    dmax = len(draft_len_pmf) - 1
    out = np.zeros(dmax + 2)
    for d, p_d in enumerate(draft_len_pmf):
        if p_d == 0.0:
            continue
        accept = alpha ** np.arange(d + 1)  # P(G >= g), g = 0..d
        pmf = accept.copy()
        pmf[:-1] -= accept[1:]  # P(min(G, d) = g)
        out[1 : d + 2] += p_d * pmf
    return out


def fill_distribution(yield_pmf: np.ndarray, target: int) -> tuple[float, np.ndarray]:
    """Repeat i.i.d. rounds of ``yield_pmf`` until the total reaches ``target``.

    Returns:
        (expected number of rounds gamma, float [target + len(yield_pmf) - 1] pmf of the total).
    """
    ymax = len(yield_pmf) - 1
    visit = np.zeros(target)  # probability the running total ever equals s < target
    visit[0] = 1.0
    total = np.zeros(target + ymax)
    for s in range(target):
        if visit[s] == 0.0:
            continue
        for y in range(1, ymax + 1):
            mass = visit[s] * yield_pmf[y]
            if s + y < target:
                visit[s + y] += mass
            else:
                total[s + y] += mass
    return float(visit.sum()), total


@lru_cache(maxsize=None)
def _gamma_table(alpha: float, t_lo: int, t_max: int) -> tuple[float, ...]:
    yield_pmf = yield_distribution(alpha, _point_mass(t_lo))
    ymax = len(yield_pmf) - 1
    rounds = np.zeros(t_max + 1)  # rounds[r]: expected rounds to gather r more tokens
    for need in range(1, t_max + 1):
        rounds[need] = 1.0 + sum(yield_pmf[y] * rounds[max(need - y, 0)] for y in range(1, ymax + 1))
    return tuple(rounds)


def gamma(alpha: float, t_lo: int, t_hi: int) -> float:
    """Expected rounds for a level to gather >= ``t_hi`` tokens from drafts of exactly ``t_lo``."""
    return _gamma_table(float(alpha), int(t_lo), int(t_hi))[t_hi]


def _point_mass(value: int) -> np.ndarray:
    pmf = np.zeros(value + 1)
    pmf[value] = 1.0
    return pmf


# ---------------------------------------------------------------------------- hierarchy
@dataclass(frozen=True)
class LatencyBreakdown:
    """Expected behaviour of one hierarchy.

    Fields:
        latency: expected cost per emitted token.
        tokens_per_round: expected tokens one target verification commits.
        cost_per_round: expected cost of one target round (fills below included).
        rounds_per_fill: gamma per intermediate level (levels 1..m-1), expected rounds per fill.
        mean_buffer: expected buffer length each level hands up (levels 0..m-1).
        speedup: autoregressive_step / latency.
    """

    latency: float
    tokens_per_round: float
    cost_per_round: float
    rounds_per_fill: tuple[float, ...]
    mean_buffer: tuple[float, ...]
    speedup: float


def hierarchy_latency(
    levels: Sequence[int],
    buffers: Sequence[int],
    alphas: Sequence[float],
    costs: CostModel,
    exact: bool = True,
) -> LatencyBreakdown:
    """Expected latency per token of ``levels`` (level ids, cheapest first, target last).

    Args:
        buffers: T_k for every level but the target (len(levels) - 1 entries, each >= 1).
        alphas: acceptance of level k - 1 by level k, k = 1..m (len(levels) - 1 entries).
        exact: carry buffer-length distributions (the runtime); False = the paper's formula
            (``docs/hierarchy.md``, "Latency model").
    """
    if len(levels) < 2 or len(buffers) != len(levels) - 1 or len(alphas) != len(levels) - 1:
        raise ValueError("need >= 2 levels, one buffer and one alpha per level below the target")
    if any(t < 1 for t in buffers):
        raise ValueError(f"buffers must be >= 1, got {list(buffers)}")
    draft_pmf = _point_mass(buffers[0])
    fill_cost = buffers[0] * costs.draft_step(levels[0])
    gammas, means = [], [float(buffers[0])]
    for k in range(1, len(levels)):
        verify_cost = sum(p * costs.verify(levels[k - 1], levels[k], d) for d, p in enumerate(draft_pmf) if p)
        yield_pmf = yield_distribution(alphas[k - 1], draft_pmf)
        if k == len(levels) - 1:
            tokens = float(np.dot(np.arange(len(yield_pmf)), yield_pmf))
            round_cost = fill_cost + verify_cost
            latency = round_cost / tokens
            return LatencyBreakdown(
                latency, tokens, round_cost, tuple(gammas), tuple(means),
                costs.autoregressive_step() / latency,
            )
        rounds, total_pmf = fill_distribution(yield_pmf, buffers[k])
        if not exact:
            rounds, total_pmf = gamma(alphas[k - 1], buffers[k - 1], buffers[k]), _point_mass(buffers[k])
        fill_cost = rounds * (fill_cost + verify_cost)
        draft_pmf = total_pmf
        gammas.append(rounds)
        means.append(float(np.dot(np.arange(len(total_pmf)), total_pmf)))
    raise AssertionError("unreachable")


def seed_latency(levels: Sequence[int], buffers: Sequence[int], alphas: Sequence[float], costs: Sequence[float]) -> float:
    """Theorem 2.2 of the seed written out term by term: sum_i c_i prod_{j >= i} R_j.

    A second, independent implementation of ``hierarchy_latency(..., exact=False)`` with
    constant costs, kept for the tests.
    """
    m = len(levels) - 1
    factors = [float(buffers[0])]  # R_0 = T_0
    factors += [gamma(alphas[j - 1], buffers[j - 1], buffers[j]) for j in range(1, m)]
    factors.append(1.0 / expected_tokens(alphas[m - 1], buffers[m - 1]))
    total = 0.0
    for i in range(m + 1):
        total += costs[levels[i]] * float(np.prod(factors[i:]))
    return total
