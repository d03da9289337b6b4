"""Sampled draft trees in the runtime (``HierarchyConfig.tree``): drafter -> target, one tree per
request per round.

A round of rows ``idx`` whose last committed token r sits at position s = ``seq_len - 1``:

1. **Root q.** The drafter (a separate model, or the target's first L layers and an exit head)
   catches up to the committed tokens and gives q after r.
2. **Drafting.** ``LevelDrafter`` (``verify/tree/level_draft.py``, the rule the server's sampled
   trees run) draws the tree level by level: D - 1 drafter forwards of k beams per request. Beam j
   of forward i sits at depth i + 1 (position s + i + 1) in the drafter's cache slot
   ``s + 1 + i * k + j`` and attends the committed tokens and its forwarded ancestors only
   (``forward_layers``'s ``mask_prefix``: the earlier forwards' slots fall under the tree mask).
   Greedy requests draft the top-k tree of the drafter's plain softmax (temperature 1): a tree of
   positive probability under the sampled law, so the lossless verifier returns the target's
   greedy path on it.
3. **Verification.** One target forward over r and the N - 1 kept nodes with the tree attention
   mask (positions s + depth), the target's rows under the request's sampling parameters, then
   ``verify_tree`` with the target level's tree method (``config.TREE_METHOD_OF``).
4. **Commit.** The accepted path and the corrected/bonus token are appended. The target's KV of r
   and the accepted nodes is compacted in place (``KVCache.keep``), so the caches again hold every
   committed token but the last; the drafter's cache is cut back to the committed tokens it had,
   and its next catch-up runs the accepted path.

An exit drafter shares the target's cache for layers [0, L) (``reuse_kv``): its tree slots are cut
before the target's forward, which runs every layer on the tree (the drafter's forwards of those
layers are not reused for the kept nodes).

Why the output law is the target's: each round is the server's tree round (the same drafting rule
and verifier, whose exact round law is enumerated in ``tests/verify/tree/test_level_draft_exact.py``);
the drafter's q rows are the distributions the children were drawn from, which is what
``verify_tree`` divides by. ``tests/runtime/test_engine_tree.py`` checks the batched engine's
multi-token law by chi-square against the exact target law.
"""

from __future__ import annotations

import time
from typing import Protocol

import torch

from sglang_hsd.runtime.groups import LayerGroup, advance
from sglang_hsd.sampling import BatchSamplingParams, logits_to_probs
from sglang_hsd.verify.tree.api import verify_tree
from sglang_hsd.verify.tree.level_draft import LevelDrafter, LevelTree
from sglang_hsd.verify.tree.mask import tree_attention_mask
from sglang_hsd.verify.tree.methods import TREE_METHODS
from sglang_hsd.verify.tree.validation import validate_tree_inputs


class TreeHost(Protocol):
    """What a tree round reads and drives on the state of one ``generate`` call (the engine's run
    state implements it; tensors are per request row b of B, positions index ``tokens``).

    Fields:
        gen: the ``SpeculativeGenerator`` (its config, validate flag); params: ``BatchSamplingParams``.
        tokens: int64 [B, max_len]; seq_len: int64 [B]; buf_start: the drafter's at index 0.
        level_group / level_head: per level, its layer group and exit head (or None).
        stats: per level, ``LevelStats``; trace: ``RoundTrace`` or None; generator: torch.Generator.
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
        self.drafter: LayerGroup = run.level_group[0]
        self.target: LayerGroup = run.level_group[-1]
        if self.drafter.source is not None:
            raise ValueError("a tree drafter must run from the token embeddings (its group has no source)")
        # The target's groups from the embeddings up (the last one is the target level's).
        self.target_chain: list[LayerGroup] = []
        group = self.target
        while group is not None:
            self.target_chain.insert(0, group)
            group = group.source
        # An exit drafter reusing the target's cache must leave it aligned with the target's layers.
        self.shares_target_cache = any(self.drafter.cache is group.cache for group in self.target_chain)

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
        if run.gen.validate:
            self._validate(tree, candidates, p)
        res = verify_tree(candidates, tree.retrive_next_token, tree.retrive_next_sibling, tree.draft_probs, p,
                          method=self.method, generator=run.generator, validate=False,
                          max_depth=self.shape.depth)
        self._commit(idx, root_pos, res, outputs)
        stats = run.stats[-1]
        stats.rounds += idx.numel()
        stats.proposed += int(tree.num_kept.sum())
        stats.accepted += int(res.num_accepted.sum())
        stats.seconds += target_seconds + time.perf_counter() - start_time

    def _validate(self, tree: LevelTree, candidates: torch.Tensor, p: torch.Tensor) -> None:
        """``verify_tree``'s input checks, per request on its kept nodes: a request whose q ran out
        of support (top-k / top-p below k) has unreachable filler columns, which the layout
        check would reject as orphans."""
        method = TREE_METHODS[self.method]
        for row, kept in enumerate(tree.num_kept.tolist()):
            nodes = slice(0, kept + 1)
            one = slice(row, row + 1)
            validate_tree_inputs(candidates[one, nodes], tree.retrive_next_token[one, nodes],
                                 tree.retrive_next_sibling[one, nodes], tree.draft_probs[one, nodes],
                                 p[one, nodes], reads_q=method.reads_q, distinct_siblings=method.distinct_siblings,
                                 uniforms=None)

    def _draft(self, idx: torch.Tensor) -> LevelTree:
        """Steps 1-2: the root's q and D - 1 beam forwards; the drafter's tree slots are cut after."""
        run, shape, group = self.run, self.shape, self.drafter
        k, rows = shape.topk, idx.numel()
        advance(group, run.tokens, run.seq_len)  # r included: its output gives the root's q
        params = self._draft_params(idx)
        root_logits = self._logits(group.hidden[idx, run.seq_len[idx] - 1].unsqueeze(1))[:, 0]
        greedy = run.params.temperature[idx] == 0
        drafter = LevelDrafter(shape, self.rule, logits_to_probs(root_logits, params), greedy,
                               generator=run.generator, validate=run.gen.validate)
        beam_params = params.repeat_interleave(k)
        num_forwarded = k * (shape.depth - 1)
        # ancestors[r, s, s']: forwarded slot s' is s or an ancestor of s (the root is cached, not a slot).
        ancestors = torch.zeros(rows, num_forwarded, num_forwarded, dtype=torch.bool, device=idx.device)
        step, level = drafter.first(), 0
        while step is not None:
            slots = torch.arange(level * k, (level + 1) * k, device=idx.device)
            ancestors[:, slots, slots] = True
            if level > 0:  # the beam of the previous forward this node was drawn from
                parent = step.hidden_rows.view(rows, k) % k + (level - 1) * k  # [R, k]
                ancestors[:, slots] |= ancestors.gather(1, parent.unsqueeze(-1).expand(-1, -1, num_forwarded))
            mask = ancestors[:, slots, : (level + 1) * k]  # [R, k, (level + 1) k]
            hidden = self._beam_forward(idx, step.input_ids.view(rows, k), level, mask)
            step = drafter.step(logits_to_probs(self._logits(hidden).reshape(rows * k, -1), beam_params))
            level += 1
        tree = drafter.finish()
        stats = run.stats[0]
        stats.drafts += rows
        stats.rounds += rows * shape.depth
        stats.proposed += int(tree.num_kept.sum())
        keep = run.seq_len - 1 if self.shares_target_cache else run.seq_len
        group.cache.truncate(torch.minimum(group.length(), keep), layers=range(group.start, group.end))
        return tree

    def _draft_params(self, idx: torch.Tensor) -> BatchSamplingParams:
        """The requests' sampling parameters, greedy rows at temperature 1: their top-k tree comes
        from the drafter's plain softmax (a one-hot q would give every node a single child)."""
        params = self.run.params.rows(idx)
        temperature = torch.where(params.temperature == 0, torch.ones_like(params.temperature), params.temperature)
        return BatchSamplingParams(temperature, params.top_k, params.top_p)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The drafter's logits of hidden states [R, T, D]. [R, T, V]."""
        return self.drafter.model.exit_logits(hidden, self.run.level_head[0])

    def _beam_forward(self, idx: torch.Tensor, tokens: torch.Tensor, level: int, mask: torch.Tensor) -> torch.Tensor:
        """The drafter on forward ``level``'s beams (int64 [R, k]) of rows ``idx``, each attending
        ``mask`` [R, k, (level + 1) k] over this round's forwarded slots. Returns hidden [R, k, D]."""
        run, group = self.run, self.drafter
        batch, k = run.seq_len.shape[0], tokens.shape[1]
        ids = torch.zeros(batch, k, dtype=torch.long, device=idx.device)
        ids[idx] = tokens
        num_new = torch.zeros(batch, dtype=torch.long, device=idx.device)
        num_new[idx] = k
        positions = torch.zeros(batch, k, dtype=torch.long, device=idx.device)
        positions[idx] = (run.seq_len[idx] + level).unsqueeze(-1).expand(-1, k)  # depth level + 1
        full_mask = torch.zeros(batch, k, mask.shape[-1], dtype=torch.bool, device=idx.device)
        full_mask[idx] = mask
        prefix = torch.zeros(batch, dtype=torch.long, device=idx.device)
        prefix[idx] = level * k
        hidden = group.model.forward_layers(group.model.embed(ids), group.start, group.end, group.cache,
                                            num_new, positions, full_mask, prefix)
        return hidden[idx]

    def _target_forward(self, idx, candidates, parents, positions) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Step 3's forward: every target group on the trees (int64 [R, N] each) of rows ``idx``.

        Returns the target's logits [R, N, V] and each group's outputs [B, N, D] (chain order).
        """
        run = self.run
        batch, nodes = run.seq_len.shape[0], candidates.shape[1]
        ids = torch.zeros(batch, nodes, dtype=torch.long, device=idx.device)
        ids[idx] = candidates
        full_positions = torch.zeros_like(ids)
        full_positions[idx] = positions
        mask = torch.eye(nodes, dtype=torch.bool, device=idx.device).expand(batch, -1, -1).clone()
        mask[idx] = tree_attention_mask(parents)
        num_new = torch.zeros(batch, dtype=torch.long, device=idx.device)
        num_new[idx] = nodes
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
