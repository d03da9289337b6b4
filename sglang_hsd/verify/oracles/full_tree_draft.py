"""Draft trees with their real q, in SGLang's layout.

Full trees: every node up to ``depth`` has ``topk`` children, stored breadth first (node 0 = root,
then the topk depth-1 nodes, then their children in parent order, ...), so
N = 1 + topk + ... + topk^depth. Children of a node are listed in the order they were drafted.

Drafting modes and the verifiers they pair with (docs/verification.md, section 'Trees'):
* ``sample_tree(..., replacement=False)``: children drawn one after another from q(.|node) with
  earlier siblings removed and renormalised. Verify with ``hsd`` / ``rrs`` and
  ``draft_mode="without-replacement"`` (or ``target-only``).
* ``sample_tree(..., replacement=True)``: i.i.d. children (duplicates kept as siblings). Verify
  with ``draft_mode="iid"``; ``target-only`` needs distinct siblings and refuses such trees.
* ``topk_tree``: SGLang's stock deterministic top-k children. Only ``target-only`` / ``greedy``
  are lossless on it (the tree is not a sample from q, so verifiers that read q are biased).

Pruning (SGLang keeps the ``num_draft_tokens`` best nodes by path score) is allowed only for
deterministic top-k trees: deciding which sampled nodes to keep from the scores of deeper nodes
that are then thrown away makes the kept tree's law differ from the one the verifier assumes
(exact enumeration found TV ~0.1 even for token-wise verification). A sampled tree may stop on a
stopping time (a rule using only tokens already drafted), never on discarded deeper tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from sglang_hsd.verify.common import inverse_cdf_sample

# q_fn(paths) -> q rows. paths: int64 [B, M, d + 1], M token paths from the root (column 0 is the
# root token, then d drafted tokens); returns float [B, M, V], q(.|context, path) per path. The
# committed context of each request is the caller's closure state.
QFunction = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class DraftTree:
    """A batch of full draft trees in SGLang's layout.

    Fields:
        candidates: int64 [B, N], node tokens (column 0 = root token).
        retrive_next_token: int64 [B, N], first child (-1 none).
        retrive_next_sibling: int64 [B, N], next sibling (-1 none).
        parents: int64 [B, N], parent node (-1 for the root).
        depths: int64 [B, N], node depth (root 0).
        draft_probs: float [B, N, V], row n = q(.|path to n) the children of n were drawn from
            (the full row, before removing earlier siblings); rows of leaves are zero.
        node_probs: float [B, N], the probability the drafter gave node n given its ancestors and
            earlier siblings (without replacement: renormalised over the untaken tokens; top-k: 1).
    """

    candidates: torch.Tensor
    retrive_next_token: torch.Tensor
    retrive_next_sibling: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    draft_probs: torch.Tensor
    node_probs: torch.Tensor


def full_tree_links(topk: int, depth: int, device="cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Breadth-first layout of a full tree. Returns (next_token, next_sibling, parents, depths), int64 [N]."""
    level_sizes = [topk**d for d in range(depth + 1)]
    starts = [sum(level_sizes[:d]) for d in range(depth + 2)]
    num_nodes = starts[-1]
    next_token = torch.full((num_nodes,), -1, dtype=torch.long)
    next_sibling = torch.full((num_nodes,), -1, dtype=torch.long)
    parents = torch.full((num_nodes,), -1, dtype=torch.long)
    depths = torch.zeros(num_nodes, dtype=torch.long)
    for d in range(depth):
        for i in range(level_sizes[d]):
            node = starts[d] + i
            children = [starts[d + 1] + i * topk + j for j in range(topk)]
            next_token[node] = children[0]
            for j, child in enumerate(children):
                parents[child] = node
                depths[child] = d + 1
                if j + 1 < topk:
                    next_sibling[child] = children[j + 1]
    return next_token.to(device), next_sibling.to(device), parents.to(device), depths.to(device)


def sample_tree(
    q_fn: QFunction,
    topk: int,
    depth: int,
    generator: torch.Generator | None,
    replacement: bool = False,
    *,
    root_tokens: torch.Tensor,
) -> DraftTree:
    """Sample a full tree: ``topk`` children per node from q, ``depth`` levels.

    Args:
        q_fn: see ``QFunction``; called once per level with all that level's paths.
        topk, depth: tree shape (topk >= 1, depth >= 1).
        generator: torch generator for the draws.
        replacement: ``False`` draws children without replacement (needs topk tokens of positive
            q in every row; checking that costs one host sync), ``True`` i.i.d.
        root_tokens: int64 [B], the last verified token of each request.
    """
    return _build_tree(q_fn, topk, depth, root_tokens, lambda q: _sample_children(q, topk, replacement, generator))


def topk_tree(q_fn: QFunction, topk: int, depth: int, *, root_tokens: torch.Tensor) -> DraftTree:
    """SGLang's stock tree: the topk most likely tokens of q as children (ties: lower id first)."""
    return _build_tree(q_fn, topk, depth, root_tokens, lambda q: _topk_children(q, topk))


def _build_tree(q_fn, topk, depth, root_tokens, choose) -> DraftTree:
    if topk < 1 or depth < 1:
        raise ValueError(f"topk and depth must be >= 1, got topk={topk}, depth={depth}")
    batch = root_tokens.shape[0]
    device = root_tokens.device
    next_token, next_sibling, parents, depths = full_tree_links(topk, depth, device)
    paths = root_tokens.long().view(batch, 1, 1)
    tokens, q_rows, node_probs = [root_tokens.long().view(batch, 1)], [], [torch.ones(batch, 1, device=device)]
    for _ in range(depth):
        q = q_fn(paths)  # [B, M, V]
        children, probs = choose(q)  # [B, M, topk] each
        q_rows.append(q)
        tokens.append(children.flatten(1))
        node_probs.append(probs.flatten(1).to(node_probs[0].dtype))
        paths = torch.cat([paths.repeat_interleave(topk, dim=1), children.flatten(1).unsqueeze(-1)], dim=-1)
    vocab = q_rows[0].shape[-1]
    leaves = torch.zeros(batch, paths.shape[1], vocab, dtype=q_rows[0].dtype, device=device)
    return DraftTree(
        candidates=torch.cat(tokens, dim=1),
        retrive_next_token=next_token.expand(batch, -1).clone(),
        retrive_next_sibling=next_sibling.expand(batch, -1).clone(),
        parents=parents.expand(batch, -1).clone(),
        depths=depths.expand(batch, -1).clone(),
        draft_probs=torch.cat(q_rows + [leaves], dim=1),
        node_probs=torch.cat(node_probs, dim=1),
    )


def _sample_children(q: torch.Tensor, topk: int, replacement: bool, generator) -> tuple[torch.Tensor, torch.Tensor]:
    """topk children per row of q [B, M, V], sequentially. Returns tokens and their draw probabilities."""
    batch, rows, vocab = q.shape
    flat = q.reshape(batch * rows, vocab).double()
    if not replacement and bool(((flat > 0).sum(-1) < topk).any()):
        raise ValueError(f"q_fn returned a row with fewer than topk={topk} tokens of positive probability; "
                         "children cannot be drawn without replacement")
    remaining = flat.clone()
    tokens, probs = [], []
    for _ in range(topk):
        uniform = torch.rand(batch * rows, device=q.device, generator=generator, dtype=torch.float64)
        token = inverse_cdf_sample(remaining, uniform)
        mass = remaining.gather(1, token.unsqueeze(-1)).squeeze(-1)
        probs.append(mass / remaining.sum(-1))
        tokens.append(token)
        if not replacement:
            remaining = remaining.scatter(1, token.unsqueeze(-1), 0.0)
    shape = (batch, rows, topk)
    return torch.stack(tokens, -1).view(shape), torch.stack(probs, -1).view(shape)


def _topk_children(q: torch.Tensor, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    order = torch.sort(q, dim=-1, descending=True, stable=True).indices[..., :topk]
    return order, torch.ones(order.shape, dtype=q.dtype, device=q.device)
