"""The level-synchronous sampled tree drafter: one round of a batch, in SGLang's draft-loop shape.

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

The children of a forwarded node come from a child sampler (``children.py``: by default k
sequential draws without replacement from its q row by inverse transform sampling) fed by a
noise source (``noise.py``: keyed, counter-based in the server and the runtime); which nodes are
forwarded and kept is the rule's (``rules.py``). A node gets at most min(k, #positive q) children.

Written as a static-shape tensor program: for a given (batch, shape, vocabulary) every step runs
the same operations on tensors of the same shapes, with no host synchronisation (no ``.item()``,
``.tolist()``, ``bool(tensor)``, data-dependent shapes or host-to-device copies) unless
``validate=True``; the static index tensors come from ``DraftPlan``, built once per shape. So the
draft loop can be captured in a CUDA graph and compiled with ``torch.compile(fullgraph=True)``
(``tests/tree_draft/test_capturable.py``).

Evidence of the law: ``tests/tree_draft/test_exact.py`` drives this drafter on every outcome of
its draws (noise chosen to produce each ordered draw, weighted by its Plackett-Luce probability)
and applies the exact law of ``hsd`` and ``rrs`` to each tree over chained rounds: TV < 1e-12 for
the lossless rules; ``tests/tree_draft/test_statistical.py`` checks the batched drafter with keyed
noise by chi-square.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_hsd.tree_draft.children import CHILD_SAMPLERS, DEFAULT_CHILD_SAMPLER, ChildSampler
from sglang_hsd.tree_draft.noise import NoiseSource, forward_slice
from sglang_hsd.tree_draft.rules import LEVEL_RULES, LevelRule, LevelState
from sglang_hsd.tree_draft.shape import TreeShape
from sglang_hsd.verify.tree.layout import links_from_parents


@dataclass(frozen=True)
class DraftPlan:
    """What every round of one configuration shares: built once (outside any captured graph).

    Fields:
        shape: ``TreeShape`` (D, k, N); N - 1 <= k + (D - 1) k^2 and the rule's capacity.
        rule: the ``LevelRule``; sampler: the ``ChildSampler``.
        keep_order: int64 [S] on ``device``, the rule's static keep priority, or None.
    """

    shape: TreeShape
    rule: LevelRule
    sampler: ChildSampler
    keep_order: torch.Tensor | None

    @classmethod
    def build(cls, shape: TreeShape, rule: str, device="cpu", sampler: str = DEFAULT_CHILD_SAMPLER) -> "DraftPlan":
        if not isinstance(shape, TreeShape):
            raise ValueError(f"shape must be a TreeShape, got {type(shape).__name__}")
        if rule not in LEVEL_RULES:
            raise ValueError(f"rule must be one of {sorted(LEVEL_RULES)}, got {rule!r}")
        if sampler not in CHILD_SAMPLERS:
            raise ValueError(f"sampler must be one of {sorted(CHILD_SAMPLERS)}, got {sampler!r}")
        level_rule = LEVEL_RULES[rule]
        check_budget(shape, level_rule)
        order = None
        if level_rule.keep_order is not None:
            order = torch.tensor(level_rule.keep_order(shape), dtype=torch.long, device=device)
        return cls(shape, level_rule, CHILD_SAMPLERS[sampler], order)


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


class LevelDrafter:
    """Draft one round of a batch in the loop shape of SGLang's EAGLE draft worker::

        drafter = LevelDrafter(plan, root_q, deterministic, noise)
        step = drafter.first()                      # forward 0's beams
        for _ in range(shape.depth - 1):
            q_rows = forward(step)                  # float [B * k, V]: q of the beams just run
            step = drafter.step(q_rows)             # the next forward's beams (None after the last)
        tree = drafter.finish()

    Args:
        plan: ``DraftPlan`` (shape, rule, sampler, static indices on the rows' device).
        root_q: float [B, V], q of the root's children (already transformed by the request's
            sampling parameters; ``children.greedy_draft_q`` for deterministic rows).
        deterministic: bool [B]; True rows take q's top-k children instead of sampling.
        noise: a ``NoiseSource`` for this round (``noise.KeyedNoise`` in the server and runtime).
        validate: check the q rows of every step (host synchronisation: not on a hot path).
    """

    def __init__(self, plan: DraftPlan, root_q: torch.Tensor, deterministic: torch.Tensor, noise: NoiseSource,
                 validate: bool = True):
        if not isinstance(plan, DraftPlan):
            raise ValueError(f"plan must be a DraftPlan, got {type(plan).__name__}")
        if not isinstance(root_q, torch.Tensor) or root_q.dim() != 2 or not root_q.is_floating_point():
            raise ValueError(f"root_q must be a float tensor [B, V], got {getattr(root_q, 'shape', root_q)!r}")
        batch = root_q.shape[0]
        if not isinstance(deterministic, torch.Tensor) or deterministic.dtype != torch.bool or tuple(deterministic.shape) != (batch,):
            raise ValueError(f"deterministic must be a bool tensor [B] = [{batch}]")
        if not callable(getattr(noise, plan.sampler.noise, None)):
            raise ValueError(f"noise must be a NoiseSource (a .{plan.sampler.noise} method for child sampler "
                             f"{plan.sampler.name!r}), got {type(noise).__name__}")
        self.plan, self.shape, self.noise, self.validate = plan, plan.shape, noise, validate
        if validate:
            _check_q("root_q", root_q)
        self.state = LevelState.empty(plan.shape, plan.keep_order, root_q, deterministic)
        self.forwards_done = -1  # -1: first() not called yet

    def first(self) -> StepInput | None:
        """Draw the root's children (block 0) and return forward 0's beams (None when D = 1)."""
        if self.forwards_done != -1:
            raise ValueError("first() was already called for this round")
        self.forwards_done = 0
        self._draw_children(0)
        if self.shape.depth == 1:
            return None
        state = self.state
        request_rows = torch.arange(state.batch, device=state.fwd_q.device).unsqueeze(-1).expand(-1, self.shape.topk)
        return self._select(0, request_rows)

    def step(self, q_rows: torch.Tensor) -> StepInput | None:
        """Record the q rows of the beams just forwarded, draw their children, return the next beams.

        Args:
            q_rows: float [B * k, V], row b * k + j = q of beam j of request b.
        Returns:
            ``StepInput`` of the next forward, or None after the last forward (D - 1 of them).
        """
        shape, state = self.shape, self.state
        level = self.forwards_done
        if level < 0 or level >= shape.depth - 1:
            raise ValueError(f"step() is called once per draft forward after first(): {shape.depth - 1} times for depth {shape.depth}")
        if not isinstance(q_rows, torch.Tensor) or not q_rows.is_floating_point() or tuple(q_rows.shape) != (state.batch * shape.topk, state.vocab):
            raise ValueError(f"q_rows must be a float tensor [B * k, V] = [{state.batch * shape.topk}, {state.vocab}], got {list(getattr(q_rows, 'shape', []))}")
        fwd = forward_slice(level + 1, shape.topk)
        q = q_rows.view(state.batch, shape.topk, -1).to(state.fwd_q.dtype)
        if self.validate:
            _check_q("q_rows (rows of active beams)", q[state.fwd_active[:, fwd]])
        state.fwd_q[:, fwd] = q
        self._draw_children(level + 1)
        self.forwards_done = level + 1
        if level + 1 == shape.depth - 1:
            return None
        return self._select(level + 1, None)

    def _draw_children(self, level: int) -> None:
        """Draw the k children of every forwarded node of ``level`` (in place): the child sampler
        on the nodes' q rows and the level's noise; children of inactive forwards are invalid."""
        state, k, sampler = self.state, self.shape.topk, self.plan.sampler
        fwd = forward_slice(level, k)
        q = state.fwd_q[:, fwd]  # [B, F', V]
        batch, forwards, vocab = q.shape
        draws = sampler.noise_draws(k)
        if sampler.noise == "uniform":
            noise = self.noise.uniform(level, forwards, draws).reshape(batch * forwards, draws)
        else:
            noise = self.noise.gumbel(level, forwards, draws, vocab).reshape(batch * forwards, draws, vocab)
        det = state.deterministic.view(-1, 1).expand(-1, forwards).reshape(-1)
        tokens, valid = sampler.draw(q.reshape(batch * forwards, vocab), noise, det, k)
        tokens, valid = tokens.view(batch, forwards, k), valid.view(batch, forwards, k)
        valid = valid & state.fwd_active[:, fwd].unsqueeze(-1)
        slots = slice(fwd.start * k, fwd.stop * k)
        if level == 0:
            parent_score = torch.ones(batch, 1, 1, dtype=torch.float64, device=q.device)
        else:
            parent_score = state.pool_score.gather(1, state.fwd_pool[:, fwd].clamp_min(0)).unsqueeze(-1)
        state.pool_tokens[:, slots] = torch.where(valid, tokens, 0).view(batch, -1)
        state.pool_valid[:, slots] = valid.view(batch, -1)
        state.pool_score[:, slots] = (parent_score * q.gather(-1, tokens).double()).view(batch, -1)

    def _select(self, level: int, request_rows: torch.Tensor | None) -> StepInput:
        """Let the rule pick forward ``level``'s k beams; record them in ``parent_list``."""
        shape, state = self.shape, self.state
        pool, active = self.plan.rule.select(state, level)
        fwd = forward_slice(level + 1, shape.topk)
        state.fwd_pool[:, fwd] = pool
        state.fwd_active[:, fwd] = active
        rows = torch.arange(state.batch, device=pool.device).unsqueeze(-1)
        if level == 0:
            hidden = request_rows
        else:  # the row of the beam of the previous forward that drew the node
            hidden = rows * shape.topk + (pool // shape.topk - 1 - (level - 1) * shape.topk)
        return StepInput(state.pool_tokens.gather(1, pool).reshape(-1), hidden.reshape(-1).long(), pool)

    def finish(self) -> LevelTree:
        """The drafted tree (after first() and the D - 1 step() calls)."""
        if self.forwards_done != self.shape.depth - 1:
            raise ValueError(f"finish() needs first() and {self.shape.depth - 1} step() calls, got {max(self.forwards_done, 0)} steps")
        keep = self.plan.rule.keep(self.state)
        return _to_tree(self.state, keep, self.shape)


def check_budget(shape: TreeShape, rule: LevelRule) -> None:
    """Raise ``ValueError`` (naming SGLang's flags) unless N - 1 fits the pool and the rule."""
    if shape.budget > shape.pool:
        raise ValueError(
            f"--speculative-num-draft-tokens ({shape.num_draft_tokens}) - 1 must be <= k + (D - 1) k^2 = {shape.pool} "
            f"for --speculative-num-steps {shape.depth} and --speculative-eagle-topk {shape.topk}")
    if shape.budget > rule.capacity(shape):
        raise ValueError(
            f"rule {rule.name!r} keeps at most {rule.capacity(shape)} nodes for (D, k) = ({shape.depth}, {shape.topk}); "
            f"--speculative-num-draft-tokens ({shape.num_draft_tokens}) - 1 is larger")


def budget_shapes(shape: TreeShape, rule: str) -> dict[int, TreeShape]:
    """{depth d: the tree a round of budget d drafts} for d = 1..D: ``shape.at_depth(d)`` with
    its nodes capped at what ``rule`` (a key of ``LEVEL_RULES``) can keep at that depth. The
    adaptive controller's candidates for a sampled tree (``sglang_plugin/adaptive_spec.py``)."""
    level_rule = LEVEL_RULES[rule]
    out = {}
    for depth, budget in shape.budgets().items():
        capacity = level_rule.capacity(budget)
        if budget.budget > capacity:
            budget = TreeShape(depth, shape.topk, 1 + capacity)
        out[depth] = budget
    return out


def _check_q(name: str, q: torch.Tensor) -> None:
    """Rows must be finite, non-negative, with positive mass (host sync)."""
    if q.numel() == 0:
        return
    if not bool(torch.isfinite(q).all()) or bool((q < 0).any()):
        raise ValueError(f"{name} must be finite and non-negative")
    if bool((q.sum(-1) <= 0).any()):
        raise ValueError(f"{name}: every row needs positive mass")


def _to_tree(state: LevelState, keep: torch.Tensor, shape: TreeShape) -> LevelTree:
    """Pool layout (sorted kept indices, filler after them) and the verify layout."""
    batch, pool_size = keep.shape
    device = keep.device
    slot = torch.arange(pool_size, device=device)
    # Kept slots (ascending), then unkept filler (ascending): only rows whose q support ran out
    # have filler; it is unreachable in the verify layout.
    top = torch.sort(torch.where(keep, slot, slot + pool_size), dim=-1).indices[:, : shape.budget]
    num_kept = keep.sum(-1)
    is_kept = keep.gather(1, top)
    column = torch.full((batch, pool_size), -1, dtype=torch.long, device=device)
    column.scatter_(1, top, torch.arange(1, shape.num_draft_tokens, device=device).expand(batch, -1))
    parent_pool = state.fwd_pool.gather(1, top // shape.topk)  # -1: the root
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
    depth_of = torch.where(top < shape.topk, 1, 2 + (top - shape.topk) // shape.topk**2)
    return LevelTree(
        parent_list=state.fwd_pool.clone(), top_scores_index=top, draft_tokens=tokens, draft_probs=probs,
        candidates=torch.cat([torch.zeros(batch, 1, dtype=torch.long, device=device), tokens], 1),
        retrive_next_token=first_child, retrive_next_sibling=next_sibling, parents=parents,
        depths=torch.cat([torch.zeros(batch, 1, dtype=torch.long, device=device), torch.where(is_kept, depth_of, 0)], 1),
        num_kept=num_kept,
    )
