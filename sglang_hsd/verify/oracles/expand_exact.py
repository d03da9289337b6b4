"""Exact law of a server round with a budgeted draft tree (``tree/expand.py``'s rules), float64.

One round from a prefix: enumerate every way the rule can draft its tree (each child drawn
without replacement from q(.|node), or q's top token for the stock rule; with
``children="argmax-first"`` a node's first child is q's argmax and the later ones are drawn
without replacement, as ``tree_draft.CHILD_SAMPLERS["argmax_first"]``), with its probability;
on each concrete tree apply the verifier's exact outcome law (``tree_exact`` with
``drafting="fixed"``); sum. Chaining rounds gives the law of the first L emitted tokens, to be
compared with the target's.

The rules are written here again, sequentially and in plain Python (a partial tree is a list of
``_Node``; a policy names the node that gets the next child), independently of the batched
priorities in ``tree/expand.py``; ``tests/verify/oracles/test_expand_statistical.py`` checks the
batched drafter against this law.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np

from sglang_hsd.verify.oracles.exact import RoundLaw, TabularWorld, prefix_offset, target_prefix_distribution, total_variation
from sglang_hsd.verify.oracles.tree_exact import _sibling_draws, chain_rounds, target_only_outcomes, traversal_outcomes


class _Node(NamedTuple):
    parent: int
    token: int
    depth: int
    score: float  # path q: product of the full q rows along the path
    path: tuple[int, ...]  # drafted tokens from the root


@dataclass(frozen=True)
class Shape:
    """(D, k, N) as the server's flags give them (N counts the root)."""

    depth: int
    topk: int
    num_draft_tokens: int


# policy(nodes, children counts, capacities, shape) -> the node that gets the next child, or None.
Policy = Callable[[list, list, list, Shape], "int | None"]


def best_first_next(nodes, kids, caps, shape):
    open_nodes = [i for i in range(len(nodes)) if kids[i] < caps[i]]
    return max(open_nodes, key=lambda i: (nodes[i].score, -i)) if open_nodes else None


def beam_next(nodes, kids, caps, shape):
    for depth in range(shape.depth):
        level = sorted((i for i, n in enumerate(nodes) if n.depth == depth), key=lambda i: (-nodes[i].score, i))
        for i in level[: shape.topk]:
            if kids[i] < caps[i]:
                return i
    return None


def spine_next(nodes, kids, caps, shape):
    if len(nodes) <= shape.depth:
        tip = len(nodes) - 1
        return tip if kids[tip] < caps[tip] else None
    return next((i for i in range(shape.depth) if kids[i] < caps[i]), None)


def spine_wide_next(nodes, kids, caps, shape):
    if len(nodes) <= shape.depth:
        return spine_next(nodes, kids, caps, shape)
    for depth in range(1, shape.depth + 1):  # depth of the child; chain nodes are 0 .. D
        siblings = [i for i in range(shape.depth + 1, len(nodes)) if nodes[i].parent == depth - 2] if depth >= 2 else []
        for i in [depth - 1] + siblings:
            if kids[i] < caps[i]:
                return i
    return None


@dataclass(frozen=True)
class OracleRule:
    policy: Policy
    sampled: bool = True
    prune: bool = False
    method: str = "hsd"


ORACLE_RULES = {
    "spine": OracleRule(spine_next),
    "spine_wide": OracleRule(spine_wide_next),
    "beam": OracleRule(beam_next),
    "best_first": OracleRule(best_first_next),
    "pruned_beam": OracleRule(beam_next, prune=True),
    "stock": OracleRule(beam_next, sampled=False, prune=True, method="target-only"),
}


CHILDREN = {"sampled": ("without-replacement", "fixed"), "argmax-first": ("argmax-first", "fixed-argmax-first")}


def draft_outcomes(world: TabularWorld, prefix: tuple, rule: str, shape: Shape,
                   children: str = "sampled") -> list[tuple[float, list]]:
    """Every tree the rule can draft from ``prefix``: [(probability, nodes in drafting order)].

    ``children``: a key of ``CHILDREN``, how a sampled rule draws a node's children."""
    spec = ORACLE_RULES[rule]
    drafting = CHILDREN[children][0] if spec.sampled else "top-k"
    steps = shape.topk + (shape.depth - 1) * shape.topk**2 if spec.prune else shape.num_draft_tokens - 1
    out: list[tuple[float, list]] = []

    def cap(path):
        if len(path) >= shape.depth:
            return 0
        return min(shape.topk, int((world.q(prefix + path) > 0).sum()))

    def grow(nodes, kids, caps, prob):
        parent = None
        if len(nodes) - 1 < steps:
            parent = spec.policy(nodes, kids, caps, shape)
            parent = best_first_next(nodes, kids, caps, shape) if parent is None else parent
        if parent is None:
            out.append((prob, _pruned(nodes, shape) if spec.prune else nodes))
            return
        node = nodes[parent]
        q_row = world.q(prefix + node.path)
        taken = tuple(n.token for n in nodes if n.parent == parent)
        for token, draw in _sibling_draws(q_row, taken, drafting):
            child = _Node(parent, token, node.depth + 1, node.score * float(q_row[token]), node.path + (token,))
            grown_kids = kids[:parent] + [kids[parent] + 1] + kids[parent + 1 :]
            grow(nodes + [child], grown_kids + [0], caps + [cap(child.path)], prob * draw)

    grow([_Node(-1, -1, 0, 1.0, ())], [0], [cap(())], 1.0)
    return out


def _pruned(nodes: list, shape: Shape) -> list:
    """SGLang's pruning: the root and the N - 1 best nodes by path q (ties: earlier), in drafting order."""
    ranked = sorted(range(1, len(nodes)), key=lambda i: (-nodes[i].score, i))
    kept = [0] + sorted(ranked[: shape.num_draft_tokens - 1])
    index = {old: new for new, old in enumerate(kept)}
    return [nodes[i]._replace(parent=index.get(nodes[i].parent, -1)) for i in kept]


def nested_shape(nodes: list, node: int = 0) -> tuple:
    """The tree as ``tree_exact``'s ``"fixed"`` shape: ((token, child's shape), ...) in drafting order."""
    return tuple((nodes[c].token, nested_shape(nodes, c)) for c in range(len(nodes)) if nodes[c].parent == node)


def expand_round_law(world: TabularWorld, rule: str, shape: Shape, prefix: tuple = (), children: str = "sampled") -> RoundLaw:
    """Exact law of one round: drafting outcomes of ``rule`` x the paired verifier's outcome law
    (``children`` as in ``draft_outcomes``; the verifier reads the matching drafting)."""
    method = ORACLE_RULES[rule].method
    outcomes_fn = traversal_outcomes if method == "hsd" else target_only_outcomes
    emitted: dict[tuple[int, ...], float] = {}
    expected = 0.0
    for tree_prob, nodes in draft_outcomes(world, tuple(prefix), rule, shape, children):
        law = outcomes_fn(world, tuple(prefix), None, None, CHILDREN[children][1], shape=nested_shape(nodes))
        for (path, nxt), prob in law.items():
            emitted[path + (nxt,)] = emitted.get(path + (nxt,), 0.0) + tree_prob * prob
            expected += tree_prob * prob * len(path)
    return RoundLaw(emitted, expected)


def expand_prefix_distribution(world: TabularWorld, rule: str, shape: Shape, length: int) -> dict:
    """Exact law of the first ``length`` emitted tokens over repeated rounds from the empty prefix."""
    return chain_rounds(lambda prefix: expand_round_law(world, rule, shape, prefix).emitted, world, shape.depth, length)


def expand_prefix_tv(world: TabularWorld, rule: str, shape: Shape, length: int) -> float:
    """TV between the emitted and the target law of the first ``length`` tokens."""
    return total_variation(expand_prefix_distribution(world, rule, shape, length), target_prefix_distribution(world, length))


def perturbed_world(vocab_size: int, max_len: int, seed: int, concentration: float, sigma: float) -> TabularWorld:
    """Context-dependent Dirichlet(concentration) targets p; drafts q = p exp(sigma z) normalised, z ~ N(0, 1).

    Small concentrations give peaked rows; sigma sets how far the drafter is from the target."""
    rng = np.random.default_rng(seed)
    rows = prefix_offset(vocab_size, max_len + 1)
    p = rng.dirichlet(np.full(vocab_size, concentration), size=rows)
    p = np.maximum(p, 1e-12)  # keep every token drawable: caps and supports stay the same everywhere
    p /= p.sum(-1, keepdims=True)
    q = p * np.exp(sigma * rng.standard_normal(p.shape))
    return TabularWorld(vocab_size, max_len, p, q / q.sum(-1, keepdims=True))
