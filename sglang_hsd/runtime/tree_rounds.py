"""Sampled draft trees in the runtime (``HierarchyConfig.tree``): drafter -> target, one tree per
request per round.

A round of rows ``idx`` whose last committed token r sits at position s = ``seq_len - 1``:

1. **Root q.** The drafter (a separate model, the target's first L layers and an exit head, or an
   EAGLE-3 head: ``_LayerTreeDrafter`` / ``_Eagle3TreeDrafter``) catches up to the committed
   tokens and gives q after r.
2. **Drafting.** ``LevelDrafter`` (``sglang_hsd/tree_draft/drafter.py``, the rule the server's sampled
   trees run) draws the tree level by level: D - 1 drafter forwards of k beams per request. Beam j
   of forward i sits at depth i + 1 (position s + i + 1) in the drafter's cache slot
   ``s + 1 + i * k + j`` and attends the committed tokens and its forwarded ancestors only
   (``forward_layers``'s ``mask_prefix``: the earlier forwards' slots fall under the tree mask).
   Children are drawn by Gumbel top-k with keyed noise (``tree_draft/noise.py``); greedy
   requests take the top-k tree of the drafter's plain softmax (``tree_draft/children.py``, the
   same greedy-row rule as the server's): a tree of positive probability under the sampled law,
   so the lossless verifier returns the target's greedy path on it.
3. **Verification.** One target forward over r and the N - 1 kept nodes with the tree attention
   mask (positions s + depth), the target's rows under the request's sampling parameters, then
   ``verify_tree`` with the target level's tree method (``config.TREE_METHOD_OF``).
4. **Commit.** The accepted path and the corrected/bonus token are appended. The target's KV of r
   and the accepted nodes is compacted in place (``KVCache.keep``), so the caches again hold every
   committed token but the last. A drafter with its own cache keeps, compacted the same way, the
   accepted nodes it forwarded (a prefix of the path: beams reach depth D - 1), so its next
   catch-up runs only the rest of the path and the bonus token.

An EAGLE-3 head reads the target's features up to the token before r (the target runs r with the
tree); each beam's entry reads its token and its parent's output and attends its forwarded
ancestors' entries (``Eagle3Head.forward_cached``'s ``mask_prefix``); the tree's entries are cut
after drafting.

An exit drafter shares the target's cache for layers [0, L) (``reuse_kv``): its tree slots are cut
before the target's forward, which runs every layer on the tree (the drafter's forwards of those
layers are not reused for the kept nodes).

Why the output law is the target's: each round is the server's tree round (the same drafting rule
and verifier, whose exact round law is enumerated in ``tests/tree_draft/test_exact.py``);
the drafter's q rows are the distributions the children were drawn from, which is what
``verify_tree`` divides by. ``tests/runtime/test_engine_tree.py`` checks the batched engine's
multi-token law by chi-square against the exact target law.
"""

from __future__ import annotations

import time
from typing import Protocol

import torch

from sglang_hsd.runtime.eagle3_drafter import Eagle3Drafter
from sglang_hsd.runtime.groups import LayerGroup, advance
from sglang_hsd.sampling import BatchSamplingParams, logits_to_probs
from sglang_hsd.verify.tree.api import verify_tree
from sglang_hsd.tree_draft import DraftPlan, KeyedNoise, LevelDrafter, LevelTree, greedy_draft_q
from sglang_hsd.verify.tree.mask import tree_attention_mask


class TreeHost(Protocol):
    """What a tree round reads and drives on the state of one ``generate`` call (the engine's run
    state implements it; tensors are per request row b of B, positions index ``tokens``).

    Fields:
        gen: the ``SpeculativeGenerator`` (its config, validate flag); params: ``BatchSamplingParams``.
        tokens: int64 [B, max_len]; seq_len: int64 [B]; buf_start: the drafter's at index 0.
        level_group / level_head: per level, its layer group and exit head (or None).
        stats: per level, ``LevelStats``; trace: ``RoundTrace`` or None; generator: torch.Generator.
        eagle: the ``Eagle3Drafter`` of an EAGLE-3 drafter, else None.
        commit(idx): finish rows ``idx`` that produced EOS or reached their limit.
    """

    gen: object
    params: BatchSamplingParams
    tokens: torch.Tensor
    seq_len: torch.Tensor
    buf_start: list
    level_group: list
    level_head: list
    stats: list
    trace: object
    generator: torch.Generator
    eagle: object

    def commit(self, idx: torch.Tensor) -> None: ...


def tree_slots(config) -> int:
    """Cache slots a tree round of ``config`` (a ``HierarchyConfig``) needs past the committed
    tokens: the drafter's forwarded nodes (k (D - 1)) or the target's tree (N), whichever is
    larger; 0 without a tree."""
    tree = config.tree
    return 0 if tree is None else max(tree.num_draft_tokens, tree.topk * (tree.depth - 1) + 1)


class TreeRounds:
    """Runs tree rounds on the state of one ``generate`` call (a ``TreeHost``)."""

    def __init__(self, run: TreeHost) -> None:
        self.run = run
        config = run.gen.config
        self.shape, self.rule, self.method = config.tree, config.tree_rule, config.tree_method
        self.plan = DraftPlan.build(config.tree, config.tree_rule, run.tokens.device, config.tree_children)
        self.target: LayerGroup = run.level_group[-1]
        # The target's groups from the embeddings up (the last one is the target level's).
        self.target_chain: list[LayerGroup] = []
        group = self.target
        while group is not None:
            self.target_chain.insert(0, group)
            group = group.source
        self.drafter: _TreeDrafter = (_Eagle3TreeDrafter(run, run.eagle) if run.eagle is not None
                                      else _LayerTreeDrafter(run, self.target_chain))

    # ------------------------------------------------------------------ one round
    def round(self, rows: torch.Tensor) -> None:
        """One tree round for the active rows (bool [B])."""
        run = self.run
        idx = rows.nonzero().squeeze(-1)
        root_pos = run.seq_len[idx] - 1  # r's position, per active row
        start_time = time.perf_counter()
        advance(self.target, run.tokens, run.seq_len - 1)  # every committed token but r (prefill)
        target_seconds = time.perf_counter() - start_time
        start_time = time.perf_counter()
        tree = self._draft(idx)
        run.stats[0].seconds += time.perf_counter() - start_time

        start_time = time.perf_counter()
        candidates = tree.candidates.clone()
        candidates[:, 0] = run.tokens[idx, root_pos]
        logits, outputs = self._target_forward(idx, candidates, tree.parents, root_pos.unsqueeze(-1) + tree.depths)
        p = logits_to_probs(logits, run.params.rows(idx))  # [R, N, V]
        # A request whose q ran out of support (top-k / top-p below k) has filler columns after
        # its num_kept nodes, which validation accepts as such.
        res = verify_tree(candidates, tree.retrive_next_token, tree.retrive_next_sibling, tree.draft_probs, p,
                          method=self.method, generator=run.generator, validate=run.gen.validate,
                          max_depth=self.shape.depth, num_kept=tree.num_kept, draft_mode=self.plan.sampler.draft_mode)
        self.drafter.keep_accepted(idx, tree, res)
        self._commit(idx, root_pos, res, outputs)
        stats = run.stats[-1]
        stats.rounds += idx.numel()
        stats.proposed += int(tree.num_kept.sum())
        stats.accepted += int(res.num_accepted.sum())
        stats.seconds += target_seconds + time.perf_counter() - start_time

    def _draft(self, idx: torch.Tensor) -> LevelTree:
        """Steps 1-2: the root's q and D - 1 beam forwards; the drafter's tree slots are cut after."""
        run, shape, drafter = self.run, self.shape, self.drafter
        k, rows = shape.topk, idx.numel()
        # Greedy rows come out one-hot here and take the plain softmax instead (greedy_draft_q).
        params = run.params.rows(idx)
        root_logits = drafter.root_logits(idx)
        greedy = run.params.temperature[idx] == 0
        noise = KeyedNoise.fresh(run.seq_len[idx], run.generator)  # a stream per request and round
        root_q = greedy_draft_q(logits_to_probs(root_logits, params), root_logits, greedy)
        level_drafter = LevelDrafter(self.plan, root_q, greedy, noise, validate=run.gen.validate)
        beam_params, beam_greedy = params.repeat_interleave(k), greedy.repeat_interleave(k)
        num_forwarded = k * (shape.depth - 1)
        # ancestors[r, s, s']: forwarded slot s' is s or an ancestor of s (the root is cached, not a slot).
        ancestors = torch.zeros(rows, num_forwarded, num_forwarded, dtype=torch.bool, device=idx.device)
        step, level = level_drafter.first(), 0
        while step is not None:
            slots = torch.arange(level * k, (level + 1) * k, device=idx.device)
            ancestors[:, slots, slots] = True
            if level > 0:  # the beam of the previous forward this node was drawn from
                parent = step.hidden_rows.view(rows, k) % k + (level - 1) * k  # [R, k]
                ancestors[:, slots] |= ancestors.gather(1, parent.unsqueeze(-1).expand(-1, -1, num_forwarded))
            mask = ancestors[:, slots, : (level + 1) * k]  # [R, k, (level + 1) k]
            logits = drafter.beam_logits(idx, step, level, mask)  # [R, k, V]
            flat = logits.reshape(rows * k, -1)
            step = level_drafter.step(greedy_draft_q(logits_to_probs(flat, beam_params), flat, beam_greedy))
            level += 1
        tree = level_drafter.finish()
        stats = run.stats[0]
        stats.drafts += rows
        stats.rounds += rows * shape.depth
        stats.proposed += int(tree.num_kept.sum())
        drafter.cut_back()
        return tree

    def _target_forward(self, idx, candidates, parents, positions) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Step 3's forward: every target group on the trees (int64 [R, N] each) of rows ``idx``.

        Returns the target's logits [R, N, V] and each group's outputs [B, N, D] (chain order).
        """
        run = self.run
        batch, nodes = run.seq_len.shape[0], candidates.shape[1]
        ids = _scatter_rows(idx, batch, candidates)
        full_positions = _scatter_rows(idx, batch, positions)
        mask = torch.eye(nodes, dtype=torch.bool, device=idx.device).expand(batch, -1, -1).clone()
        mask[idx] = tree_attention_mask(parents)
        num_new = _scatter_rows(idx, batch, torch.full((idx.numel(),), nodes, dtype=torch.long, device=idx.device))
        hidden, outputs = self.target_chain[0].model.embed(ids), []
        for group in self.target_chain:
            hidden = group.model.forward_layers(hidden, group.start, group.end, group.cache, num_new,
                                                full_positions, mask)
            outputs.append(hidden)
        return self.target.model.exit_logits(hidden[idx], run.level_head[-1]), outputs

    def _commit(self, idx, root_pos, res, outputs) -> None:
        """Step 4: append the accepted path and the bonus token; compact the target's KV and
        stored hidden states to r + the accepted nodes."""
        run = self.run
        batch = run.seq_len.shape[0]
        accepted = res.num_accepted  # [R]
        path = res.accept_index.clamp_min(0)  # [R, D + 1], root first
        kept = torch.arange(path.shape[1], device=idx.device).unsqueeze(0) <= accepted.unsqueeze(-1)
        keep_len = torch.zeros(batch, dtype=torch.long, device=idx.device)
        keep_len[idx] = accepted + 1
        keep_index = torch.zeros(batch, path.shape[1], dtype=torch.long, device=idx.device)
        keep_index[idx] = path
        rows = idx.unsqueeze(-1).expand_as(path)[kept]
        dest = (root_pos.unsqueeze(-1) + torch.arange(path.shape[1], device=idx.device))[kept]
        for group, out in zip(self.target_chain, outputs):
            start = group.length().clone()
            start[idx] = root_pos
            group.cache.keep(range(group.start, group.end), start, keep_index, keep_len)
            group.hidden[rows, dest] = out[rows, path[kept]]
        emitted = accepted + 1
        dest = root_pos.unsqueeze(-1) + 1 + torch.arange(res.tokens.shape[1], device=idx.device)
        written = torch.arange(res.tokens.shape[1], device=idx.device).unsqueeze(0) < emitted.unsqueeze(-1)
        rows = idx.unsqueeze(-1).expand_as(dest)
        run.tokens[rows[written], dest[written]] = res.tokens[written]
        run.seq_len[idx] += emitted
        run.buf_start[0][idx] = run.seq_len[idx]
        if run.trace is not None:
            run.trace.record(True, idx, accepted, emitted)
        run.commit(idx)


def _scatter_rows(idx: torch.Tensor, batch: int, values: torch.Tensor, fill=0) -> torch.Tensor:
    """``values`` [R, ...] of rows ``idx`` placed in a [B, ...] tensor filled with ``fill``."""
    out = torch.full((batch, *values.shape[1:]), fill, dtype=values.dtype, device=values.device)
    out[idx] = values
    return out


class _TreeDrafter(Protocol):
    """How a tree round drives its drafter (rows ``idx`` of the run's batch)."""

    def root_logits(self, idx: torch.Tensor) -> torch.Tensor:
        """Catch up with the committed tokens; the logits after the last one. [R, V]"""

    def beam_logits(self, idx: torch.Tensor, step, level: int, mask: torch.Tensor) -> torch.Tensor:
        """Forward ``level``'s beams (a ``StepInput``: k tokens per row and the earlier output each
        reads), each attending ``mask`` [R, k, (level + 1) k] over this round's forwarded slots.
        Returns the logits of their children [R, k, V]."""

    def cut_back(self) -> None:
        """After drafting: drop this round's tree slots from state the target's forward shares."""

    def keep_accepted(self, idx: torch.Tensor, tree: LevelTree, res) -> None:
        """After verification (``res``: ``verify_tree``'s result for rows ``idx``, before the
        commit): keep what the drafter computed for the accepted path, drop the rest."""


class _LayerTreeDrafter:
    """A separate draft model, or the target's first L layers with an exit head: token embeddings
    in, beams attend their ancestors' KV (``forward_layers``'s ``mask_prefix``)."""

    def __init__(self, run: TreeHost, target_chain: list[LayerGroup]) -> None:
        self.run, self.group, self.head = run, run.level_group[0], run.level_head[0]
        if self.group.source is not None:
            raise ValueError("a tree drafter must run from the token embeddings (its group has no source)")
        # An exit drafter reusing the target's cache must leave it aligned with the target's layers.
        self.shares_target_cache = any(self.group.cache is group.cache for group in target_chain)

        # Per forward of this round: (pool index [R, k], output hidden [R, k, D]) of its beams.
        self.forwarded: list[tuple[torch.Tensor, torch.Tensor]] = []

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.group.model.exit_logits(hidden, self.head)

    def root_logits(self, idx: torch.Tensor) -> torch.Tensor:
        run = self.run
        advance(self.group, run.tokens, run.seq_len)  # r included: its output gives the root's q
        return self._logits(self.group.hidden[idx, run.seq_len[idx] - 1].unsqueeze(1))[:, 0]

    def beam_logits(self, idx: torch.Tensor, step, level: int, mask: torch.Tensor) -> torch.Tensor:
        run, group = self.run, self.group
        batch, rows = run.seq_len.shape[0], idx.numel()
        tokens = step.input_ids.view(rows, -1)
        k = tokens.shape[1]
        positions = (run.seq_len[idx] + level).unsqueeze(-1).expand(-1, k)  # depth level + 1
        width = torch.full((rows,), k, dtype=torch.long, device=idx.device)
        hidden = group.model.forward_layers(
            group.model.embed(_scatter_rows(idx, batch, tokens)), group.start, group.end, group.cache,
            _scatter_rows(idx, batch, width), _scatter_rows(idx, batch, positions),
            _scatter_rows(idx, batch, mask, False), _scatter_rows(idx, batch, width * level))
        self.forwarded.append((step.pool_index.view(rows, k), hidden[idx]))
        return self._logits(hidden[idx])

    def cut_back(self) -> None:
        # A shared cache must hold exactly the committed tokens but r when the target's tree forward runs.
        if self.shares_target_cache:
            run, group = self.run, self.group
            group.cache.truncate(torch.minimum(group.length(), run.seq_len - 1), layers=range(group.start, group.end))
            self.forwarded = []

    def keep_accepted(self, idx: torch.Tensor, tree: LevelTree, res) -> None:
        """Own cache: compact the KV and outputs of the accepted nodes the drafter forwarded (a
        prefix of the path: beam forwards reach depth D - 1) right after r, so the next round's
        catch-up runs only the rest of the path and the bonus token. Each kept beam attended the
        committed tokens and its ancestors, i.e. exactly this prefix: its KV is the one a plain
        forward of the path would write."""
        if self.shares_target_cache:
            return
        run, group, forwarded, self.forwarded = self.run, self.group, self.forwarded, []
        batch, rows = run.seq_len.shape[0], idx.numel()
        offsets = torch.zeros(rows, max(len(forwarded), 1), dtype=torch.long, device=idx.device)
        kept = torch.zeros(rows, dtype=torch.long, device=idx.device)
        alive = torch.ones(rows, dtype=torch.bool, device=idx.device)
        for level, (pool, hidden) in enumerate(forwarded):
            node = res.accept_index[:, level + 1]  # [R], -1 past the accepted path
            node_pool = tree.top_scores_index.gather(1, (node - 1).clamp_min(0).unsqueeze(-1))  # [R, 1]
            match = (pool == node_pool) & (node >= 1).unsqueeze(-1)  # [R, k]
            alive &= match.any(-1)
            beam = match.long().argmax(-1)
            offsets[:, level] = level * pool.shape[1] + beam
            write = idx[alive]
            group.hidden[write, run.seq_len[write] + level] = hidden[alive, beam[alive]]
            kept += alive.long()
        start = group.length().clone()
        start[idx] = run.seq_len[idx]
        group.cache.keep(range(group.start, group.end), start, _scatter_rows(idx, batch, offsets),
                         _scatter_rows(idx, batch, kept))


class _Eagle3TreeDrafter:
    """An EAGLE-3 head (``eagle3_drafter.Eagle3Drafter``): the root's entry reads the target's
    features up to the token before r; a beam's entry reads its token and its parent's output (the
    root entry's for the first forward) and attends its forwarded ancestors' entries."""

    def __init__(self, run: TreeHost, eagle: Eagle3Drafter) -> None:
        self.run, self.eagle = run, eagle
        self.outputs: torch.Tensor | None = None  # [R, D] the root entry's, then [R * k, D] per forward

    def root_logits(self, idx: torch.Tensor) -> torch.Tensor:
        run, eagle = self.run, self.eagle
        # The target runs r with the tree, so its features stop at the token before r.
        logits = eagle.propose(idx, run.tokens, run.seq_len, run.seq_len - 1)
        self.outputs = eagle.out[idx, (run.seq_len[idx] - 2).clamp_min(0)]
        return logits

    def beam_logits(self, idx: torch.Tensor, step, level: int, mask: torch.Tensor) -> torch.Tensor:
        run, head = self.run, self.eagle.head
        batch, rows = run.seq_len.shape[0], idx.numel()
        tokens = step.input_ids.view(rows, -1)
        k = tokens.shape[1]
        hidden = self.outputs[step.hidden_rows].view(rows, k, -1)
        # Entry t reads x_{t+1}: a node at depth level + 1 (position seq_len + level) is entry seq_len - 1 + level.
        positions = (run.seq_len[idx] - 1 + level).unsqueeze(-1).expand(-1, k)
        width = torch.full((rows,), k, dtype=torch.long, device=idx.device)
        out = head.forward_cached(
            _scatter_rows(idx, batch, tokens), _scatter_rows(idx, batch, hidden), self.eagle.cache,
            _scatter_rows(idx, batch, width), _scatter_rows(idx, batch, positions),
            _scatter_rows(idx, batch, mask, False), _scatter_rows(idx, batch, width * level))[idx]
        self.outputs = out.reshape(rows * k, -1)
        return head.target_logits(out)

    def cut_back(self) -> None:
        # Keep entries 0 .. seq_len - 2 (target-fed); the next round feeds the accepted path.
        self.eagle.truncate(self.run.seq_len)

    def keep_accepted(self, idx: torch.Tensor, tree: LevelTree, res) -> None:
        pass  # the accepted path's entries are re-read from the target's features next round
