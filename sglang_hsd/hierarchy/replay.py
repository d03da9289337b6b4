"""Replay a drafter's rounds over recorded target continuations: tokens and drafts per round.

The round planner (``round_planner.py``) needs, for every candidate draft shape (a fixed draft
length, an adaptive stopping rule, a sampled tree), how many tokens a target round emits and how
many the drafter drafts. Instead of running the engine once per candidate, we record once, per
prompt, along the target's own continuation (``AcceptanceRecord``): at each position i, whether
and how likely the drafter's token is accepted, the rank of the target's token under the drafter,
and how likely the adaptive rule stops there; then every candidate is replayed over the records in
milliseconds.

Greedy requests (temperature 0): the replay is exact for the accepted tokens. Along the target's
greedy continuation the drafter's context after a matched draft is the record's own prefix, so a
chain of drafts starting at position t is accepted up to the first position whose drafter argmax
(rank 0) differs from the target's token; a top-k tree (``sglang_hsd/tree_draft/drafter.py``: greedy rows keep
the drafter's top k per forwarded node) accepts the longest prefix of the target's rank sequence
that is a kept path (``kept_rank_paths``). The drafted *count* past a rejection (an adaptive
rule's stop there) reads the record's confidences, which the engine computes on a context that
has already left the target's path: an approximation of cost only.

Sampled requests: an approximation. A chain's token at position i is accepted with probability
alpha_i = 1 - TV(p_i, q_i), independently (token-wise verification; ``hsd`` accepts at least as
much), the adaptive rule stops there with probability ``stop_prob`` (the q-mass of tokens whose
raw confidence is below the threshold), independently of acceptance; a tree tries the kept
children of a node in drawing order, each accepted with alpha_i. Rounds are averaged over
``samples`` Monte Carlo replays with a fixed seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import torch

from sglang_hsd.draft_length import DraftLengthRule
from sglang_hsd.tree_draft import TreeShape
from sglang_hsd.hierarchy.lookup_record import LookupRecord
from sglang_hsd.hierarchy.middle_record import MiddleRecord
from sglang_hsd.tree_draft.rules import spine_wide_order

# Thresholds at which stop probabilities are recorded; an adaptive candidate must use one of them.
STOP_THRESHOLDS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


@dataclass(frozen=True)
class AcceptanceRecord:
    """The drafter against the target along one prompt's continuation.

    Position i is the drafter's i-th token after the prompt, i.e. the prediction of the target's
    continuation token i. Records are longer than the generation they model by at least the
    longest draft, so rounds near the end draft as the engine does.

    Fields:
        greedy: temperature 0 (ranks decide acceptance) or sampled (``alpha`` does).
        alpha: float64 [P]; sampled: 1 - TV(p_i, q_i); greedy: 1.0 where the target's token is the
            drafter's argmax (rank 0), else 0.0.
        rank: int64 [P]; rank of the target's token under the drafter's raw softmax (0 = argmax);
            used for greedy trees.
        stop_prob: float64 [len(STOP_THRESHOLDS), P]; probability that the adaptive rule stops
            after the token drafted at i: the q_i-mass of tokens whose raw confidence is below the
            threshold (greedy: 1.0 or 0.0 for the argmax).
        lookup: what a prompt lookup copies along the continuation (``lookup_replay.py``), for
            rounds with a lookup at the bottom (``lookup_record.py``); None when not recorded.
        middles: the target's exits between the drafter and the target, one ``MiddleRecord`` per
            recorded exit layer (``middle_replay.py``); empty when none was recorded.
    """

    greedy: bool
    alpha: np.ndarray
    rank: np.ndarray
    stop_prob: np.ndarray
    lookup: LookupRecord | None = None
    middles: tuple[MiddleRecord, ...] = ()

    def __post_init__(self) -> None:
        length = self.alpha.shape[0]
        if self.rank.shape != (length,) or self.stop_prob.shape != (len(STOP_THRESHOLDS), length):
            raise ValueError(
                f"record arrays disagree: alpha {self.alpha.shape}, rank {self.rank.shape}, stop_prob "
                f"{self.stop_prob.shape} (expected [{length}] and [{len(STOP_THRESHOLDS)}, {length}])")
        if any(middle.length != length for middle in self.middles):
            raise ValueError(f"middle records must have {length} positions, got {[m.length for m in self.middles]}")

    def middle(self, layer: int) -> MiddleRecord | None:
        """The recorded exit at ``layer`` (None if not recorded)."""
        return next((middle for middle in self.middles if middle.layer == layer), None)

    @property
    def length(self) -> int:
        return int(self.alpha.shape[0])

    @classmethod
    def from_distributions(
        cls, target_tokens: torch.Tensor, p: torch.Tensor, q: torch.Tensor, raw_logits: torch.Tensor, greedy: bool
    ) -> AcceptanceRecord:
        """Build a record from the target's continuation and both levels' rows at its positions.

        Args:
            target_tokens: int64 [P], the target's continuation (position i predicts token i).
            p: float [P, V], the target's distribution (sampling transform applied).
            q: float [P, V], the drafter's distribution (the same transform): what it samples from.
            raw_logits: float [P, V], the drafter's logits before any transform (its confidence
                and ranks are read from their temperature-1 softmax, as ``DraftLengthRule`` does).
            greedy: the requests are greedy (``p`` and ``q`` are then one-hot).
        """
        raw = torch.softmax(raw_logits.double(), -1)
        chosen = raw.gather(1, target_tokens.unsqueeze(-1))
        rank = (raw > chosen).sum(-1)
        if greedy:
            alpha = (rank == 0).double()
            top = raw.max(-1).values
            stop = torch.stack([(top < th).double() for th in STOP_THRESHOLDS])
        else:
            alpha = torch.minimum(p.double(), q.double()).sum(-1)
            stop = torch.stack([(q.double() * (raw < th)).sum(-1) for th in STOP_THRESHOLDS])
        return cls(greedy, alpha.numpy(), rank.numpy(), stop.numpy())


@dataclass(frozen=True)
class ReplayStats:
    """What a candidate's rounds did over the records (means over Monte Carlo samples).

    Fields:
        rounds: target rounds.
        tokens: tokens emitted (generation lengths, summed over records).
        drafted: tokens the drafter drafted (tree: kept nodes).
        drafter_calls: {rows: number of drafter forwards on that many rows}.
        target_calls: {rows: number of target (verification) forwards on that many rows}.
        lookups: prompt lookups (rounds with a lookup at the bottom, ``lookup_replay.py``).
        middle_calls: {rows: number of an intermediate exit level's verification forwards on that
            many rows} (rounds with an exit between the drafter and the target,
            ``middle_replay.py``; the target's calls then run only the layers above the exit).
    """

    rounds: float
    tokens: float
    drafted: float
    drafter_calls: dict[int, float]
    target_calls: dict[int, float]
    lookups: float = 0.0
    middle_calls: dict[int, float] = field(default_factory=dict)

    @property
    def tokens_per_round(self) -> float:
        return self.tokens / self.rounds if self.rounds else float("nan")


class ReplayTotals:
    """Running sums of one replay (``ReplayStats``' fields, before averaging over draws)."""

    def __init__(self) -> None:
        self.rounds = self.tokens = self.drafted = self.lookups = 0.0
        self.drafter_calls: dict[int, float] = {}
        self.target_calls: dict[int, float] = {}
        self.middle_calls: dict[int, float] = {}

    def call(self, calls: dict[int, float], rows: int, count: float = 1.0) -> None:
        calls[rows] = calls.get(rows, 0.0) + count

    def emit(self, accepted: int, t: int, new_tokens: int) -> int:
        """A target round that accepted ``accepted`` tokens from position ``t``; the next position."""
        self.rounds += 1
        self.tokens += min(accepted + 1, new_tokens - t)
        return t + accepted + 1

    def stats(self, draws: int) -> ReplayStats:
        """The sums averaged over ``draws`` replays of every record."""
        scale = 1.0 / draws

        def per_draw(calls: dict[int, float]) -> dict[int, float]:
            return {rows: count * scale for rows, count in calls.items()}

        return ReplayStats(self.rounds * scale, self.tokens * scale, self.drafted * scale,
                           per_draw(self.drafter_calls), per_draw(self.target_calls), self.lookups * scale,
                           per_draw(self.middle_calls))


def leading_passes(rng: np.random.Generator, probs: np.ndarray) -> int:
    """How many leading tests pass, test i with probability probs[i] (0 or 1: deterministic)."""
    passed = rng.random(probs.shape[0]) < probs
    return int(np.argmin(passed)) if not passed.all() else int(probs.shape[0])


def replay_records(records: list[AcceptanceRecord], new_tokens: int, longest: int, label: str, replay_one,
                   samples: int = 32, seed: int = 0) -> ReplayStats:
    """Replay rounds over ``records`` until each has emitted ``new_tokens`` tokens:
    ``replay_one(record, new_tokens, rng, totals)`` runs one record's rounds into a ``ReplayTotals``,
    once per record when every record is greedy (exact), else ``samples`` Monte Carlo times.
    ``longest``: the most positions past a round's start the shape reads (``label`` names it in
    the error when a record is too short)."""
    if new_tokens < 1:
        raise ValueError(f"new_tokens must be >= 1, got {new_tokens}")
    for record in records:
        if record.length < new_tokens + longest:
            raise ValueError(f"a record of {record.length} positions cannot replay {new_tokens} tokens with "
                             f"{label} (needs {new_tokens + longest})")
    rng = np.random.default_rng(seed)
    draws = 1 if all(r.greedy for r in records) else samples
    totals = ReplayTotals()
    for record in records:
        for _ in range(draws):
            replay_one(record, new_tokens, rng, totals)
    return totals.stats(draws)


def _check_threshold(rule: DraftLengthRule) -> int:
    try:
        return STOP_THRESHOLDS.index(rule.threshold)
    except ValueError:
        raise ValueError(f"adaptive threshold must be one of {STOP_THRESHOLDS} to be replayed, "
                         f"got {rule.threshold}") from None


def replay_chain(
    records: list[AcceptanceRecord], new_tokens: int, rule: DraftLengthRule, fixed_length: int,
    samples: int = 32, seed: int = 0,
) -> ReplayStats:
    """Chain rounds of ``rule`` (``fixed``: ``fixed_length`` drafts) until each record has emitted
    ``new_tokens`` tokens.

    One round from position t: draft up to the cap (``rule.longest`` at first, then
    ``rule.next_caps``), stopping early where the adaptive rule says; accept drafts up to the first
    rejection; emit accepted + 1 tokens. Drafter calls: one row per drafted token, plus one row on
    the first call of the round after a fully accepted round (the bonus token the drafter has not
    seen). Target calls: d + 1 rows.
    """
    if new_tokens < 1:
        raise ValueError(f"new_tokens must be >= 1, got {new_tokens}")
    longest = rule.longest(fixed_length)
    level = _check_threshold(rule) if rule.adaptive else 0
    rng = np.random.default_rng(seed)
    draws = 1 if all(r.greedy for r in records) else samples
    rounds = tokens = drafted = 0.0
    drafter_calls: dict[int, float] = {}
    target_calls: dict[int, float] = {}
    for record in records:
        if record.length < new_tokens + longest:
            raise ValueError(f"a record of {record.length} positions cannot replay {new_tokens} tokens with "
                             f"drafts of up to {longest} (needs {new_tokens + longest})")
        for _ in range(draws):
            accept_u = rng.random(record.length)
            stop_u = rng.random(record.length)
            t, cap, extra = 0, longest, 0
            while t < new_tokens:
                drafted_now, accepted, alive = 0, 0, True
                while drafted_now < cap:
                    i = t + drafted_now
                    drafted_now += 1
                    if alive and accept_u[i] < record.alpha[i]:
                        accepted += 1
                    else:
                        alive = False
                    if rule.adaptive and drafted_now >= rule.min_length and stop_u[i] < record.stop_prob[level, i]:
                        break
                rounds += 1
                drafted += drafted_now
                first = 1 + extra
                drafter_calls[first] = drafter_calls.get(first, 0.0) + 1
                if drafted_now > 1:
                    drafter_calls[1] = drafter_calls.get(1, 0.0) + drafted_now - 1
                target_calls[drafted_now + 1] = target_calls.get(drafted_now + 1, 0.0) + 1
                extra = 1 if accepted == drafted_now else 0
                emitted = min(accepted + 1, new_tokens - t)
                tokens += emitted
                t += accepted + 1
                if rule.adaptive:
                    cap = int(rule.next_caps(*(torch.tensor([x]) for x in (cap, drafted_now, accepted)))[0])
    scale = 1.0 / draws
    return ReplayStats(rounds * scale, tokens * scale, drafted * scale,
                       {k: v * scale for k, v in drafter_calls.items()},
                       {k: v * scale for k, v in target_calls.items()})


@lru_cache(maxsize=64)
def kept_rank_paths(cfg: TreeShape) -> tuple[tuple[int, ...], ...]:
    """The nodes of a top-k ``spine_wide`` tree (``sglang_hsd/tree_draft/drafter.py``) when every q row has at
    least k tokens: each node as its path of draw ranks from the root, ``(0, 0, 1)`` = the second
    child of the argmax chain's second node; the N - 1 kept nodes in keeping order.

    A greedy tree keeps each forwarded node's top k, so draw rank j is the drafter's rank j.
    Pool index p = f * k + j is draw j of forwarded node f; forwarded node f = 1 + i * k + b is
    beam b of draft forward i, which (spine rules) forwards pool index base_i + b of block i.
    """
    k = cfg.topk

    def path(pool: int) -> tuple[int, ...]:
        forwarded, draw = divmod(pool, k)
        if forwarded == 0:
            return (draw,)
        forward, beam = divmod(forwarded - 1, k)
        base = 0 if forward == 0 else (1 + (forward - 1) * k) * k
        return path(base + beam) + (draw,)

    order = spine_wide_order(cfg)[: cfg.budget]
    return tuple(path(p) for p in order)


def forwarded_prefix(path: tuple[int, ...], depth: int) -> int:
    """How many leading nodes of an accepted path (draw ranks from the root) the drafter forwarded:
    the spine rules forward, at depths 1 .. D - 1, the draws of the argmax chain's nodes, i.e. the
    nodes whose path is zeros and then one rank. A drafter with its own cache keeps their KV
    (``runtime/tree_rounds.py``), so its next catch-up runs only the rest and the bonus token."""
    count = 0
    for d in range(1, min(len(path), depth - 1) + 1):
        if any(path[: d - 1]):
            break
        count = d
    return count


def replay_tree(records: list[AcceptanceRecord], new_tokens: int, cfg: TreeShape, samples: int = 32,
                seed: int = 0) -> ReplayStats:
    """Tree rounds of shape ``cfg`` (``spine_wide``) until each record has emitted ``new_tokens``.

    Accepted: greedy records follow the target's rank sequence through the kept paths; sampled
    records try a node's kept children in draw order, each accepted with alpha_i (module
    docstring). Drafter calls per round: the catch-up (the previous round's accepted nodes the
    drafter did not forward, ``forwarded_prefix``, and the bonus token) with the root's draft, then
    D - 1 forwards of k beams. Target calls: N rows. (An exit drafter sharing the target's cache
    re-runs the whole path; the replay prices the own-cache drafter.)
    """
    paths = kept_rank_paths(cfg)
    kept = set(paths)
    children: dict[tuple[int, ...], int] = {}
    for node in paths:
        children[node[:-1]] = children.get(node[:-1], 0) + 1
    rng = np.random.default_rng(seed)
    draws = 1 if all(r.greedy for r in records) else samples
    rounds = tokens = 0.0
    drafter_calls: dict[int, float] = {}
    for record in records:
        if record.length < new_tokens + cfg.depth:
            raise ValueError(f"a record of {record.length} positions cannot replay {new_tokens} tokens with "
                             f"trees of depth {cfg.depth} (needs {new_tokens + cfg.depth})")
        for _ in range(draws):
            t, catch_up = 0, 1
            while t < new_tokens:
                node: tuple[int, ...] = ()
                while True:
                    i = t + len(node)
                    if record.greedy:
                        child = node + (int(record.rank[i]),)
                        if child not in kept:
                            break
                    else:
                        tries = children.get(node, 0)
                        hits = np.nonzero(rng.random(tries) < record.alpha[i])[0]
                        if hits.size == 0:
                            break
                        child = node + (int(hits[0]),)
                    node = child
                accepted = len(node)
                rounds += 1
                drafter_calls[catch_up] = drafter_calls.get(catch_up, 0.0) + 1
                if cfg.depth > 1:
                    drafter_calls[cfg.topk] = drafter_calls.get(cfg.topk, 0.0) + cfg.depth - 1
                tokens += min(accepted + 1, new_tokens - t)
                t += accepted + 1
                catch_up = accepted - forwarded_prefix(node, cfg.depth) + 1
    scale = 1.0 / draws
    return ReplayStats(rounds * scale, tokens * scale, rounds * scale * cfg.budget,
                       {k: v * scale for k, v in drafter_calls.items()},
                       {cfg.num_draft_tokens: rounds * scale})
