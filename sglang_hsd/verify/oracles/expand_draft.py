"""Budgeted sampled draft trees grown one node at a time: the exact study's sequential drafters.

The server and the runtime draft with ``sglang_hsd.tree_draft`` (level-synchronous, in SGLang's
draft-loop shape); each of its lossless rules has the round law of its sequential twin here
(``tests/tree_draft/test_exact.py::test_round_law_is_the_sequential_rule``), and this
module is where new rules are studied by exact enumeration first. Shape: depth D, topk k, N - 1
drafted nodes.

SGLang's flags: ``--speculative-num-steps`` = D, ``--speculative-eagle-topk`` = k,
``--speculative-num-draft-tokens`` = N counts the root (``organize_draft_results`` keeps the
``num_draft_token - 1`` best of the k + (D - 1) k^2 drafted candidates), so a tree holds N - 1
drafted nodes of depth <= D.

Growth, one drafted node per step: an ``ExpansionRule`` scores every node of the partial tree
(``-inf`` = may not get a child now), the best node gets its next child, drawn from
q(.|node) without its earlier children (without replacement, from the request's own q rows: q_fn
returns them already transformed by the sampling parameters, ``sglang_hsd.sampling``). A node
takes at most min(k, #tokens of positive q) children and nodes at depth D none. When a rule has
nowhere left to grow the rest of the budget goes best-first. Nodes are stored in drafting order
(children after their parent, siblings in drafting order), SGLang's first-child / next-sibling
links, so the result feeds ``verify_tree(method="hsd")`` directly.

Rules (``EXPANSION_RULES``):
* ``spine``: a sampled chain to depth D, then more children of the
  chain's nodes, shallowest first (the root up to k children, then depth 1, ...).
* ``spine_wide`` (the default, ``DEFAULT_RULE``): the spine's chain, then depth by depth (shallowest first) the chain node's later
  children, then the children of the chain node's siblings (the nodes a level-synchronous drafter
  forwards on its spare beams, ``sglang_hsd/tree_draft/drafter.py``).
* ``beam``: SGLang's beam with sampled children: per depth, the k best newest nodes by path q
  (product of q along the path) get k children each, best first.
* ``best_first``: the node of highest path q gets children (up to k) next.
* ``pruned_beam`` (lossy, kept as the documented negative): the full sampled k-ary beam (the
  k + (D - 1) k^2 candidates) pruned to the N - 1 best by path q, as SGLang prunes.
* ``stock``: SGLang's stock tree: deterministic top-k children, the same pruning; verify it with
  ``method="target-only"`` (q is one-hot there).

Why the sampled rules are lossless: every decision (which node grows next, when to stop) reads
only tokens drafted so far, so each child is a draw from q(.|node) without its earlier siblings
given everything the verifier sees, and every drafted node is kept: that is the law traversal
verification assumes. Pruning breaks it (a kept node's law becomes "q given its discarded subtree
scored well"). ``tests/verify/oracles/test_expand_exact.py`` enumerates every drafting outcome and
the verifier's exact law over chained rounds: TV < 1e-12 for spine, beam and best_first (and stock
+ target-only), TV > 1e-3 for ``pruned_beam``; ``tests/verify/oracles/test_expand_statistical.py``
checks this batched implementation against that law. Why spine_wide is the default: in the exact
expected-accepted table of ``test_expand_exact.py::test_expected_accepted_table`` (reproduced in
docs/verification.md, "Budgeted sampled trees") spine accepts the most of the rules there, and
``tests/tree_draft/test_exact.py::test_default_rule_accepts_the_most`` finds
spine_wide at least as good as spine at every budget measured (better when the budget reaches
the siblings' children).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from sglang_hsd.tree_draft.shape import TreeShape
from sglang_hsd.verify.common import inverse_cdf_sample
from sglang_hsd.verify.oracles.full_tree_draft import DraftTree, QFunction
from sglang_hsd.verify.tree.layout import links_from_parents


@dataclass
class GrowState:
    """A batch of partial trees (P node slots, slot 0 the root, slots >= num_nodes unused).

    Fields:
        tokens, parents, depths: int64 [B, P]; parents -1 for the root and unused slots.
        scores: float64 [B, P], path q (product of the full q rows along the path; root 1).
        num_children, capacity: int64 [B, P]; capacity = min(k, #positive q), 0 at depth D.
        num_nodes: int64 [B].
        q: float [B, P, V], q(.|path to node), rows filled when the node is drafted.
        paths: int64 [B, P, D + 1], token path from the root (column 0 the root token).
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    scores: torch.Tensor
    num_children: torch.Tensor
    capacity: torch.Tensor
    num_nodes: torch.Tensor
    q: torch.Tensor
    paths: torch.Tensor

    def open_nodes(self, cfg: TreeShape) -> torch.Tensor:
        """bool [B, P]: drafted nodes that may still get a child."""
        slot = torch.arange(self.tokens.shape[1], device=self.tokens.device)
        return (slot < self.num_nodes.unsqueeze(-1)) & (self.num_children < self.capacity)


# (state, config) -> float64 [B, P] priority; the highest finite entry gets the next child.
Priority = Callable[[GrowState, TreeShape], torch.Tensor]
NEG_INF = -math.inf


def best_first_priority(state: GrowState, cfg: TreeShape) -> torch.Tensor:
    """Highest path q first (ties: the earlier node; a parent outranks its children)."""
    return torch.where(state.open_nodes(cfg), state.scores, NEG_INF)


def beam_priority(state: GrowState, cfg: TreeShape) -> torch.Tensor:
    """Shallowest depth first; there, only the k best nodes by path q, best first.

    A depth is only grown once the depth above it is finished, so its node set is complete when
    ranked. Scores are in (0, 1], so ``score - 2 depth`` orders by depth, then score.
    """
    slot = torch.arange(state.tokens.shape[1], device=state.tokens.device)
    drafted = slot < state.num_nodes.unsqueeze(-1)
    same_depth = (state.depths.unsqueeze(-1) == state.depths.unsqueeze(-2)) & drafted.unsqueeze(-2)
    better = (state.scores.unsqueeze(-2) > state.scores.unsqueeze(-1)) | (
        (state.scores.unsqueeze(-2) == state.scores.unsqueeze(-1)) & (slot < slot.unsqueeze(-1))
    )
    rank = (same_depth & better).sum(-1)  # [B, P]: nodes of the same depth ranked above
    eligible = state.open_nodes(cfg) & (rank < cfg.topk)
    return torch.where(eligible, state.scores - 2.0 * state.depths, NEG_INF)


def spine_priority(state: GrowState, cfg: TreeShape) -> torch.Tensor:
    """A chain to depth D (the newest node grows), then the chain's nodes, shallowest first."""
    slot = torch.arange(state.tokens.shape[1], device=state.tokens.device)
    in_chain = state.num_nodes.unsqueeze(-1) <= cfg.depth
    tip = slot == state.num_nodes.unsqueeze(-1) - 1
    spine = slot < cfg.depth  # once the chain is done, slots 0..D-1 are its non-leaf nodes
    eligible = state.open_nodes(cfg) & torch.where(in_chain, tip, spine)
    return torch.where(eligible, -slot.to(state.scores.dtype).expand_as(state.scores), NEG_INF)


def spine_wide_priority(state: GrowState, cfg: TreeShape) -> torch.Tensor:
    """A chain to depth D, then depth by depth: the chain node's later children, then the children
    of its earlier later children (the chain's siblings one level up), in drafting order."""
    slot = torch.arange(state.tokens.shape[1], device=state.tokens.device)
    in_chain = state.num_nodes.unsqueeze(-1) <= cfg.depth
    tip = slot == state.num_nodes.unsqueeze(-1) - 1
    chain = slot < cfg.depth  # once the chain is done, slots 0..D-1 are its non-leaf nodes
    sibling = (slot > cfg.depth) & (state.parents >= 0) & (state.parents < cfg.depth)
    eligible = state.open_nodes(cfg) & torch.where(in_chain, tip, chain | sibling)
    # Order: the depth of the child first, then the chain node, then siblings in drafting order.
    key = (state.depths + 1) * (slot.numel() + 1) + torch.where(chain, 0, 1 + slot)
    return torch.where(eligible, -key.to(state.scores.dtype), NEG_INF)


@dataclass(frozen=True)
class ExpansionRule:
    """One way to grow a budgeted tree.

    Fields:
        name: key in ``EXPANSION_RULES``.
        description: one line.
        priority: which node gets the next child (see ``Priority``).
        sampled: children drawn without replacement from q (``False``: q's top tokens, ties to the
            lower id, as SGLang's stock drafter).
        prune: grow SGLang's k + (D - 1) k^2 candidates, then keep the N - 1 best by path q.
        verify_method: the ``verify_tree`` method the rule pairs with.
        lossless: rule + ``verify_method`` give the target's law (``test_expand_exact.py``).
    """

    name: str
    description: str
    priority: Priority
    sampled: bool = True
    prune: bool = False
    verify_method: str = "hsd"
    lossless: bool = True


EXPANSION_RULES: dict[str, ExpansionRule] = {
    rule.name: rule
    for rule in (
        ExpansionRule("spine", "sampled chain to depth D, then siblings of its nodes, shallowest first", spine_priority),
        ExpansionRule("spine_wide", "sampled chain, then per depth the chain node's and its siblings' children",
                      spine_wide_priority),
        ExpansionRule("beam", "per depth the k best newest nodes by path q get k sampled children", beam_priority),
        ExpansionRule("best_first", "the node of highest path q gets its k sampled children next", best_first_priority),
        ExpansionRule("pruned_beam", "sampled k-ary beam pruned to the N - 1 best by path q (lossy)",
                      beam_priority, prune=True, lossless=False),
        ExpansionRule("stock", "SGLang's top-k beam pruned to the N - 1 best; verify target-only",
                      beam_priority, sampled=False, prune=True, verify_method="target-only"),
    )
}
DEFAULT_RULE = "spine_wide"


def expand_tree(
    q_fn: QFunction,
    cfg: TreeShape,
    root_tokens: torch.Tensor,
    rule: str = DEFAULT_RULE,
    uniforms: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> DraftTree:
    """Draft one budgeted tree per request.

    Args:
        q_fn: ``QFunction``; called once for the root and, per step, once per depth 1..D-1 with
            every request's newest path cut at that depth (paths [B, 1, d + 1]; rows whose newest
            node has another depth are computed and discarded, which keeps the loop sync-free).
        cfg: ``TreeShape``.
        root_tokens: int64 [B], the last verified token of each request.
        rule: a key of ``EXPANSION_RULES``.
        uniforms: float64 [B, S] in [0, 1), one per drafted node (S = N - 1, or k + (D - 1) k^2
            for pruning rules); drawn from ``generator`` when ``None``.
    Returns:
        ``DraftTree`` with N columns (fewer drafted nodes only when the depth-D k-ary tree or q's
        support is smaller than the budget: unused columns have -1 links and parent -1 and are
        unreachable, so verify such batches with ``validate=False``).
    """
    if rule not in EXPANSION_RULES:
        raise ValueError(f"rule must be one of {sorted(EXPANSION_RULES)}, got {rule!r}")
    spec = EXPANSION_RULES[rule]
    steps = cfg.pool if spec.prune else cfg.budget
    batch = root_tokens.shape[0]
    if uniforms is None:
        uniforms = torch.rand(batch, steps, generator=generator, dtype=torch.float64, device=root_tokens.device)
    if uniforms.shape != (batch, steps):
        raise ValueError(f"uniforms must be [B, {steps}] = [{batch}, {steps}] for rule {rule!r}, got {list(uniforms.shape)}")
    state = _init_state(q_fn, cfg, root_tokens.long(), steps + 1)
    draw_probs = torch.ones(batch, steps + 1, dtype=torch.float64, device=root_tokens.device)
    for step in range(steps):
        _grow_one(state, spec, cfg, q_fn, uniforms[:, step], draw_probs)
    keep = _prune_mask(state, cfg) if spec.prune else _drafted(state)
    return _to_draft_tree(state, keep, draw_probs, cfg.num_draft_tokens)


def _drafted(state: GrowState) -> torch.Tensor:
    slot = torch.arange(state.tokens.shape[1], device=state.tokens.device)
    return slot < state.num_nodes.unsqueeze(-1)


def _capacity(q_row: torch.Tensor, depth: torch.Tensor, cfg: TreeShape) -> torch.Tensor:
    support = (q_row > 0).sum(-1).clamp_max(cfg.topk)
    return torch.where(depth < cfg.depth, support, 0)


def _init_state(q_fn: QFunction, cfg: TreeShape, root_tokens: torch.Tensor, slots: int) -> GrowState:
    batch, device = root_tokens.shape[0], root_tokens.device
    root_q = q_fn(root_tokens.view(batch, 1, 1))[:, 0]  # [B, V]
    long = dict(dtype=torch.long, device=device)
    tokens = torch.zeros(batch, slots, **long)
    tokens[:, 0] = root_tokens
    paths = torch.zeros(batch, slots, cfg.depth + 1, **long)
    paths[:, 0, 0] = root_tokens
    q = torch.zeros(batch, slots, root_q.shape[-1], dtype=root_q.dtype, device=device)
    q[:, 0] = root_q
    capacity = torch.zeros(batch, slots, **long)
    capacity[:, 0] = _capacity(root_q, torch.zeros(batch, **long), cfg)
    scores = torch.zeros(batch, slots, dtype=torch.float64, device=device)
    scores[:, 0] = 1.0
    return GrowState(tokens, torch.full((batch, slots), -1, **long), torch.zeros(batch, slots, **long), scores,
                     torch.zeros(batch, slots, **long), capacity, torch.ones(batch, **long), q, paths)


def _grow_one(state: GrowState, spec: ExpansionRule, cfg: TreeShape, q_fn: QFunction, uniform, draw_probs) -> None:
    """Add one child per request (in place): pick the parent, draw its next child, fetch the child's q."""
    batch, slots = state.tokens.shape
    rows = torch.arange(batch, device=state.tokens.device)
    priority = spec.priority(state, cfg)
    stuck = torch.isinf(priority).all(-1, keepdim=True)
    priority = torch.where(stuck, best_first_priority(state, cfg), priority)
    best, parent = priority.max(-1)
    active = torch.isfinite(best) & (state.num_nodes < slots)
    # The parent's q without its earlier children (their tokens, counted by scatter_add).
    siblings = (state.parents == parent.unsqueeze(-1)) & _drafted(state)
    taken = torch.zeros_like(state.q[:, 0]).scatter_add_(1, state.tokens, siblings.to(state.q.dtype)) > 0
    q_parent = state.q[rows, parent]
    remaining = torch.where(taken, 0.0, q_parent).double()
    if spec.sampled:
        # Finished rows (nothing left to draw) give -1; clamped, their writes are masked below.
        token = inverse_cdf_sample(remaining, uniform.double()).clamp_min(0)
        prob = remaining.gather(1, token.unsqueeze(-1)).squeeze(-1) / remaining.sum(-1).clamp_min(1e-300)
    else:
        token = remaining.argmax(-1)  # first maximum: ties go to the lower id
        prob = torch.ones(batch, dtype=torch.float64, device=rows.device)
    new = state.num_nodes.clamp_max(slots - 1)
    depth = state.depths[rows, parent] + 1
    path = state.paths[rows, parent].scatter(1, depth.unsqueeze(-1).clamp_max(cfg.depth), token.unsqueeze(-1))
    q_new = _q_of_new_nodes(q_fn, path, depth, cfg, state.q[:, 0])

    def put(field: torch.Tensor, value: torch.Tensor) -> None:
        mask = active.view(-1, *([1] * (value.dim() - 1)))
        field[rows, new] = torch.where(mask, value, field[rows, new])

    put(state.tokens, token)
    put(state.parents, parent)
    put(state.depths, depth)
    put(state.scores, state.scores[rows, parent] * q_parent.gather(1, token.unsqueeze(-1)).squeeze(-1).double())
    put(state.paths, path)
    put(state.q, q_new)
    put(state.capacity, _capacity(q_new, depth, cfg))
    put(draw_probs, prob)
    state.num_children[rows, parent] += active.long()
    state.num_nodes += active.long()


def _q_of_new_nodes(q_fn: QFunction, path, depth, cfg: TreeShape, like: torch.Tensor) -> torch.Tensor:
    """q rows [B, V] of the new nodes (zero at depth D, where nodes never get children)."""
    q_new = torch.zeros_like(like)
    for d in range(1, cfg.depth):
        rows_q = q_fn(path[:, None, : d + 1])[:, 0].to(like.dtype)
        q_new = torch.where((depth == d).unsqueeze(-1), rows_q, q_new)
    return q_new


def _prune_mask(state: GrowState, cfg: TreeShape) -> torch.Tensor:
    """SGLang's pruning: the root plus the N - 1 best drafted nodes by path q (ties: earlier node).

    Scores shrink along a path, so the kept set contains every kept node's ancestors."""
    drafted = _drafted(state)
    drafted[:, 0] = False
    scores = torch.where(drafted, state.scores, NEG_INF)
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, : cfg.budget]
    keep = torch.zeros_like(drafted).scatter_(1, order, True) & drafted
    keep[:, 0] = True
    return keep


def _to_draft_tree(state: GrowState, keep: torch.Tensor, draw_probs, width: int) -> DraftTree:
    """Compact the kept nodes (drafting order) into ``width`` columns and link them."""
    batch, slots = keep.shape
    device = keep.device
    new_index = torch.where(keep, keep.long().cumsum(-1) - 1, width)  # dropped nodes -> spare column
    rows = torch.arange(batch, device=device).unsqueeze(-1)

    def compact(field: torch.Tensor, fill) -> torch.Tensor:
        out = torch.full((batch, width + 1, *field.shape[2:]), fill, dtype=field.dtype, device=device)
        out[rows, new_index] = field
        return out[:, :width]

    parents_old = state.parents.clamp_min(0)
    parents = torch.where(state.parents >= 0, new_index.gather(1, parents_old), -1)
    parents = compact(parents, -1)
    has_child = torch.zeros(batch, width + 1, dtype=torch.bool, device=device)
    has_child.scatter_(1, torch.where(parents >= 0, parents, width), True)
    q = compact(state.q, 0.0)
    first_child, next_sibling = links_from_parents(parents)
    return DraftTree(
        candidates=compact(state.tokens, 0),
        retrive_next_token=first_child,
        retrive_next_sibling=next_sibling,
        parents=parents,
        depths=compact(state.depths, 0),
        draft_probs=torch.where(has_child[:, :width].unsqueeze(-1), q, 0.0),
        node_probs=compact(draw_probs, 1.0),
    )
