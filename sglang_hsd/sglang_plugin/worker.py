"""The HSD speculative worker: SGLang's EAGLE-3 V2 worker with full-vocabulary draft q.

EAGLE-3 heads usually predict over a reduced draft vocabulary. SGLang samples the draft from
q = softmax(draft_logits / T) over that vocabulary and maps each sampled draft id to a target id
with the head's ``d2t`` offsets (``hot_token_id = arange(Vd) + d2t``), but it refuses rejection
sampling in that case (``EagleDraftWorker.alloc_memory_pool``, upstream FIXME) because q has the
wrong width for the verifier. ``HSDDraftWorker`` lifts the refusal and scatters q into the target
vocabulary (``scatter_draft_probs``) before verification; target ids outside the draft vocabulary
get q = 0, which is exactly the distribution the mapped draft token was drawn from.
"""

from __future__ import annotations

import logging
import time

import torch

logger = logging.getLogger(__name__)


def scatter_draft_probs(draft_probs: torch.Tensor, hot_token_id: torch.Tensor,
                        target_vocab_size: int) -> torch.Tensor:
    """Scatter q from the draft vocabulary into the target vocabulary.

    Args:
        draft_probs: float [..., Vd], rows of q over draft ids.
        hot_token_id: int [Vd], target id of each draft id (draft_id + d2t[draft_id]); distinct.
        target_vocab_size: Vt >= Vd.
    Returns:
        float [..., Vt] with ``out[..., hot_token_id[d]] = draft_probs[..., d]`` and 0 elsewhere.
    """
    if draft_probs.shape[-1] == target_vocab_size:
        return draft_probs
    out = draft_probs.new_zeros(*draft_probs.shape[:-1], target_vocab_size)
    index = hot_token_id.to(device=draft_probs.device, dtype=torch.int64)
    return out.index_copy_(-1, index, draft_probs)


def build_worker_classes():
    """Create the worker classes (SGLang is imported here, lazily)."""
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2, EagleDraftWorker

    class HSDDraftWorker(EagleDraftWorker):
        """``EagleDraftWorker`` whose draft q always has the target vocabulary's width.

        Instances are not constructed directly: ``HSDWorker`` re-classes the draft worker that
        ``EAGLEWorkerV2.__init__`` builds, so no SGLang constructor code is copied.
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
            self.hsd_target_vocab_size = self.target_worker.model_config.vocab_size
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

        def _hsd_full_vocab(self, draft_probs):
            if draft_probs is None or self.hot_token_id is None:
                return draft_probs
            return scatter_draft_probs(draft_probs, self.hot_token_id, self.hsd_target_vocab_size)

        def draft_forward(self, forward_batch):
            continuation = getattr(self, "hsd_continuation", None)
            if continuation is None or forward_batch.forward_mode.is_idle():
                out = super().draft_forward(forward_batch)
            else:  # record every draft entry's hidden output for exit sub-rounds
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
            parents, scores_index, draft_tokens, draft_probs = out
            return parents, scores_index, draft_tokens, self._hsd_full_vocab(draft_probs)

        def init_cuda_graphs(self):
            super().init_cuda_graphs()
            runner = getattr(self, "cuda_graph_runner", None)
            if runner is not None:  # the graph path returns q from the captured draft_forward
                execute = runner.execute

                def execute_full_vocab(forward_batch, *args, **kwargs):
                    out = execute(forward_batch, *args, **kwargs)
                    return (*out[:3], self._hsd_full_vocab(out[3]))

                runner.execute = execute_full_vocab

    class HSDWorker(EAGLEWorkerV2):
        """EAGLE-3 V2 worker for ``--speculative-algorithm HSD`` (verification: verify_hook;
        with ``--hsd-exit-layer``, an early-exit level in every verify round: exit_level)."""

        def __init__(self, server_args, gpu_id, nccl_port, target_worker):
            super().__init__(server_args, gpu_id, nccl_port, target_worker)
            self.hsd_exit = build_exit_verifier(target_worker)
            draft = getattr(self, "_draft_worker", "missing")
            if draft == "missing":
                raise RuntimeError(
                    "HSD: EAGLEWorkerV2 no longer keeps its draft worker in `_draft_worker`; "
                    "sglang-hsd supports sglang==0.5.23"
                )
            if draft is not None:  # None on non-last pipeline stages
                if type(draft) is not EagleDraftWorker:
                    raise RuntimeError(
                        f"HSD: expected an EagleDraftWorker, got {type(draft).__name__}"
                    )
                draft.__class__ = HSDDraftWorker
                if self.hsd_exit is not None and self.hsd_exit.buffer > 1:
                    from sglang_hsd.sglang_plugin.draft_continuation import DraftContinuation

                    draft.hsd_continuation = DraftContinuation(
                        draft, target_worker.model_config.vocab_size)
                    self.hsd_exit.drafter = draft.hsd_continuation

        def verify(self, batch, pp_proxy_tensors=None, grammar_barrier=None):
            if (self.hsd_exit is None or batch.forward_mode.is_idle() or batch.has_grammar
                    or pp_proxy_tensors is not None):
                # Grammar-constrained batches keep the two-level round: SGLang builds their
                # grammar tree from the drafts before the target forward.
                return super().verify(batch, pp_proxy_tensors=pp_proxy_tensors,
                                      grammar_barrier=grammar_barrier)
            from sglang.srt.speculative import eagle_worker_common

            from sglang_hsd.sglang_plugin.exit_level import ExitLevelTarget, clear_pending

            target = ExitLevelTarget(self.target_worker, self.hsd_exit, batch.spec_info,
                                     batch.sampling_info, getattr(batch, "reqs", None))
            started = time.perf_counter()
            try:  # the same call as EAGLEWorkerV2.verify, with the exit level as the target
                return eagle_worker_common.run_eagle_verify(
                    batch, pp_proxy_tensors=None, target_worker=target,
                    req_to_token_pool=self.req_to_token_pool,
                    token_to_kv_pool_allocator=self.token_to_kv_pool_allocator,
                    plan_stream=self.plan_stream, plan_stream_ctx=self.plan_stream_ctx,
                    topk=self.topk, num_draft_tokens=self.speculative_num_draft_tokens,
                    device=self.device, metadata_ready_pre_pad=False, finalize_tree_path=True,
                    grammar_barrier=grammar_barrier,
                )
            finally:
                clear_pending()
                seconds = self.hsd_exit.stats.seconds
                seconds["verify_total"] = seconds.get("verify_total", 0.0) + (
                    time.perf_counter() - started)

    return HSDWorker, HSDDraftWorker


def build_exit_verifier(target_worker):
    """The ``ExitLevelVerifier`` for the configured exit layer, or None without one.

    Raises ``ExitLevelConfigError`` (naming the flag) for an exit layer outside the model, a heads
    folder without that layer, or an unsupported setting (tensor parallelism, CUDA graphs).
    """
    from sglang_hsd.sglang_plugin.config import ExitLevelConfig, ExitLevelConfigError, PluginConfig
    from sglang_hsd.sglang_plugin.exit_head import ExitHead, load_exit_map
    from sglang_hsd.sglang_plugin.exit_level import ExitLevelVerifier
    from sglang_hsd.sglang_plugin.layer_range import check_layer_range_model

    plugin = PluginConfig.from_env()
    config = ExitLevelConfig.from_env(plugin.verify_method)
    if not config.enabled:
        return None
    runner = target_worker.model_runner
    config.check_depth(check_layer_range_model(runner.model))
    from sglang.srt.runtime_context import get_parallel, get_spec

    config.check_window(get_spec().speculative_num_draft_tokens)
    parallel = get_parallel()
    if parallel.tp_size > 1 or parallel.dp_size > 1:
        raise ExitLevelConfigError("--hsd-exit-layer: tensor / data parallelism (--tp-size, "
                                   "--dp-size > 1) is not supported by the exit level yet (its "
                                   "exit logits are not gathered across ranks); remove one of them")
    if getattr(runner, "decode_cuda_graph_runner", None) is not None:
        raise ExitLevelConfigError("--hsd-exit-layer: the exit level runs its forwards eagerly; "
                                   "add --disable-cuda-graph")
    vocab = runner.model_config.vocab_size
    hidden = runner.model_config.hidden_size
    A = b = None
    if config.heads_dir is not None:
        A, b = load_exit_map(config.heads_dir, config.layer, hidden)
    head = ExitHead(runner.model, vocab, A, b)
    logger.info("sglang-hsd: exit level at layer %d of %d (%s), methods exit=%s target=%s, "
                "buffer %d", config.layer, len(runner.model.model.layers),
                config.heads_dir or "logit lens", config.method, plugin.verify_method,
                config.buffer)
    return ExitLevelVerifier(target_worker, config.layer, head, config.method,
                             plugin.verify_method, check_split=config.check_split,
                             validate=plugin.validate, buffer=config.buffer)
