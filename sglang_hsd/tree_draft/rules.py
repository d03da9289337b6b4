"""The expansion rules of the level-synchronous drafter (``drafter.py``) and the pool they act on.

A rule is two functions of the batched ``LevelState``: ``select`` picks the k nodes of the newest
block that the next draft forward runs, ``keep`` the pool slots the tree keeps. Lossless rules
read only tokens, validity (q's support) and path scores of nodes drafted before the decision in
a sequential drafting order, so every kept child is a draw from its parent's q given all the
verifier sees; ``pruned`` (SGLang's selection) keeps nodes for their own scores and is biased.
Static keep orders are computed once per shape (``keep_order``) and handed in as a tensor, so a
round never copies host data to the device (which a captured CUDA graph cannot replay).

* ``spine``: beam 0 of every forward is the sampled chain c_1 .. c_D (each c_{d+1} is c_d's first
  draw), so its draft KV context is exact; kept: the chain (cut at N - 1), then the chain nodes'
  later draws, shallowest first. Beams b > 0 of forward d forward c_d's later draws, whose
  children spine never keeps.
* ``spine_wide`` (``DEFAULT_LEVEL_RULE``): the same forwards; kept: the chain, then depth by
  depth c_{d-1}'s later draws and then the draws of c_{d-2}'s later draws (the spare beams'
  children).
* ``beam``: level by level, the k kept nodes of the newest level with the highest path q (product
  of q along the path) are forwarded, best first; their draws are kept in (beam, draw) order while
  budget remains.
* ``pruned`` (``lossless=False``): SGLang's selection on sampled children: forward the top-k path
  scores of each level, keep the N - 1 best path scores of the whole pool.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from sglang_hsd.tree_draft.shape import TreeShape


@dataclass
class LevelState:
    """One round's pool for a batch (P = k + (D - 1) k^2 slots, F = 1 + k (D - 1) forwarded nodes).

    Pool index of child j of forwarded node f: f * k + j (block 0 = the root's children).

    Fields:
        shape: ``TreeShape``.
        keep_order: int64 [S] on the pool's device, the rule's static keep priority (or None).
        deterministic: bool [B], rows that take q's top-k children.
        pool_tokens: int64 [B, P] (0 in invalid slots); pool_valid: bool [B, P], the slot holds a
            drawn child (false before it is drawn and past q's support).
        pool_score: float64 [B, P], path q: the product of q(token) along the path.
        fwd_pool: int64 [B, F], pool index of each forwarded node (-1 for the root, f = 0).
        fwd_active: bool [B, F], the forward's children may be kept (padding beams: False).
        fwd_q: float [B, F, V], q rows of the forwarded nodes (row 0: the root's q).
    """

    shape: TreeShape
    keep_order: torch.Tensor | None
    deterministic: torch.Tensor
    pool_tokens: torch.Tensor
    pool_valid: torch.Tensor
    pool_score: torch.Tensor
    fwd_pool: torch.Tensor
    fwd_active: torch.Tensor
    fwd_q: torch.Tensor

    @classmethod
    def empty(cls, shape: TreeShape, keep_order, root_q: torch.Tensor, deterministic: torch.Tensor) -> "LevelState":
        batch, vocab = root_q.shape
        device = root_q.device
        fwd_q = torch.zeros(batch, shape.num_forwards, vocab, dtype=root_q.dtype, device=device)
        fwd_q[:, 0] = root_q
        fwd_pool = torch.full((batch, shape.num_forwards), -1, dtype=torch.long, device=device)
        fwd_active = torch.zeros(batch, shape.num_forwards, dtype=torch.bool, device=device)
        fwd_active[:, 0] = True
        return cls(shape, keep_order, deterministic.to(device),
                   torch.zeros(batch, shape.pool, dtype=torch.long, device=device),
                   torch.zeros(batch, shape.pool, dtype=torch.bool, device=device),
                   torch.zeros(batch, shape.pool, dtype=torch.float64, device=device), fwd_pool, fwd_active, fwd_q)

    @property
    def batch(self) -> int:
        return self.pool_tokens.shape[0]

    @property
    def vocab(self) -> int:
        return self.fwd_q.shape[-1]

    def block(self, level: int) -> slice:
        """Pool slots of block ``level`` (0: the root's children; l >= 1: forward l - 1's children)."""
        k = self.shape.topk
        if level == 0:
            return slice(0, k)
        return slice(k + (level - 1) * k * k, k + level * k * k)


@dataclass(frozen=True)
class LevelRule:
    """One expansion rule of the level-synchronous drafter.

    Fields:
        name / description: key in ``LEVEL_RULES`` and one line.
        select: (state, level) -> (pool int64 [B, k], active bool [B, k]): the nodes of block
            ``level`` forwarded next; inactive beams are padding whose children are never kept.
        keep: state -> bool [B, P], the kept pool slots (closed under parents).
        capacity: shape -> the most nodes the rule can keep (``num_draft_tokens - 1`` must fit).
        keep_order: shape -> the static keep priority (pool slots), or None when the rule has none.
        lossless: the rule with ``hsd`` / ``rrs`` gives the target's law
            (``tests/tree_draft/test_exact.py``).
    """

    name: str
    description: str
    select: Callable[[LevelState, int], tuple[torch.Tensor, torch.Tensor]]
    keep: Callable[[LevelState], torch.Tensor]
    capacity: Callable[[TreeShape], int]
    keep_order: Callable[[TreeShape], list[int]] | None = None
    lossless: bool = True


def _keep_in_order(state: LevelState, order: torch.Tensor, eligible: torch.Tensor) -> torch.Tensor:
    """Keep eligible slots (bool [B, S], slots ``order`` int64 [S]) in that order while budget lasts."""
    kept = eligible & (eligible.long().cumsum(-1) <= state.shape.budget)
    out = torch.zeros_like(state.pool_valid)
    out[:, order] = kept
    return out


def _chain_forwards(shape: TreeShape) -> list[int]:
    """Forwarded nodes of the chain: the root, then beam 0 of each forward."""
    return [0] + [1 + (d - 1) * shape.topk for d in range(1, shape.depth)]


def spine_order(shape: TreeShape) -> list[int]:
    """Spine's keep priority: the chain's slots (c_1 .. c_D), then later draws, shallowest first."""
    k = shape.topk
    chain_fwd = _chain_forwards(shape)
    return [f * k for f in chain_fwd] + [f * k + j for f in chain_fwd for j in range(1, k)]


def spine_wide_order(shape: TreeShape) -> list[int]:
    """The chain, then per depth d: c_{d-1}'s later draws, then the draws of c_{d-2}'s later draws
    (forwarded on the spare beams b >= 1 of forward d - 2)."""
    k = shape.topk
    chain_fwd = _chain_forwards(shape)
    order = [f * k for f in chain_fwd]
    for depth in range(1, shape.depth + 1):
        order += [chain_fwd[depth - 1] * k + j for j in range(1, k)] if depth <= len(chain_fwd) else []
        if depth >= 2:
            order += [(1 + (depth - 2) * k + b) * k + j for b in range(1, k) for j in range(k)]
    return order


def spine_select(state: LevelState, level: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Beam 0: the chain node c_{level+1} (its parent's first draw); beams j > 0: its later siblings."""
    k = state.shape.topk
    base = 0 if level == 0 else (1 + (level - 1) * k) * k
    pool = (base + torch.arange(k, device=state.pool_valid.device)).expand(state.batch, -1)
    return pool, state.pool_valid.gather(1, pool)


def ordered_keep(state: LevelState) -> torch.Tensor:
    """Spine and spine_wide: drawn slots in the static keep order while budget lasts. A node's
    draws come after it in both orders, so the budget never keeps a child without its parent."""
    order = state.keep_order
    return _keep_in_order(state, order, state.pool_valid[:, order])


def _breadth_first_eligible(state: LevelState) -> torch.Tensor:
    slot = torch.arange(state.shape.pool, device=state.pool_valid.device)
    return state.pool_valid & state.fwd_active[:, slot // state.shape.topk]


def beam_keep(state: LevelState) -> torch.Tensor:
    """Drawn slots of active forwards in pool order (block, beam rank, draw) while budget lasts."""
    slot = torch.arange(state.shape.pool, device=state.pool_valid.device)
    return _keep_in_order(state, slot, _breadth_first_eligible(state))


def _top_of_block(state: LevelState, level: int, allowed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The k ``allowed`` slots of block ``level`` of highest path score (ties: lower slot), best first.

    Fewer than k allowed: the rest are inactive padding (their slot's token is still fed)."""
    block = state.block(level)
    score = torch.where(allowed[:, block], state.pool_score[:, block], -math.inf)
    ranked = torch.sort(score, dim=-1, descending=True, stable=True)
    top = ranked.indices[:, : state.shape.topk]
    active = torch.isfinite(ranked.values[:, : state.shape.topk])
    return block.start + top, active


def beam_select(state: LevelState, level: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k kept nodes of the block with the highest path q (drafted before: a lossless choice)."""
    return _top_of_block(state, level, beam_keep(state))


def pruned_select(state: LevelState, level: int) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang's beam: the k best drawn nodes of the block by path q, kept or not."""
    return _top_of_block(state, level, state.pool_valid)


def pruned_keep(state: LevelState) -> torch.Tensor:
    """SGLang's pruning: the N - 1 best drawn slots of the pool by path q (ties: lower slot).

    Scores shrink along a path and ties go to the lower (parent's) slot, so the set is closed under
    parents; the forwarded nodes it keeps are active (``pruned_select`` forwards only drawn ones)."""
    score = torch.where(state.pool_valid, state.pool_score, -math.inf)
    order = torch.sort(score, dim=-1, descending=True, stable=True).indices[:, : state.shape.budget]
    keep = torch.zeros_like(state.pool_valid).scatter_(1, order, True)
    return keep & state.pool_valid


LEVEL_RULES: dict[str, LevelRule] = {
    rule.name: rule
    for rule in (
        LevelRule("spine", "beam 0 is the sampled chain; kept: the chain, then its nodes' later draws, shallowest first",
                  spine_select, ordered_keep, lambda shape: len(spine_order(shape)), spine_order),
        LevelRule("spine_wide", "spine, then per depth the chain node's later draws and its siblings' draws",
                  spine_select, ordered_keep, lambda shape: len(spine_wide_order(shape)), spine_wide_order),
        LevelRule("beam", "per level the k kept nodes of highest path q are forwarded; draws kept breadth-first",
                  beam_select, beam_keep, lambda shape: shape.pool),
        LevelRule("pruned", "SGLang's top-k beams and N - 1 best path scores on sampled children (lossy)",
                  pruned_select, pruned_keep, lambda shape: shape.pool, lossless=False),
    )
}
DEFAULT_LEVEL_RULE = "spine_wide"
LOSSLESS_LEVEL_RULES = tuple(name for name, rule in LEVEL_RULES.items() if rule.lossless)
