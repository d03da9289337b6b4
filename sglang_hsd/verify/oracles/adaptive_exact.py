"""Exact-enumeration oracle for chain rounds whose draft length is a stopping rule that adapts.

The state of a request between rounds is (emitted prefix, length cap); a round from it drafts
under ``DraftLengthRule`` (``sglang_hsd/draft_length.py``): stop after a token whose confidence
is below the threshold, or at the cap (the confidence row is q unless ``stopped_drafts`` is given
another one, as the engine's raw softmax differs from its tempered / top-k / top-p q); the verifier's outcome law is the fixed-draft
one of ``oracles/exact.py`` (``OUTCOME_LAWS``), and the next cap is ``DraftLengthRule.next_caps``
of the round's outcome. Everything is enumerated in float64 with no sampling, so the law of the
first L emitted tokens over as many rounds as it takes can be compared with the target's
(``target_prefix_distribution``): a lossless rule gives TV ~1e-16.

The draft enumeration is a parameter (``drafts``) so that tests can put a wrong stopping rule
through the same round and prefix laws. ``counted_round_law`` keeps each outcome's drafted and
accepted counts, which is what a controller choosing the next round's length observes
(``adaptive_rounds_exact.py`` runs ``BudgetController`` on it over several rounds).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import lru_cache

import numpy as np
import torch

from sglang_hsd.draft_length import DraftLengthRule
from sglang_hsd.verify.oracles.exact import OUTCOME_LAWS, TabularWorld

# (world, rule, prefix, cap) -> every (draft, probability of drafting exactly it)
DraftEnumerator = Callable[[TabularWorld, DraftLengthRule, tuple[int, ...], int], Iterator[tuple[tuple[int, ...], float]]]


def stopped_drafts(
    world: TabularWorld,
    rule: DraftLengthRule,
    prefix: tuple[int, ...],
    cap: int,
    confidence: Callable[[tuple[int, ...]], np.ndarray] | None = None,
) -> Iterator[tuple[tuple[int, ...], float]]:
    """Every draft the rule can stop at from ``prefix`` with length cap ``cap``, with its
    probability: a token is always kept, and drafting goes on unless ``rule.stops`` on it or the
    cap is reached (a stopping time).

    ``confidence(context)``: float64 [V], the row the stopping decision reads after ``context``
    (default ``world.q``); tokens are drawn from ``world.q`` either way. Bind it with
    ``functools.partial`` to get a ``DraftEnumerator``.
    """
    stack = [((), 1.0)]
    while stack:
        draft, prob = stack.pop()
        q = world.q(prefix + draft)
        conf = q if confidence is None else confidence(prefix + draft)
        for token in np.nonzero(q)[0]:
            longer, mass = draft + (int(token),), prob * float(q[token])
            stop = rule.stops(torch.tensor([conf[token]], dtype=torch.float64), torch.tensor([len(longer)]))
            if len(longer) >= cap or bool(stop[0]):
                yield longer, mass
            else:
                stack.append((longer, mass))


def adaptive_round_law(
    world: TabularWorld,
    method: str,
    rule: DraftLengthRule,
    prefix: tuple[int, ...],
    cap: int,
    drafts: DraftEnumerator = stopped_drafts,
) -> dict[tuple[tuple[int, ...], int], float]:
    """Exact law of one round from (``prefix``, ``cap``): {(emitted block, next cap): probability}.

    The block is the accepted drafts plus the corrected/bonus token.
    """
    if method not in OUTCOME_LAWS:
        raise ValueError(f"method must be one of {sorted(OUTCOME_LAWS)}, got {method!r}")
    return _round_law_cached(world, method, rule, tuple(prefix), cap, drafts)


@lru_cache(maxsize=None)
def _round_law_cached(world, method, rule, prefix, cap, drafts) -> dict[tuple[tuple[int, ...], int], float]:
    out: dict[tuple[tuple[int, ...], int], float] = {}
    for (block, drafted, accepted), prob in counted_round_law(world, method, rule, prefix, cap, drafts).items():
        caps = rule.next_caps(torch.tensor([cap]), torch.tensor([drafted]), torch.tensor([accepted]))
        key = (block, int(caps[0]))
        out[key] = out.get(key, 0.0) + prob
    return out


def draft_outcome_law(
    world, method: str, prefix: tuple[int, ...], draft: tuple[int, ...]
) -> dict[tuple[int, int], float]:
    """The verifier's exact outcome law for one fixed ``draft`` after ``prefix``: {(accepted, next
    token): probability} (``OUTCOME_LAWS[method]`` on the q and p rows of the draft's positions)."""
    contexts = [prefix + draft[:t] for t in range(len(draft) + 1)]
    q_rows = np.stack([world.q(c) for c in contexts[:-1]])
    p_rows = np.stack([world.p(c) for c in contexts])
    return OUTCOME_LAWS[method](p_rows, q_rows, draft)


def counted_round_law(
    world,
    method: str,
    rule: DraftLengthRule,
    prefix: tuple[int, ...],
    cap: int,
    drafts: DraftEnumerator = stopped_drafts,
) -> dict[tuple[tuple[int, ...], int, int], float]:
    """Exact law of one round from (``prefix``, ``cap``) with the counts a controller observes:
    {(emitted block, drafted, accepted): probability}. Cached per (world, method, rule, prefix, cap, drafts)."""
    if method not in OUTCOME_LAWS:
        raise ValueError(f"method must be one of {sorted(OUTCOME_LAWS)}, got {method!r}")
    return _counted_round_law_cached(world, method, rule, tuple(prefix), cap, drafts)


@lru_cache(maxsize=None)
def _counted_round_law_cached(world, method, rule, prefix, cap, drafts) -> dict[tuple[tuple[int, ...], int, int], float]:
    out: dict[tuple[tuple[int, ...], int, int], float] = {}
    for draft, draft_prob in drafts(world, rule, prefix, cap):
        for (n, token), prob in draft_outcome_law(world, method, prefix, draft).items():
            key = (draft[:n] + (token,), len(draft), n)
            out[key] = out.get(key, 0.0) + draft_prob * prob
    return out


def adaptive_prefix_distribution(
    world: TabularWorld,
    method: str,
    rule: DraftLengthRule,
    length: int,
    first_cap: int | None = None,
    drafts: DraftEnumerator = stopped_drafts,
) -> dict[tuple[int, ...], float]:
    """Exact distribution of the first ``length`` emitted tokens, over as many adaptive rounds as
    it takes, starting with cap ``first_cap`` (default ``rule.max_length``)."""
    needed = length - 1 + rule.max_length
    if needed > world.max_len:
        raise ValueError(f"length {length} with max_length {rule.max_length} needs prefixes of {needed} "
                         f"tokens; the world has max_len {world.max_len}")
    done: dict[tuple[int, ...], float] = {}
    frontier = {((), first_cap or rule.max_length): 1.0}
    while frontier:
        next_frontier: dict[tuple[tuple[int, ...], int], float] = {}
        for (prefix, cap), mass in frontier.items():
            for (block, next_cap), prob in adaptive_round_law(world, method, rule, prefix, cap, drafts).items():
                extended = (prefix + block)[:length]
                if len(extended) == length:
                    done[extended] = done.get(extended, 0.0) + mass * prob
                else:
                    key = (extended, next_cap)
                    next_frontier[key] = next_frontier.get(key, 0.0) + mass * prob
        frontier = next_frontier
    return done


def mean_draft_length(
    world: TabularWorld, rule: DraftLengthRule, prefix: tuple[int, ...], cap: int, drafts: DraftEnumerator = stopped_drafts
) -> float:
    """Exact expected number of tokens the rule drafts in one round from (``prefix``, ``cap``)."""
    return sum(len(draft) * prob for draft, prob in drafts(world, rule, tuple(prefix), cap))
