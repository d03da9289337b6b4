"""Exact-enumeration oracle for chain verifiers.

A *world* gives a context-dependent target p(.|prefix) and draft q(.|prefix) over a tiny
vocabulary. For a verification method, this module computes in float64, with no sampling:

* the exact law of one speculative round from a prefix (every draft sequence, weighted by its draft
  probability, times the exact law of the verifier's outcome given that draft);
* the exact distribution of the first L emitted tokens over as many rounds as it takes;
* the exact expected number of accepted draft tokens per round.

A lossless method gives the target's own distribution of L-token prefixes (TV ~1e-16). Looking at
multi-token prefixes over several rounds matters: single-token marginals can be right while 2- and
3-token prefixes are wrong.

The per-draft outcome laws here are written out from the formulas, independently of the batched
torch sampler in ``chain/reference.py``; tests check the sampler against them statistically.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import lru_cache

import numpy as np


@dataclass(frozen=True, eq=False)
class TabularWorld:
    """Target and draft distributions for every prefix up to ``max_len`` tokens.

    Prefix ``x_1..x_n`` has code ``offset(n) + sum_i x_i V^(n-i)`` with ``offset(n) = sum_{l<n} V^l``.

    Fields:
        vocab_size: V.
        max_len: longest prefix with a row.
        target: float64 [num_prefixes, V], p(.|prefix).
        draft: float64 [num_prefixes, V], q(.|prefix).
    """

    vocab_size: int
    max_len: int
    target: np.ndarray
    draft: np.ndarray

    def code(self, prefix: tuple[int, ...]) -> int:
        n = len(prefix)
        if n > self.max_len:
            raise ValueError(f"prefix of length {n} exceeds the world's max_len {self.max_len}")
        value = 0
        for token in prefix:
            value = value * self.vocab_size + token
        return prefix_offset(self.vocab_size, n) + value

    def p(self, prefix: tuple[int, ...]) -> np.ndarray:
        return self.target[self.code(prefix)]

    def q(self, prefix: tuple[int, ...]) -> np.ndarray:
        return self.draft[self.code(prefix)]


def prefix_offset(vocab_size: int, length: int) -> int:
    """Number of prefixes shorter than ``length``: the code of the first prefix of that length."""
    return sum(vocab_size**n for n in range(length))


def random_world(
    vocab_size: int = 3,
    max_len: int = 6,
    seed: int = 0,
    concentration: float = 1.0,
    draft: str = "mixture",
) -> TabularWorld:
    """A random context-dependent world.

    Args:
        concentration: Dirichlet concentration of the rows (small = peaked distributions).
        draft: how q relates to p. ``"mixture"``: q = w p + (1 - w) d with a random weight w and an
            independent Dirichlet row d (a drafter that is right some of the time);
            ``"independent"``: an unrelated Dirichlet row; ``"one-hot"``: all mass on the argmax of
            a noisy copy of p (SGLang's default top-k drafting, whose q is a point mass).
    """
    rng = np.random.default_rng(seed)
    rows = prefix_offset(vocab_size, max_len + 1)
    target = rng.dirichlet(np.full(vocab_size, concentration), size=rows)
    other = rng.dirichlet(np.full(vocab_size, concentration), size=rows)
    if draft == "mixture":
        weight = rng.uniform(0.2, 0.9, size=(rows, 1))
        q = weight * target + (1 - weight) * other
    elif draft == "independent":
        q = other
    elif draft == "one-hot":
        q = np.eye(vocab_size)[np.argmax(0.7 * target + 0.3 * other, axis=-1)]
    else:
        raise ValueError(f"draft must be 'mixture', 'independent' or 'one-hot', got {draft!r}")
    return TabularWorld(vocab_size, max_len, target, q / q.sum(-1, keepdims=True))


def tempered_draft(world: TabularWorld, scale: float) -> TabularWorld:
    """``world`` with every q row at ``scale`` times its temperature: q^(1/scale), renormalised
    (softmax(l / (T S)) from softmax(l / T)); S < 1 sharpens, S > 1 flattens. p is unchanged."""
    if not scale > 0:
        raise ValueError(f"scale must be > 0, got {scale}")
    logq = np.log(np.where(world.draft > 0, world.draft, 1.0)) / scale
    q = np.where(world.draft > 0, np.exp(logq - logq.max(-1, keepdims=True)), 0.0)
    return TabularWorld(world.vocab_size, world.max_len, world.target, q / q.sum(-1, keepdims=True))


def context_free_world(target: list[float], draft: list[float], max_len: int = 6) -> TabularWorld:
    """The same p and q after every prefix (the toy examples of the papers)."""
    vocab = len(target)
    rows = prefix_offset(vocab, max_len + 1)
    p = np.tile(np.asarray(target, dtype=np.float64), (rows, 1))
    q = np.tile(np.asarray(draft, dtype=np.float64), (rows, 1))
    return TabularWorld(vocab, max_len, p, q)


# ---------------------------------------------------------------------------------------------
# Per-draft outcome laws: {(num_accepted, next_token): probability}
# ---------------------------------------------------------------------------------------------


def _normalised(weights: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    total = weights.sum()
    return weights / total if total > 0 else fallback


def _outcomes_from_stops(stop_probs, next_dists) -> dict[tuple[int, int], float]:
    law: dict[tuple[int, int], float] = {}
    for n, (stop, dist) in enumerate(zip(stop_probs, next_dists)):
        if stop <= 0:
            continue
        for token in np.nonzero(dist)[0]:
            law[(n, int(token))] = law.get((n, int(token)), 0.0) + stop * dist[token]
    return law


def hsd_outcome_law(p_rows: np.ndarray, q_rows: np.ndarray, draft: tuple[int, ...], capped: bool = True):
    """Exact law of (tau, next token) for capped hierarchical branch resampling (or uncapped)."""
    k = len(draft)
    ratio = np.array([p_rows[t][x] / q_rows[t][x] for t, x in enumerate(draft)])
    joint = np.concatenate([[1.0], np.cumprod(ratio)])  # R_0..R_K
    cap = np.maximum.accumulate(np.maximum(joint, 1.0))  # M_0..M_K
    r_star = joint / cap
    h = np.empty(k + 1)
    residuals = []
    for t in range(k):
        residual = np.maximum(r_star[t] * p_rows[t] - q_rows[t], 0.0)
        excess = residual.sum()
        deficit = excess + 1.0 - r_star[t]
        h[t] = 1.0 if t == 0 else (excess / deficit if deficit > 0 else 0.0)
        residuals.append(_normalised(residual, p_rows[t]))
    h[k] = r_star[k] if capped else min(1.0, joint[k])
    residuals.append(p_rows[k])
    # Backward scan: stop at t iff coin t succeeds and every coin after it failed.
    stop = [h[t] * np.prod(1.0 - h[t + 1 :]) for t in range(k + 1)]
    return _outcomes_from_stops(stop, residuals)


def tokenwise_outcome_law(p_rows: np.ndarray, q_rows: np.ndarray, draft: tuple[int, ...]):
    """Exact law of (tau, next token) for token-by-token speculative sampling."""
    k = len(draft)
    accept = [min(1.0, p_rows[t][x] / q_rows[t][x]) for t, x in enumerate(draft)]
    stop, survive = [], 1.0
    for t in range(k):
        stop.append(survive * (1.0 - accept[t]))
        survive *= accept[t]
    stop.append(survive)
    residuals = [_normalised(np.maximum(p_rows[t] - q_rows[t], 0.0), p_rows[t]) for t in range(k)]
    return _outcomes_from_stops(stop, residuals + [p_rows[k]])


def greedy_outcome_law(p_rows: np.ndarray, q_rows: np.ndarray, draft: tuple[int, ...]):
    """Greedy verification: deterministic given the draft."""
    n = 0
    while n < len(draft) and draft[n] == int(np.argmax(p_rows[n])):
        n += 1
    return {(n, int(np.argmax(p_rows[n]))): 1.0}


OUTCOME_LAWS = {
    "hsd": lambda p, q, x: hsd_outcome_law(p, q, x, capped=True),
    "hsd-paper": lambda p, q, x: hsd_outcome_law(p, q, x, capped=False),
    "tokenwise": tokenwise_outcome_law,
    "greedy": greedy_outcome_law,
}


# ---------------------------------------------------------------------------------------------
# Rounds and prefixes
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RoundLaw:
    """Exact law of one speculative round from a fixed prefix.

    Fields:
        emitted: {emitted token tuple: probability}; each tuple is the accepted drafts plus the
            corrected/bonus token.
        expected_accepted: E[number of accepted draft tokens].
    """

    emitted: dict[tuple[int, ...], float]
    expected_accepted: float


def round_law(world: TabularWorld, method: str, num_draft: int, prefix: tuple[int, ...] = ()) -> RoundLaw:
    """Enumerate every draft of ``num_draft`` tokens from ``prefix`` and the verifier's outcomes."""
    return _round_law_cached(world, method, num_draft, tuple(prefix))


@lru_cache(maxsize=None)
def _round_law_cached(world: TabularWorld, method: str, num_draft: int, prefix: tuple[int, ...]) -> RoundLaw:
    if method not in OUTCOME_LAWS:
        raise ValueError(f"method must be one of {sorted(OUTCOME_LAWS)}, got {method!r}")
    law = OUTCOME_LAWS[method]
    emitted: dict[tuple[int, ...], float] = {}
    expected = 0.0
    for draft in itertools.product(range(world.vocab_size), repeat=num_draft):
        contexts = [prefix + draft[:t] for t in range(num_draft + 1)]
        q_rows = np.stack([world.q(c) for c in contexts[:-1]])
        draft_prob = float(np.prod([q_rows[t][x] for t, x in enumerate(draft)]))
        if draft_prob == 0.0:
            continue
        p_rows = np.stack([world.p(c) for c in contexts])
        for (n, token), prob in law(p_rows, q_rows, draft).items():
            block = draft[:n] + (token,)
            emitted[block] = emitted.get(block, 0.0) + draft_prob * prob
            expected += draft_prob * prob * n
    return RoundLaw(emitted, expected)


def speculative_prefix_distribution(
    world: TabularWorld, method: str, num_draft: int, length: int
) -> dict[tuple[int, ...], float]:
    """Exact distribution of the first ``length`` tokens emitted by repeated speculative rounds."""
    needed = length - 1 + num_draft
    if needed > world.max_len:
        raise ValueError(
            f"length {length} with num_draft {num_draft} needs prefixes of {needed} tokens; "
            f"the world has max_len {world.max_len}"
        )
    done: dict[tuple[int, ...], float] = {}
    frontier = {(): 1.0}
    while frontier:
        next_frontier: dict[tuple[int, ...], float] = {}
        for prefix, mass in frontier.items():
            for block, prob in round_law(world, method, num_draft, prefix).emitted.items():
                extended = (prefix + block)[:length]
                bucket = done if len(extended) == length else next_frontier
                bucket[extended] = bucket.get(extended, 0.0) + mass * prob
        frontier = next_frontier
    return done


def target_prefix_distribution(world: TabularWorld, length: int) -> dict[tuple[int, ...], float]:
    """Exact distribution of ``length`` tokens sampled autoregressively from the target."""
    dist = {(): 1.0}
    for _ in range(length):
        dist = {
            prefix + (token,): mass * world.p(prefix)[token]
            for prefix, mass in dist.items()
            for token in range(world.vocab_size)
        }
    return dist


def total_variation(a: dict, b: dict) -> float:
    """TV distance between two distributions given as {outcome: probability}."""
    keys = set(a) | set(b)
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in keys)


def prefix_tv(world: TabularWorld, method: str, num_draft: int, length: int) -> float:
    """TV between the speculative and the target distribution of the first ``length`` tokens."""
    return total_variation(
        speculative_prefix_distribution(world, method, num_draft, length),
        target_prefix_distribution(world, length),
    )


def expected_accepted(world: TabularWorld, method: str, num_draft: int, prefix: tuple[int, ...] = ()) -> float:
    """Exact expected accepted draft tokens of one round from ``prefix``."""
    return round_law(world, method, num_draft, prefix).expected_accepted
