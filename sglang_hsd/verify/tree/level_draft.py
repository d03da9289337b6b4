"""Level-synchronous sampled draft trees in SGLang's pool layout (the server's EAGLE draft loop).

SGLang drafts D = ``--speculative-num-steps`` levels with k = ``--speculative-eagle-topk`` beams:
the root's q gives block 0 (k candidates), and each of the D - 1 draft forwards runs exactly k
beams per request (B * k rows); the k children of every forwarded node form the pool, in blocks:

    forwarded node f: f = 0 the root, f = 1 + i * k + b the beam b of forward i (i = 0 .. D - 2)
    pool index of child j of forwarded node f: f * k + j   (so block 0 = pool 0 .. k - 1)
    parent_list [B, 1 + k (D - 1)]: entry f = pool index of the node forwarded as f (entry 0: -1)
    top_scores_index [B, N - 1]: the kept pool indices, ascending; draft_tokens [B, N - 1]

SGLang's tree builder (``build_tree_kernel_efficient``) reads node n >= 1 as pool index
``top_scores_index[n - 1]``, its parent as ``parent_list[pool // k]`` (the root when
``pool < k``), and lists siblings in ascending pool order: the draw order here, as traversal
verification of children drawn without replacement needs.

``LevelDrafter`` replaces SGLang's deterministic top-k + pruning by a sampled tree: the children of
a forwarded node are drawn without replacement from its q row, first draw first (``deterministic``
rows, greedy requests, take q's top-k instead: that tree has positive probability under the
sampled law, so any lossless verifier returns the target's argmax path on it). A node gets at most
min(k, #positive q) children. Which nodes are forwarded and which are kept depends only on tokens
and q rows drafted before them in a sequential drafting order, never on a node's own or deeper
draws, so the kept tree has the law that traversal verification assumes (see ``tree/expand.py``).

Rules (``LEVEL_RULES``):
* ``spine``: beam 0 of every forward is the sampled chain c_1 .. c_D (each c_{d+1} is c_d's first
  draw), so its draft KV context is exact; kept: the chain (cut at N - 1), then the chain nodes'
  later draws, shallowest first (the root's, then c_1's, ...). Beams b > 0 of forward d forward
  c_d's later draws, whose children spine never keeps. Same law as ``expand.py``'s ``spine``.
* ``spine_wide`` (``DEFAULT_LEVEL_RULE``): the same forwards; kept: the chain, then depth by depth
  c_{d-1}'s later draws and then the draws of c_{d-2}'s later draws (the spare beams' children).
  Same law as ``expand.py``'s ``spine_wide``.
* ``beam``: level by level, the k kept nodes of the newest level with the highest path q (product
  of q along the path) are forwarded, best first; their draws are kept in (beam, draw) order while
  budget remains. Same law as ``expand.py``'s ``beam``.
* ``pruned`` (``lossless=False``, the documented negative): SGLang's selection on sampled children:
  forward the top-k path scores of each level, keep the N - 1 best path scores of the whole pool.
  A kept node is then conditioned on its own and deeper draws having scored well: biased.

Evidence: ``tests/verify/tree/test_level_draft_exact.py`` enumerates every outcome of this
batched drafter (its uniforms split at every draw) and applies the exact law of ``hsd`` and ``rrs``
on each tree, chained over rounds: TV < 1e-12 for spine, spine_wide and beam, TV > 1e-3 for
pruned; it also checks that each rule's round law equals the sequential oracle's
(``oracles/expand_exact.py``), whose exact expected-accepted table (docs/verification.md,
"Level-synchronous sampled trees") picks spine_wide as the default: it accepts the most per round
at every (D, k, N) measured (equal to spine when the budget ends before the siblings' draws).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from sglang_hsd.verify.common import inverse_cdf_sample
from sglang_hsd.verify.tree.expand import ExpandConfig
from sglang_hsd.verify.tree.layout import links_from_parents
from sglang_hsd.verify.tree.level_rules import (
    LevelState, beam_keep, beam_select, pruned_keep, pruned_select, spine_keep, spine_select, spine_wide_keep, spine_wide_order,
)


@dataclass
class StepInput:
    """What one draft forward runs (k beams per request, row b * k + j = beam j of request b).

    Fields:
        input_ids: int64 [B * k], the token each beam feeds.
        hidden_rows: int64 [B * k], the hidden-state row each beam reads: a row of the [B] hidden
            states of the target (or draft extend) for the first forward, of the previous
            forward's [B * k] outputs afterwards.
        pool_index: int64 [B, k], pool index of each forwarded node (what ``parent_list`` records).
    """

    input_ids: torch.Tensor
    hidden_rows: torch.Tensor
    pool_index: torch.Tensor


@dataclass
class LevelTree:
    """One drafted tree per request, in SGLang's pool layout and in the verify layout.

    Fields:
        parent_list: int64 [B, 1 + k (D - 1)]; top_scores_index, draft_tokens: int64 [B, N - 1].
        draft_probs: float [B, N, V] in verify order (node 0 = the root, node n = pool index
            ``top_scores_index[n - 1]``): the q row the node's children were drawn from, zeros for
            nodes never forwarded.
        candidates: int64 [B, N], column 0 a placeholder 0 for the root token (the drafter never
            sees it; callers write the last verified token there), then ``draft_tokens``.
        retrive_next_token, retrive_next_sibling, parents: int64 [B, N] verify-layout links (-1 none).
        depths: int64 [B, N]; num_kept: int64 [B], N - 1 unless q's support ran out (fewer than
            k tokens of positive q, e.g. a top-k sampling parameter below k): then the last
            N - 1 - num_kept columns are filler, unreachable here (-1 links, zero q rows) but not
            for SGLang's tree builder, which would link them; such rows must not reach it.
    """

    parent_list: torch.Tensor
    top_scores_index: torch.Tensor
    draft_tokens: torch.Tensor
    draft_probs: torch.Tensor
    candidates: torch.Tensor
    retrive_next_token: torch.Tensor
    retrive_next_sibling: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    num_kept: torch.Tensor


@dataclass(frozen=True)
class LevelRule:
    """One expansion rule of the level-synchronous drafter.

    Fields:
        name / description: key in ``LEVEL_RULES`` and one line.
        select: (state, level) -> (pool int64 [B, k], active bool [B, k]): the nodes of block
            ``level`` forwarded next; inactive beams are padding whose children are never kept.
        keep: state -> bool [B, P], the kept pool slots (closed under parents).
        capacity: config -> the most nodes the rule can keep (``num_draft_tokens - 1`` must fit).
        lossless: the rule with ``hsd`` / ``rrs`` gives the target's law (``test_level_draft_exact.py``).
    """

    name: str
    description: str
    select: Callable[[LevelState, int], tuple[torch.Tensor, torch.Tensor]]
    keep: Callable[[LevelState], torch.Tensor]
    capacity: Callable[[ExpandConfig], int]
    lossless: bool = True


LEVEL_RULES: dict[str, LevelRule] = {
    rule.name: rule
    for rule in (
        LevelRule("spine", "beam 0 is the sampled chain; kept: the chain, then its nodes' later draws, shallowest first",
                  spine_select, spine_keep, lambda cfg: cfg.depth * cfg.topk),
        LevelRule("spine_wide", "spine, then per depth the chain node's later draws and its siblings' draws",
                  spine_select, spine_wide_keep, lambda cfg: spine_wide_order(cfg, "cpu").numel()),
        LevelRule("beam", "per level the k kept nodes of highest path q are forwarded; draws kept breadth-first",
                  beam_select, beam_keep, lambda cfg: cfg.pool),
        LevelRule("pruned", "SGLang's top-k beams and N - 1 best path scores on sampled children (lossy)",
                  pruned_select, pruned_keep, lambda cfg: cfg.pool, lossless=False),
    )
}
DEFAULT_LEVEL_RULE = "spine_wide"
LOSSLESS_LEVEL_RULES = tuple(name for name, rule in LEVEL_RULES.items() if rule.lossless)


class LevelDrafter:
    """Draft one round of a batch in the loop shape of SGLang's EAGLE draft worker::

        drafter = LevelDrafter(cfg, rule, root_q, deterministic)
        step = drafter.first()                      # forward 0's beams
        for _ in range(cfg.depth - 1):
            q_rows = forward(step)                  # float [B * k, V]: q of the beams just run
            step = drafter.step(q_rows)             # the next forward's beams (None after the last)
        tree = drafter.finish()

    Args:
        cfg: ``ExpandConfig`` (D, k, N); needs N - 1 <= k + (D - 1) k^2 and the rule's capacity.
        rule: a key of ``LEVEL_RULES``.
        root_q: float [B, V], q of the root's children (already transformed by the request's
            sampling parameters); rows non-negative with positive mass.
        deterministic: bool [B]; True rows take q's top-k children instead of sampling.
        generator: draws the uniforms when ``uniforms`` is None.
        uniforms: float64 [B, 1 + k (D - 1), k] in [0, 1): child j of forwarded node f uses
            ``uniforms[:, f, j]`` (inverse CDF on q without the earlier draws).
        validate: check the q rows of every step (one host sync per step).
    """

    def __init__(self, cfg: ExpandConfig, rule: str, root_q: torch.Tensor, deterministic: torch.Tensor,
                 generator: torch.Generator | None = None, uniforms: torch.Tensor | None = None,
                 validate: bool = True):
        if not isinstance(cfg, ExpandConfig):
            raise ValueError(f"cfg must be an ExpandConfig, got {type(cfg).__name__}")
        if rule not in LEVEL_RULES:
            raise ValueError(f"rule must be one of {sorted(LEVEL_RULES)}, got {rule!r}")
        self.cfg, self.rule, self.validate = cfg, LEVEL_RULES[rule], validate
        _check_budget(cfg, self.rule)
        if not isinstance(root_q, torch.Tensor) or root_q.dim() != 2 or not root_q.is_floating_point():
            raise ValueError(f"root_q must be a float tensor [B, V], got {getattr(root_q, 'shape', root_q)!r}")
        batch = root_q.shape[0]
        if not isinstance(deterministic, torch.Tensor) or deterministic.dtype != torch.bool or tuple(deterministic.shape) != (batch,):
            raise ValueError(f"deterministic must be a bool tensor [B] = [{batch}]")
        num_fwd = 1 + cfg.topk * (cfg.depth - 1)
        if uniforms is None:
            uniforms = torch.rand(batch, num_fwd, cfg.topk, generator=generator, dtype=torch.float64, device=root_q.device)
        if tuple(uniforms.shape) != (batch, num_fwd, cfg.topk):
            raise ValueError(f"uniforms must be [B, 1 + k (D - 1), k] = [{batch}, {num_fwd}, {cfg.topk}], got {list(uniforms.shape)}")
        if validate:
            _check_q("root_q", root_q, torch.ones(batch, dtype=torch.bool, device=root_q.device))
            if not uniforms.is_floating_point() or bool(((uniforms < 0) | (uniforms >= 1)).any()):
                raise ValueError("uniforms must be floats in [0, 1)")
        self.uniforms = uniforms
        self.state = LevelState.empty(cfg, root_q, deterministic)
        self.forwards_done = -1  # -1: first() not called yet

    def first(self) -> StepInput | None:
        """Draw the root's children (block 0) and return forward 0's beams (None when D = 1)."""
        if self.forwards_done != -1:
            raise ValueError("first() was already called for this round")
        self.forwards_done = 0
        state = self.state
        _draw_children(state, torch.tensor([0], device=state.root_q.device), self.uniforms[:, :1])
        if self.cfg.depth == 1:
            return None
        return self._select(0, torch.arange(state.batch, device=state.root_q.device).unsqueeze(-1).expand(-1, self.cfg.topk))

    def step(self, q_rows: torch.Tensor) -> StepInput | None:
        """Record the q rows of the beams just forwarded, draw their children, return the next beams.

        Args:
            q_rows: float [B * k, V], row b * k + j = q of beam j of request b.
        Returns:
            ``StepInput`` of the next forward, or None after the last forward (D - 1 of them).
        """
        cfg, state = self.cfg, self.state
        level = self.forwards_done
        if level < 0 or level >= cfg.depth - 1:
            raise ValueError(f"step() is called once per draft forward after first(): {cfg.depth - 1} times for depth {cfg.depth}")
        if not isinstance(q_rows, torch.Tensor) or not q_rows.is_floating_point() or tuple(q_rows.shape) != (state.batch * cfg.topk, state.vocab):
            raise ValueError(f"q_rows must be a float tensor [B * k, V] = [{state.batch * cfg.topk}, {state.vocab}], got {list(getattr(q_rows, 'shape', []))}")
        fwd = torch.arange(1 + level * cfg.topk, 1 + (level + 1) * cfg.topk, device=q_rows.device)
        q = q_rows.view(state.batch, cfg.topk, -1).to(state.fwd_q.dtype)
        if self.validate:
            _check_q("q_rows (rows of active beams)", q[state.fwd_active[:, fwd]], None)
        state.fwd_q[:, fwd] = q
        _draw_children(state, fwd, self.uniforms[:, fwd])
        self.forwards_done = level + 1
        if level + 1 == cfg.depth - 1:
            return None
        return self._select(level + 1, None)

    def _select(self, level: int, request_rows: torch.Tensor | None) -> StepInput:
        """Let the rule pick forward ``level``'s k beams; record them in ``parent_list``."""
        cfg, state = self.cfg, self.state
        pool, active = self.rule.select(state, level)
        fwd = slice(1 + level * cfg.topk, 1 + (level + 1) * cfg.topk)
        state.fwd_pool[:, fwd] = pool
        state.fwd_active[:, fwd] = active
        rows = torch.arange(state.batch, device=pool.device).unsqueeze(-1)
        if level == 0:
            hidden = request_rows
        else:  # the row of the beam of the previous forward that drew the node
            hidden = rows * cfg.topk + (pool // cfg.topk - 1 - (level - 1) * cfg.topk)
        return StepInput(state.pool_tokens.gather(1, pool).reshape(-1), hidden.reshape(-1).long(), pool)

    def finish(self) -> LevelTree:
        """The drafted tree (after first() and the D - 1 step() calls)."""
        if self.forwards_done != self.cfg.depth - 1:
            raise ValueError(f"finish() needs first() and {self.cfg.depth - 1} step() calls, got {max(self.forwards_done, 0)} steps")
        keep = self.rule.keep(self.state)
        return _to_tree(self.state, keep, self.cfg)


def _check_budget(cfg: ExpandConfig, rule: LevelRule) -> None:
    if cfg.budget > cfg.pool:
        raise ValueError(
            f"--speculative-num-draft-tokens ({cfg.num_draft_tokens}) - 1 must be <= k + (D - 1) k^2 = {cfg.pool} "
            f"for --speculative-num-steps {cfg.depth} and --speculative-eagle-topk {cfg.topk}")
    if cfg.budget > rule.capacity(cfg):
        raise ValueError(
            f"rule {rule.name!r} keeps at most {rule.capacity(cfg)} nodes for (D, k) = ({cfg.depth}, {cfg.topk}); "
            f"--speculative-num-draft-tokens ({cfg.num_draft_tokens}) - 1 is larger")


def _check_q(name: str, q: torch.Tensor, rows) -> None:
    """Rows must be finite, non-negative, with positive mass (host sync)."""
    if rows is not None:
        q = q[rows]
    if q.numel() == 0:
        return
    if not bool(torch.isfinite(q).all()) or bool((q < 0).any()):
        raise ValueError(f"{name} must be finite and non-negative")
    if bool((q.sum(-1) <= 0).any()):
        raise ValueError(f"{name}: every row needs positive mass")


def _draw_children(state: LevelState, fwd: torch.Tensor, uniforms: torch.Tensor) -> None:
    """Draw the k children of the forwarded nodes ``fwd`` (int64 [F']) of every request, in place.

    Without replacement from q (inverse CDF, ``uniforms`` float64 [B, F', k]); deterministic rows
    take the top tokens in q order (ties: lower id). Inactive forwards get no valid child."""
    k = state.k
    q = state.fwd_q[:, fwd].double()  # [B, F', V]
    remaining = q.clone()
    det = state.deterministic.view(-1, 1).expand(-1, fwd.numel())
    active = state.fwd_active[:, fwd]
    parent_score = torch.where(fwd == 0, 1.0, state.pool_score.gather(1, state.fwd_pool[:, fwd].clamp_min(0)))
    for j in range(k):
        flat = remaining.reshape(-1, remaining.shape[-1])
        sampled = inverse_cdf_sample(flat, uniforms[..., j].reshape(-1).double()).clamp_min(0)
        token = torch.where(det.reshape(-1), flat.argmax(-1), sampled).view(det.shape)
        valid = active & (remaining.sum(-1) > 0)
        slot = fwd * k + j
        state.pool_tokens[:, slot] = torch.where(valid, token, 0)
        state.pool_valid[:, slot] = valid
        state.pool_score[:, slot] = parent_score * q.gather(-1, token.unsqueeze(-1)).squeeze(-1)
        remaining.scatter_(-1, token.unsqueeze(-1), 0.0)


def _to_tree(state: LevelState, keep: torch.Tensor, cfg: ExpandConfig) -> LevelTree:
    """Pool layout (sorted kept indices, filler after them) and the verify layout."""
    batch, pool_size = keep.shape
    device = keep.device
    slot = torch.arange(pool_size, device=device)
    # Kept slots (ascending), then unkept filler (ascending): only rows whose q support ran out
    # have filler; it is unreachable in the verify layout.
    top = torch.sort(torch.where(keep, slot, slot + pool_size), dim=-1).indices[:, : cfg.budget]
    num_kept = keep.sum(-1)
    is_kept = keep.gather(1, top)
    column = torch.full((batch, pool_size), -1, dtype=torch.long, device=device)
    column.scatter_(1, top, torch.arange(1, cfg.num_draft_tokens, device=device).expand(batch, -1))
    parent_pool = state.fwd_pool.gather(1, top // cfg.topk)  # -1: the root
    parent_col = torch.where(parent_pool < 0, 0, column.gather(1, parent_pool.clamp_min(0)))
    parents = torch.cat([torch.full((batch, 1), -1, device=device, dtype=torch.long),
                         torch.where(is_kept, parent_col, -1)], 1)
    first_child, next_sibling = links_from_parents(parents)
    # Forwarded node of each kept pool slot (active forwards only), for the q rows.
    fwd_of_slot = torch.full((batch, pool_size + 1), -1, dtype=torch.long, device=device)
    fwd_ids = torch.arange(state.fwd_pool.shape[1], device=device).expand(batch, -1)
    target = torch.where(state.fwd_active & (state.fwd_pool >= 0), state.fwd_pool, pool_size)
    fwd_of_slot.scatter_(1, target, fwd_ids)
    node_fwd = torch.cat([torch.zeros(batch, 1, dtype=torch.long, device=device),
                          torch.where(is_kept, fwd_of_slot.gather(1, top), -1)], 1)
    rows = torch.arange(batch, device=device).unsqueeze(-1)
    probs = torch.where((node_fwd >= 0).unsqueeze(-1), state.fwd_q[rows, node_fwd.clamp_min(0)], 0.0)
    tokens = state.pool_tokens.gather(1, top)
    depth_of = torch.where(top < cfg.topk, 1, 2 + (top - cfg.topk) // cfg.topk**2)
    return LevelTree(
        parent_list=state.fwd_pool.clone(), top_scores_index=top, draft_tokens=tokens, draft_probs=probs,
        candidates=torch.cat([torch.zeros(batch, 1, dtype=torch.long, device=device), tokens], 1),
        retrive_next_token=first_child, retrive_next_sibling=next_sibling, parents=parents,
        depths=torch.cat([torch.zeros(batch, 1, dtype=torch.long, device=device), torch.where(is_kept, depth_of, 0)], 1),
        num_kept=num_kept,
    )
