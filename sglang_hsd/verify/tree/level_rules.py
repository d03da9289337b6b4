"""State and expansion rules of the level-synchronous drafter (``tree/level_draft.py``).

A rule is two functions of the batched ``LevelState``: ``select`` picks the k nodes of the newest
block that the next draft forward runs, ``keep`` the pool slots the tree keeps. Lossless rules
read only tokens, validity (q's support) and path scores of nodes drafted before the decision in
a sequential drafting order; ``pruned`` (SGLang's selection) keeps nodes for their own scores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from sglang_hsd.verify.tree.expand import ExpandConfig


@dataclass
class LevelState:
    """One round's pool for a batch (P = k + (D - 1) k^2 slots, F = 1 + k (D - 1) forwarded nodes).

    Fields:
        cfg: ``ExpandConfig``.
        deterministic: bool [B], rows that take q's top-k children.
        pool_tokens: int64 [B, P] (0 in invalid slots); pool_valid: bool [B, P], the slot holds a
            drawn child (false before it is drawn and past q's support).
        pool_score: float64 [B, P], path q: the product of q(token) along the path.
        fwd_pool: int64 [B, F], pool index of each forwarded node (-1 for the root, f = 0).
        fwd_active: bool [B, F], the forward's children may be kept (padding beams: False).
        fwd_q: float [B, F, V], q rows of the forwarded nodes (row 0: the root's q).
    """

    cfg: ExpandConfig
    deterministic: torch.Tensor
    pool_tokens: torch.Tensor
    pool_valid: torch.Tensor
    pool_score: torch.Tensor
    fwd_pool: torch.Tensor
    fwd_active: torch.Tensor
    fwd_q: torch.Tensor

    @classmethod
    def empty(cls, cfg: ExpandConfig, root_q: torch.Tensor, deterministic: torch.Tensor) -> "LevelState":
        batch, vocab = root_q.shape
        device = root_q.device
        num_fwd = 1 + cfg.topk * (cfg.depth - 1)
        fwd_q = torch.zeros(batch, num_fwd, vocab, dtype=root_q.dtype, device=device)
        fwd_q[:, 0] = root_q
        fwd_pool = torch.full((batch, num_fwd), -1, dtype=torch.long, device=device)
        fwd_active = torch.zeros(batch, num_fwd, dtype=torch.bool, device=device)
        fwd_active[:, 0] = True
        return cls(cfg, deterministic.to(device), torch.zeros(batch, cfg.pool, dtype=torch.long, device=device),
                   torch.zeros(batch, cfg.pool, dtype=torch.bool, device=device),
                   torch.zeros(batch, cfg.pool, dtype=torch.float64, device=device), fwd_pool, fwd_active, fwd_q)

    @property
    def batch(self) -> int:
        return self.pool_tokens.shape[0]

    @property
    def vocab(self) -> int:
        return self.fwd_q.shape[-1]

    @property
    def k(self) -> int:
        return self.cfg.topk

    @property
    def root_q(self) -> torch.Tensor:
        return self.fwd_q[:, 0]

    def block(self, level: int) -> slice:
        """Pool slots of block ``level`` (0: the root's children; l >= 1: forward l - 1's children)."""
        k = self.cfg.topk
        if level == 0:
            return slice(0, k)
        return slice(k + (level - 1) * k * k, k + level * k * k)


def _keep_in_order(state: LevelState, order: torch.Tensor, eligible: torch.Tensor) -> torch.Tensor:
    """Keep eligible slots (bool [B, S], slots ``order`` int64 [S]) in that order while budget lasts."""
    kept = eligible & (eligible.long().cumsum(-1) <= state.cfg.budget)
    out = torch.zeros_like(state.pool_valid)
    out[:, order] = kept
    return out


def _spine_order(cfg: ExpandConfig, device) -> torch.Tensor:
    """Spine's keep priority: the chain's slots (c_1 .. c_D), then later draws, shallowest first."""
    k = cfg.topk
    chain_fwd = [0] + [1 + (d - 1) * k for d in range(1, cfg.depth)]  # root, then beam 0 of each forward
    chain = [f * k for f in chain_fwd]
    extras = [f * k + j for f in chain_fwd for j in range(1, k)]
    return torch.tensor(chain + extras, dtype=torch.long, device=device)


def spine_wide_order(cfg: ExpandConfig, device) -> torch.Tensor:
    """The chain, then per depth d: c_{d-1}'s later draws, then the draws of c_{d-2}'s later draws
    (forwarded on the spare beams b >= 1 of forward d - 2)."""
    k = cfg.topk
    chain_fwd = [0] + [1 + (d - 1) * k for d in range(1, cfg.depth)]
    order = [f * k for f in chain_fwd]
    for depth in range(1, cfg.depth + 1):
        order += [chain_fwd[depth - 1] * k + j for j in range(1, k)] if depth <= len(chain_fwd) else []
        if depth >= 2:
            order += [(1 + (depth - 2) * k + b) * k + j for b in range(1, k) for j in range(k)]
    return torch.tensor(order, dtype=torch.long, device=device)


def spine_select(state: LevelState, level: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Beam 0: the chain node c_{level+1} (its parent's first draw); beams j > 0: its later siblings."""
    k = state.cfg.topk
    base = 0 if level == 0 else (1 + (level - 1) * k) * k
    pool = (base + torch.arange(k, device=state.pool_valid.device)).expand(state.batch, -1)
    return pool, state.pool_valid.gather(1, pool)


def spine_keep(state: LevelState) -> torch.Tensor:
    order = _spine_order(state.cfg, state.pool_valid.device)
    return _keep_in_order(state, order, state.pool_valid[:, order])


def spine_wide_keep(state: LevelState) -> torch.Tensor:
    """Eligible: drawn (the spare beams' forwards are active only for drawn siblings); a sibling's
    draws come after it in the order, so the budget never keeps a child without its parent."""
    order = spine_wide_order(state.cfg, state.pool_valid.device)
    return _keep_in_order(state, order, state.pool_valid[:, order])


def _breadth_first_eligible(state: LevelState) -> torch.Tensor:
    slot = torch.arange(state.cfg.pool, device=state.pool_valid.device)
    return state.pool_valid & state.fwd_active[:, slot // state.cfg.topk]


def beam_keep(state: LevelState) -> torch.Tensor:
    """Drawn slots of active forwards in pool order (block, beam rank, draw) while budget lasts."""
    slot = torch.arange(state.cfg.pool, device=state.pool_valid.device)
    return _keep_in_order(state, slot, _breadth_first_eligible(state))


def _top_of_block(state: LevelState, level: int, allowed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The k ``allowed`` slots of block ``level`` of highest path score (ties: lower slot), best first.

    Fewer than k allowed: the rest are inactive padding (their slot's token is still fed)."""
    block = state.block(level)
    score = torch.where(allowed[:, block], state.pool_score[:, block], -math.inf)
    ranked = torch.sort(score, dim=-1, descending=True, stable=True)
    top = ranked.indices[:, : state.cfg.topk]
    active = torch.isfinite(ranked.values[:, : state.cfg.topk])
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
    order = torch.sort(score, dim=-1, descending=True, stable=True).indices[:, : state.cfg.budget]
    keep = torch.zeros_like(state.pool_valid).scatter_(1, order, True)
    return keep & state.pool_valid
