"""Exact-enumeration oracle for tree verifiers (tiny vocabularies, float64, no sampling).

For a full tree (``topk`` children per node, ``depth`` levels) drafted from a ``TabularWorld``'s q,
this module computes the exact law of one round (every tree weighted by its drafting probability,
times the verifier's exact outcome law given the tree), the law of the first L emitted tokens over
repeated rounds, and the expected accepted draft tokens per round.

The laws are written recursively from the rules, independently of the batched state machines in
``tree/reference.py``. The recursion uses two facts: a node's children subtrees are drafted independently
given the node's path, and under every rule here a child's subtree either accepts (the round ends)
or is rejected as a whole, after which the parent's state changes deterministically. So the
recursion enumerates sibling sequences lazily (shared prefixes computed once) and never has to
enumerate coin outcomes or whole trees.

Trees of any shape fixed in advance are covered through ``shape`` (nested tuples: a node's shape
is the tuple of its children's shapes); the round-level helpers use full topk/depth trees.

Drafting modes: ``"without-replacement"`` (children sequentially, earlier siblings removed from q
and renormalised), ``"iid"`` (children i.i.d. from q), ``"top-k"`` (SGLang's deterministic top-k;
the tree has probability one), ``"argmax-first"`` (the first child is q's argmax, the later ones
without replacement from q without it; ``hsd`` and ``rrs`` test the first child against a one-hot
proposal), ``"fixed"`` (one concrete tree drafted without replacement, given as ``shape``: a node
is the tuple of its children as (token, child's node) pairs in drafting order; the law returned is
the verifier's law given that tree, ``oracles/expand_exact.py`` weighs trees) and
``"fixed-argmax-first"`` (the same for a tree drafted argmax-first).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from sglang_hsd.verify.oracles.exact import RoundLaw, TabularWorld, target_prefix_distribution, total_variation

DRAFTINGS = ("without-replacement", "iid", "top-k", "argmax-first")
FIXED = ("fixed", "fixed-argmax-first")
# Draftings whose first child is deterministic (q's argmax): it is verified against a one-hot proposal.
ARGMAX_FIRST = ("argmax-first", "fixed-argmax-first")
Outcomes = dict  # {(accepted path tokens, next token): probability}

# fold rule hook: (ms, rejected token, drafting) -> new Ms. Tests plug in wrong rules here.
QUpdate = Callable[[np.ndarray, int, str], np.ndarray]


def matching_q_update(ms: np.ndarray, token: int, drafting: str) -> np.ndarray:
    """The paired rule: remove the rejected token for without-replacement trees, keep q otherwise."""
    if drafting not in ("without-replacement", *ARGMAX_FIRST, *FIXED):
        return ms
    kept = ms.copy()
    kept[token] = 0.0
    total = kept.sum()
    return kept / total if total > 0 else kept


def _sibling_draws(q_row: np.ndarray, taken: tuple[int, ...], drafting: str) -> list[tuple[int, float]]:
    """(token, probability) of the next sibling given the siblings drafted so far."""
    if drafting == "top-k":
        order = sorted(range(len(q_row)), key=lambda v: (-q_row[v], v))
        return [(order[len(taken)], 1.0)]
    if drafting == "iid":
        return [(v, float(q_row[v])) for v in range(len(q_row)) if q_row[v] > 0]
    if drafting == "argmax-first" and not taken:
        return [(int(np.argmax(q_row)), 1.0)]
    rest = np.array(q_row, dtype=np.float64)
    rest[list(taken)] = 0.0
    total = rest.sum()
    return [(v, float(rest[v] / total)) for v in range(len(q_row)) if rest[v] > 0]


def _children(q_row: np.ndarray, taken: tuple[int, ...], drafting: str, shape: tuple) -> list[tuple[int, float, tuple]]:
    """(token, probability, child's shape) of the next child; ``"fixed"`` shapes carry their tokens."""
    if drafting in FIXED:
        token, child_shape = shape[len(taken)]
        return [(token, 1.0, child_shape)]
    return [(token, prob, shape[len(taken)]) for token, prob in _sibling_draws(q_row, taken, drafting)]


def _remaining_children(q_row: np.ndarray, taken: tuple[int, ...], drafting: str, shape: tuple) -> list:
    """``_children`` of the next child, or [] when the node has all its children: its shape is
    full, or the siblings drawn without replacement took q's whole support (the drafter marks
    further children invalid, a stopping rule on what was drafted: a request's top-k or top-p
    can leave q fewer tokens than the tree's k)."""
    return [] if len(taken) == len(shape) else _children(q_row, taken, drafting, shape)


def _proposal(ms: np.ndarray, token: int, first: bool, drafting: str) -> np.ndarray:
    """The row a child was drafted from: one-hot for the first child of an argmax-first tree, Ms otherwise."""
    if first and drafting in ARGMAX_FIRST:
        return np.eye(len(ms))[token]
    return ms


def _add(into: Outcomes, outcomes: Outcomes, scale: float, token: int | None = None) -> None:
    for (path, nxt), prob in outcomes.items():
        key = (((token,) + path) if token is not None else path, nxt)
        into[key] = into.get(key, 0.0) + scale * prob


def _leaf(weight: float, dist: np.ndarray) -> Outcomes:
    return {((), int(t)): weight * dist[t] for t in np.nonzero(dist)[0]}


class _Traversal:
    """Traversal verification (``hsd``): ``subtree`` -> (accept outcomes, probability all rejected)."""

    def __init__(self, world, drafting, q_update: QUpdate):
        self.world, self.drafting, self.q_update = world, drafting, q_update
        self.memo: dict = {}

    def subtree(self, ctx: tuple[int, ...], weight: float, shape: tuple, is_root: bool):
        key = (ctx, weight, shape, is_root)
        if key not in self.memo:
            p, q = self.world.p(ctx), self.world.q(ctx)
            if not shape:
                self.memo[key] = (_leaf(weight, p), 1.0 - weight)
            else:
                self.memo[key] = self._siblings(ctx, shape, is_root, q, (weight, p, q), ())
        return self.memo[key]

    def _siblings(self, ctx, shape, is_root, q_row, state, taken):
        """Outcomes from the point where ``taken`` children were drafted and all rejected."""
        weight, mb, ms = state
        children = _remaining_children(q_row, taken, self.drafting, shape)
        if not children:  # the node is now a leaf of the current tree
            if is_root:
                return _leaf(1.0, mb if mb.sum() > 0 else self.world.p(ctx)), 0.0
            return _leaf(weight, mb), 1.0 - weight
        outcomes, rejected = {}, 0.0
        for token, draw_prob, child_shape in children:
            proposal = _proposal(ms, token, not taken, self.drafting)
            child_w = min(1.0, weight * mb[token] / proposal[token]) if proposal[token] > 0 else 0.0
            sub, sub_rejected = self.subtree(ctx + (token,), child_w, child_shape, False)
            _add(outcomes, sub, draw_prob, token)
            if sub_rejected <= 0:
                continue
            residual = np.maximum(weight * mb - proposal, 0.0)
            mass = residual.sum()
            denom = mass + 1.0 - weight
            new_w = 1.0 if is_root else (mass / denom if denom > 0 else 0.0)
            new_state = (new_w, residual / mass if mass > 0 else residual, self.q_update(ms, token, self.drafting))
            rest, rest_rejected = self._siblings(ctx, shape, is_root, q_row, new_state, taken + (token,))
            _add(outcomes, rest, draw_prob * sub_rejected)
            rejected += draw_prob * sub_rejected * rest_rejected
        return outcomes, rejected


def full_shape(topk: int, depth: int) -> tuple:
    """Shape of a full tree: a node's shape is the tuple of its children's shapes (leaf: ())."""
    return () if depth == 0 else tuple(full_shape(topk, depth - 1) for _ in range(topk))


def traversal_outcomes(world, prefix, topk, depth, drafting, q_update: QUpdate = matching_q_update, shape=None) -> Outcomes:
    """Law of (accepted path, next token) of one ``hsd`` round; ``q_update`` is the fold's q rule.

    ``shape`` (default: the full topk/depth tree) fixes the tree's shape in advance: the k-th
    drafted child of a node gets the node's ``shape[k]``."""
    shape = full_shape(topk, depth) if shape is None else shape
    return _Traversal(world, drafting, q_update).subtree(tuple(prefix), 1.0, shape, True)[0]


def _top_down(world, ctx, shape, drafting, child_accept, start, memo=None) -> Outcomes:
    """Top-down walk shared by ``rrs`` and ``target-only``.

    ``child_accept(state, token) -> (accept probability, state after a rejection)``; the state
    starts as ``start(p, q)`` and its first entry is the (unnormalised) distribution of the next
    token when every child is rejected.
    """
    memo = {} if memo is None else memo
    if (ctx, shape) in memo:  # a child's subtree law depends only on its path and shape
        return memo[(ctx, shape)]
    p, q = world.p(ctx), world.q(ctx)
    if not shape:
        return _leaf(1.0, p)

    def siblings(state, taken) -> Outcomes:
        children = _remaining_children(q, taken, drafting, shape)
        if not children:
            mb = state[0]
            return _leaf(1.0, mb / mb.sum() if mb.sum() > 0 else p)
        out: Outcomes = {}
        for token, draw_prob, child_shape in children:
            accept, rejected_state = child_accept(state, token)
            if accept > 0:
                sub = _top_down(world, ctx + (token,), child_shape, drafting, child_accept, start, memo)
                _add(out, sub, draw_prob * accept, token)
            if accept < 1:
                _add(out, siblings(rejected_state, taken + (token,)), draw_prob * (1.0 - accept))
        return out

    memo[(ctx, shape)] = siblings(start(p, q), ())
    return memo[(ctx, shape)]


def rrs_outcomes(world, prefix, topk, depth, drafting, q_update: QUpdate = matching_q_update, shape=None) -> Outcomes:
    """Recursive rejection sampling: accept child x with min(1, Mb(x)/S(x)), S its proposal (Ms, or
    one-hot for an argmax-first tree's first child); fold on rejection."""

    def child_accept(state, token):
        mb, ms, first = state
        proposal = _proposal(ms, token, first, drafting)
        accept = min(1.0, mb[token] / proposal[token]) if proposal[token] > 0 else 0.0
        residual = np.maximum(mb - proposal, 0.0)
        mass = residual.sum()
        return accept, (residual / mass if mass > 0 else residual, q_update(ms, token, drafting), False)

    shape = full_shape(topk, depth) if shape is None else shape
    return _top_down(world, tuple(prefix), shape, drafting, child_accept, lambda p, q: (p, q, True))


def target_only_outcomes(world, prefix, topk, depth, drafting, shape=None) -> Outcomes:
    """SGLang's target-only walk: child j is accepted iff the coin falls in its slice of p."""

    def child_accept(state, token):
        # kept: p with tried tokens zeroed; p: the node's target row; reached: coin mass used so far.
        kept, p, reached = state
        remaining = 1.0 - min(1.0, reached)
        slice_mass = min(1.0, reached + p[token]) - min(1.0, reached)
        accept = slice_mass / remaining if remaining > 0 else 0.0
        masked = kept.copy()
        masked[token] = 0.0
        return accept, (masked, p, reached + p[token])

    shape = full_shape(topk, depth) if shape is None else shape
    return _top_down(world, tuple(prefix), shape, drafting, child_accept, lambda p, q: (p, p, 0.0))


def greedy_outcomes(world, prefix, topk, depth, drafting) -> Outcomes:
    """Greedy over deterministic top-k children (the only drafting it is meant for)."""
    ctx, path = tuple(prefix), ()
    for _ in range(depth):
        q = world.q(ctx)
        children = sorted(range(len(q)), key=lambda v: (-q[v], v))[:topk]
        best = int(np.argmax(world.p(ctx)))
        if best not in children:
            break
        ctx, path = ctx + (best,), path + (best,)
    return {(path, int(np.argmax(world.p(ctx)))): 1.0}


OUTCOMES = {
    "hsd": traversal_outcomes,
    "rrs": rrs_outcomes,
    "target-only": target_only_outcomes,
    "greedy": greedy_outcomes,
}


def tree_round_law(world: TabularWorld, method: str, topk: int, depth: int, prefix=(), drafting="without-replacement", outcomes_fn=None) -> RoundLaw:
    """Exact law of one tree round from ``prefix``; ``outcomes_fn`` overrides the method's law."""
    if drafting not in DRAFTINGS:
        raise ValueError(f"drafting must be one of {DRAFTINGS}, got {drafting!r}")
    law = outcomes_fn or OUTCOMES[method]
    emitted: dict[tuple[int, ...], float] = {}
    expected = 0.0
    for (path, nxt), prob in law(world, tuple(prefix), topk, depth, drafting).items():
        block = path + (nxt,)
        emitted[block] = emitted.get(block, 0.0) + prob
        expected += prob * len(path)
    return RoundLaw(emitted, expected)


def chain_rounds(round_law: Callable[[tuple], dict], world: TabularWorld, depth: int, length: int) -> dict:
    """Exact law of the first ``length`` emitted tokens over repeated rounds from the empty prefix.

    ``round_law(prefix)`` -> {emitted block: probability} of one round (drafts of depth <= ``depth``)."""
    if length - 1 + depth > world.max_len:
        raise ValueError(f"length {length} with depth {depth} needs world.max_len >= {length - 1 + depth}")
    done: dict[tuple[int, ...], float] = {}
    frontier = {(): 1.0}
    while frontier:
        next_frontier: dict[tuple[int, ...], float] = {}
        for prefix, mass in frontier.items():
            for block, prob in round_law(prefix).items():
                extended = (prefix + block)[:length]
                bucket = done if len(extended) == length else next_frontier
                bucket[extended] = bucket.get(extended, 0.0) + mass * prob
        frontier = next_frontier
    return done


def tree_prefix_distribution(world, method, topk, depth, length, drafting="without-replacement", outcomes_fn=None):
    """Exact distribution of the first ``length`` tokens emitted by repeated tree rounds."""
    return chain_rounds(
        lambda prefix: tree_round_law(world, method, topk, depth, prefix, drafting, outcomes_fn).emitted,
        world, depth, length)


def tree_prefix_tv(world, method, topk, depth, length, drafting="without-replacement", outcomes_fn=None) -> float:
    """TV between the tree-speculative and the target law of the first ``length`` tokens."""
    return total_variation(
        tree_prefix_distribution(world, method, topk, depth, length, drafting, outcomes_fn),
        target_prefix_distribution(world, length),
    )


def tree_expected_accepted(world, method, topk, depth, prefix=(), drafting="without-replacement") -> float:
    """Exact expected accepted draft tokens of one round from ``prefix``."""
    return tree_round_law(world, method, topk, depth, prefix, drafting).expected_accepted
