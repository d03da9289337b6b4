"""``HSDDraftWorker``: SGLang's EAGLE-3 V2 draft worker with draft q on the target vocabulary.

EAGLE-3 heads usually predict over a reduced draft vocabulary. SGLang samples the draft from
q = softmax(draft_logits / T) over that vocabulary and maps each sampled draft id to a target id
with the head's ``d2t`` offsets (``hot_token_id = arange(Vd) + d2t``), but it refuses rejection
sampling in that case (``EagleDraftWorker.alloc_memory_pool``, upstream FIXME) because q has the
wrong width for the verifier. ``HSDDraftWorker`` lifts the refusal and scatters q into the target
vocabulary (``draft_probs.scatter_draft_probs``) before verification.

With exit sub-rounds (exit buffer N_i > 1) its ``draft_forward`` also records the hidden output of
every draft entry it runs, for the continuation drafts of ``draft_continuation.py``.

With sampled trees (topk > 1, ``--hsd-tree-draft sampled``) it owns the draft loop
(``tree_draft.draft_sampled_tree``), keeps the round's ``DraftTree`` for verification in
``hsd_tree``, and its draft extends record the next root's q (``tree_draft.RootQHook``); under
SGLang's draft CUDA graph the round is captured by ``tree_graph.SampledTreeGraphRunner`` and its
tree comes back as graph outputs. The ``SampledTreeDraft`` mixin holds that part.

``HSDStandaloneDraftWorker`` is the same for a separate draft language model (SGLang's
``StandaloneDraftWorker``, its own embeddings, LM head and KV cache), sampled trees included: its
vocabulary is the target's (refused otherwise before models load), so q already has the target's
width; the shared ``TargetVocabDraft`` checks that on every round.

This module subclasses SGLang at import: only ``worker.py`` and ``standalone_worker.py`` import
it, once SGLang builds the HSD worker (after ``register()`` checked every signature).
"""

from __future__ import annotations

import contextlib
import functools

import torch
from sglang.srt.speculative.base_spec_worker import EagleDraftWorkerBase
from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker
from sglang.srt.speculative.standalone_worker_v2 import StandaloneDraftWorker

from sglang_hsd.sglang_plugin.cpu.linear_path import LogitRows, only_logit_rows
from sglang_hsd.sglang_plugin.draft_probs import is_identity_map, scatter_draft_probs
from sglang_hsd.sglang_plugin.tree_draft import draft_sampled_tree


class TargetVocabDraft(EagleDraftWorkerBase):
    """Mixin for SGLang draft workers: every draft q handed to verification has the target
    vocabulary's width (``hsd_target_vocab_size``, and ``hsd_identity_token_map``, whether
    ``hot_token_id`` is the identity: both set by ``_hsd_record_vocab`` in ``alloc_memory_pool``).

    It derives from SGLang's ``EagleDraftWorkerBase`` so that the classes it is mixed into keep
    the instance layout of SGLang's draft workers (``__class__`` re-assignment requires it).

    ``_hsd_full_vocab`` maps q [bs, steps, Vd] to [bs, steps, Vt]: scattered through
    ``hot_token_id`` for a reduced draft vocabulary, checked otherwise (a wrong width would make
    the verifier compare different tokens).
    """

    hsd_target_vocab_size: int
    hsd_identity_token_map: bool

    def _hsd_record_vocab(self) -> None:
        """Once SGLang has loaded the token map (``hot_token_id``): the target vocabulary's width
        and whether the map is the identity, decided by content here, once (one host sync)."""
        self.hsd_target_vocab_size = self.target_worker.model_config.vocab_size
        self.hsd_identity_token_map = is_identity_map(self.hot_token_id, self.hsd_target_vocab_size)

    def _hsd_full_vocab(self, draft_probs):
        if draft_probs is None:
            return draft_probs
        if self.hot_token_id is not None:
            draft_probs = scatter_draft_probs(draft_probs, self.hot_token_id,
                                              self.hsd_target_vocab_size,
                                              is_identity=self.hsd_identity_token_map)
        if draft_probs.shape[-1] != self.hsd_target_vocab_size:
            raise RuntimeError(
                f"HSD: draft q has width {draft_probs.shape[-1]}, the target vocabulary "
                f"{self.hsd_target_vocab_size}; the draft does not share the target's vocabulary")
        return draft_probs

    def init_cuda_graphs(self):
        super().init_cuda_graphs()
        runner = getattr(self, "cuda_graph_runner", None)
        if runner is not None:  # the graph path returns q from the captured draft_forward
            execute = runner.execute

            def execute_full_vocab(forward_batch, *args, **kwargs):
                out = self._hsd_graph_outputs(execute(forward_batch, *args, **kwargs))
                return (*out[:3], self._hsd_full_vocab(out[3]))

            runner.execute = execute_full_vocab


class SampledTreeDraft(EagleDraftWorkerBase):
    """Mixin for SGLang draft workers: with ``hsd_root_q`` set (a ``RootQHook``, installed by
    ``worker_setup.setup_sampled_trees`` for ``--hsd-tree-draft sampled`` trees, with
    ``hsd_config``, the ``PluginConfig`` whose tree rule and draft temperature scale the loop
    reads) sampled batches draft their tree with ``tree_draft.draft_sampled_tree`` and keep it in
    ``hsd_tree`` for verification, and every draft extend records the next root's q.

    All-greedy batches keep SGLang's deterministic top-k tree (and its argmax verification):
    sampling law plays no part there, and its score pruning suits argmax acceptance.
    """

    hsd_tree = None

    def _hsd_sampled_tree(self, forward_batch):
        """The round's sampled tree as ``draft_forward`` returns it, or None when this batch
        drafts SGLang's way (no sampled trees configured, idle or all-greedy batch)."""
        self.hsd_tree = None
        if (getattr(self, "hsd_root_q", None) is None or forward_batch.forward_mode.is_idle()
                or forward_batch.sampling_info.is_all_greedy):
            return None
        out, tree = draft_sampled_tree(self, forward_batch)
        if getattr(self, "hsd_capturing_tree", False):  # a graph returns the tree as outputs
            return (*out, tree.retrive_next_token, tree.retrive_next_sibling, tree.num_kept)
        self.hsd_tree = tree
        return out

    def _capture_cuda_graphs(self):
        """Sampled trees capture with ``tree_graph.SampledTreeGraphRunner``; otherwise SGLang's."""
        if getattr(self, "hsd_root_q", None) is None:
            return super()._capture_cuda_graphs()
        from sglang_hsd.sglang_plugin.tree_graph import sampled_tree_graph_runner

        with sampled_tree_graph_runner():
            return super()._capture_cuda_graphs()

    def _hsd_graph_outputs(self, out):
        """SGLang's four outputs of a draft graph replay; a sampled tree's links and ``num_kept``
        become the round's ``hsd_tree``."""
        if getattr(self, "hsd_root_q", None) is None:
            return out
        from sglang_hsd.sglang_plugin.tree_graph import split_graph_outputs

        out, self.hsd_tree = split_graph_outputs(out)
        return out

    def _draft_extend_for_prefill(self, batch, *args, **kwargs):
        hook = getattr(self, "hsd_root_q", None)
        extend = functools.partial(super()._draft_extend_for_prefill, batch, *args, **kwargs)
        return extend() if hook is None else hook.run(extend, lambda draft_input: draft_input)

    def _draft_extend_for_decode(self, batch, batch_result, *args, **kwargs):
        hook = getattr(self, "hsd_root_q", None)
        extend = functools.partial(super()._draft_extend_for_decode, batch, batch_result, *args,
                                   **kwargs)
        if hook is None:
            return extend()
        return hook.run(extend, lambda _: batch_result.next_draft_input)


class HSDDraftWorker(TargetVocabDraft, SampledTreeDraft, EagleDraftWorker):
    """``EagleDraftWorker`` whose draft q always has the target vocabulary's width.

    Instances are not constructed directly: ``HSDWorker`` re-classes the draft worker that
    ``EAGLEWorkerV2.__init__`` builds, so no SGLang constructor code is copied. ``hsd_continuation``
    (a ``DraftContinuation``, set by ``HSDWorker`` for exit sub-rounds) turns on the recording;
    ``hsd_root_q`` (a ``RootQHook``, set by ``HSDWorker`` for sampled trees, with ``hsd_config``,
    the ``PluginConfig`` whose tree rule and draft temperature scale the loop reads) the sampled
    tree loop.
    """

    def alloc_memory_pool(self, memory_pool_config=None, req_to_token_pool=None,
                          token_to_kv_pool_allocator=None):
        # Same steps as EagleDraftWorker.alloc_memory_pool without the reduced-vocabulary
        # refusal; q is scattered to the target vocabulary in draft_forward instead.
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.draft_worker.alloc_memory_pool(
            memory_pool_config=memory_pool_config,
            req_to_token_pool=req_to_token_pool,
            token_to_kv_pool_allocator=token_to_kv_pool_allocator,
        )
        self.init_token_map()
        self.init_lm_head()
        self._hsd_record_vocab()
        # patches/0002 makes the upstream draft_forward read this attribute (and scatter
        # q itself; _hsd_full_vocab then sees the full width and passes it through).
        self.target_vocab_size = self.hsd_target_vocab_size
        draft_vocab = (self.hot_token_id.shape[0] if self.hot_token_id is not None
                       else self.hsd_target_vocab_size)
        if draft_vocab > self.hsd_target_vocab_size:
            raise ValueError(
                f"HSD: draft vocabulary ({draft_vocab}) is larger than the target's "
                f"({self.hsd_target_vocab_size}); the EAGLE-3 head does not match the target"
            )

    def draft_forward(self, forward_batch):
        tree = self._hsd_sampled_tree(forward_batch)
        if tree is not None:
            return tree
        continuation = getattr(self, "hsd_continuation", None)
        if continuation is None or forward_batch.forward_mode.is_idle():
            out = super().draft_forward(forward_batch)
        else:
            out = self._draft_forward_recorded(forward_batch, continuation)
        parents, scores_index, draft_tokens, draft_probs = out
        return parents, scores_index, draft_tokens, self._hsd_full_vocab(draft_probs)

    def _draft_forward_recorded(self, forward_batch, continuation):
        """SGLang's ``draft_forward``, handing ``continuation`` the hidden output of every draft
        entry it runs (exit sub-rounds continue drafting from them)."""
        steps = continuation.begin_round(forward_batch, forward_batch.spec_info.hidden_states,
                                         self.speculative_num_steps)
        runner = self.draft_runner
        forward = runner.forward

        def recording_forward(fb, *args, **kwargs):
            result = forward(fb, *args, **kwargs)
            steps.append(result.logits_output.hidden_states.clone())
            return result

        runner.forward = recording_forward
        try:
            out = super().draft_forward(forward_batch)
        finally:
            del runner.forward
        continuation.end_round(steps)
        return out


class HSDStandaloneDraftWorker(TargetVocabDraft, SampledTreeDraft, StandaloneDraftWorker):
    """SGLang's ``StandaloneDraftWorker`` (a separate draft language model with its own KV cache)
    whose q is checked to have the target vocabulary's width, and which drafts sampled trees as
    the EAGLE-3 draft worker does (``SampledTreeDraft``).

    Re-classed by ``HSDStandaloneWorker`` from the instance ``StandaloneWorkerV2.__init__``
    builds. Drafting, the draft KV cache and its rollback after verification are SGLang's: the
    draft writes its steps into slots the V2 worker allocated for the round (k per step for a
    tree) and re-runs the accepted tokens in its draft-extend pass, whose slots overwrite the
    rejected ones. With ``hsd_catch_up`` (``--hsd-draft-catch-up``) a round that drafts nothing
    skips that pass, and the next drafting round first catches the cache up; a drafting chain
    round extends only the one or two positions its draft steps did not write
    (``--hsd-draft-extend tail``; ``draft_catch_up.py``). With ``hsd_lookup``
    (``--hsd-draft-lookup``) a chain round's draft steps read prompt-lookup copies as well, several
    drafts per forward where the copies match (``draft_lookup.py``).
    """

    hsd_catch_up = None  # a draft_catch_up.DraftCatchUp, set by HSDStandaloneWorker
    hsd_lookup = None  # a draft_lookup.DraftLookup (--hsd-draft-lookup), set by HSDStandaloneWorker

    def draft(self, batch, *args, **kwargs):
        if self.hsd_lookup is not None and not batch.forward_mode.is_idle():
            self.hsd_lookup.begin(batch)  # the lookup copies from the committed tokens
        return super().draft(batch, *args, **kwargs)

    def alloc_memory_pool(self, memory_pool_config=None, req_to_token_pool=None,
                          token_to_kv_pool_allocator=None):
        super().alloc_memory_pool(memory_pool_config, req_to_token_pool,
                                  token_to_kv_pool_allocator)
        self._hsd_record_vocab()

    def _draft_extend_for_prefill(self, batch, target_hidden_states, next_token_ids, *args,
                                  **kwargs):
        if self.hsd_catch_up is not None and not batch.forward_mode.is_idle():
            return self.hsd_catch_up.defer_prefill(batch, next_token_ids,
                                                   self.hsd_target_vocab_size)
        return super()._draft_extend_for_prefill(batch, target_hidden_states, next_token_ids,
                                                 *args, **kwargs)

    def _draft_extend_for_decode(self, batch, batch_result, *args, **kwargs):
        catch_up = self.hsd_catch_up
        if catch_up is not None and catch_up.skip_extend(batch, batch_result):
            return None
        if catch_up is not None and catch_up.extend_tail(self, batch, batch_result):
            return None
        if catch_up is not None:  # before the extend, which may move the batch's lengths
            catch_up.mark_extended(batch, batch_result.accept_lens)
        with self._kept_logit_rows(batch, batch_result):
            return super()._draft_extend_for_decode(batch, batch_result, *args, **kwargs)

    def _kept_logit_rows(self, batch, batch_result):
        """On CPU (eager draft extend), the draft LM head computes only the rows SGLang's
        ``_draft_extend_for_decode`` keeps: request b's last accepted position,
        ``b * num_draft_tokens + accept_lens[b] - 1`` (its ``select_index``), one row per request
        instead of the whole verified window (``cpu.linear_path.only_logit_rows``)."""
        if str(self.device) != "cpu" or batch.forward_mode.is_idle():
            return contextlib.nullcontext()
        width = self.speculative_num_draft_tokens
        size = int(batch.seq_lens.shape[0])
        prepared = batch_result.prepared_draft_extend_inputs
        if prepared is not None:
            index = prepared[1]
        else:
            index = torch.arange(0, size * width, width) + batch_result.accept_lens - 1
        return only_logit_rows(self.draft_runner.model.lm_head,
                               LogitRows(index.to(torch.int64), size * width))

    def draft_forward(self, forward_batch):
        if self.hsd_catch_up is not None:
            self.hsd_catch_up.run(self, forward_batch)
        tree = self._hsd_sampled_tree(forward_batch)
        if tree is not None:
            return tree
        if self._hsd_lookup_round(forward_batch):
            out = self.hsd_lookup.draft(self, forward_batch)
        else:
            out = super().draft_forward(forward_batch)
        parents, scores_index, draft_tokens, draft_probs = out
        return parents, scores_index, draft_tokens, self._hsd_full_vocab(draft_probs)

    def _hsd_lookup_round(self, forward_batch) -> bool:
        """Whether this round's chain is drafted with the lookup level (``draft_lookup.py``): a
        chain of at least two drafts (one draft needs no forward) of a batch SGLang's
        preallocated chain topology covers."""
        return (self.hsd_lookup is not None and not forward_batch.forward_mode.is_idle()
                and self.topk == 1 and self.speculative_num_steps > 1
                and forward_batch.batch_size <= self._topk1_parents_prealloc.shape[0])
