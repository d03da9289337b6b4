"""The HSD speculative worker: SGLang's EAGLE-3 V2 worker with HSD's verifier behind it.

SGLang builds its draft worker from what ``HSDSpecAlgo.create_worker`` returns: ``hsd_worker``
reads the ``--hsd-*`` configuration there, once per scheduler process, and passes it in.
``HSDWorker`` hands it on to what runs during verification:

* the verify hooks (``verify_hook.py``), installed bound to this worker's ``VerifyHookState``;
* with ``--hsd-exit-layer``, an ``ExitLevelVerifier`` (``exit_level.py``) that runs an
  intermediate early-exit level in every verify round;
* the draft worker SGLang built, re-classed to ``HSDDraftWorker`` (``draft_worker.py``: draft q
  on the target vocabulary) and, with exit sub-rounds, given a ``DraftContinuation``.

This module subclasses SGLang at import: ``spec_algo.py`` imports it only when SGLang builds the
HSD worker (after ``register()`` checked every signature).
"""

from __future__ import annotations

import functools
import logging
import time

from sglang.srt.speculative import eagle_worker_common
from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2, EagleDraftWorker

from sglang_hsd.sglang_plugin.config import ExitLevelConfig, ExitLevelConfigError, PluginConfig
from sglang_hsd.sglang_plugin.draft_continuation import DraftContinuation
from sglang_hsd.sglang_plugin.draft_kind import MODEL, current_draft_kind
from sglang_hsd.sglang_plugin.draft_worker import HSDDraftWorker
from sglang_hsd.sglang_plugin.exit_head import ExitHead, load_exit_map
from sglang_hsd.sglang_plugin.exit_level import ExitLevelTarget, ExitLevelVerifier
from sglang_hsd.sglang_plugin.layer_range import check_layer_range_model
from sglang_hsd.sglang_plugin.worker_setup import adopt_draft_worker, install_hsd_hooks

logger = logging.getLogger(__name__)


def hsd_worker(server_args):
    """The worker SGLang builds for ``--speculative-algorithm HSD``: ``HSDWorker`` with the
    ``--hsd-*`` configuration read now, so bad options are refused before any model loads.

    SGLang calls the result with its four worker arguments (server_args, gpu_id, nccl_port,
    target_worker).
    """
    plugin_config = PluginConfig.from_env(server_args.speculative_eagle_topk or 1)
    # The exit level verifies chains; trees refuse it (server_args), so its default rule is only
    # inherited from a chain configuration.
    exit_config = (ExitLevelConfig.from_env() if plugin_config.is_tree
                   else ExitLevelConfig.from_env(plugin_config.verify_method))
    if current_draft_kind() == MODEL:
        from sglang_hsd.sglang_plugin.standalone_worker import HSDStandaloneWorker

        if exit_config.enabled:
            raise ExitLevelConfigError(
                "--hsd-exit-layer / --hsd-plan with --hsd-draft-kind model: the exit level is "
                "wired to the EAGLE-3 worker only")
        return functools.partial(HSDStandaloneWorker, plugin_config=plugin_config)
    return functools.partial(HSDWorker, plugin_config=plugin_config, exit_config=exit_config)


class HSDWorker(EAGLEWorkerV2):
    """EAGLE-3 V2 worker for ``--speculative-algorithm HSD`` (verification: verify_hook;
    with ``--hsd-exit-layer``, an early-exit level in every verify round: exit_level).

    Args (besides SGLang's four):
        plugin_config: the target level's chain verifier (``PluginConfig``).
        exit_config: the exit level (``ExitLevelConfig``; disabled without an exit layer).
    """

    def __init__(self, server_args, gpu_id, nccl_port, target_worker, *,
                 plugin_config: PluginConfig, exit_config: ExitLevelConfig):
        self.hsd_hooks = install_hsd_hooks(plugin_config)
        super().__init__(server_args, gpu_id, nccl_port, target_worker)
        self.hsd_exit = build_exit_verifier(target_worker, plugin_config, exit_config)
        self._adopt_draft_worker(target_worker)

    def _adopt_draft_worker(self, target_worker) -> None:
        """Re-class the draft worker as ``HSDDraftWorker`` and, with exit sub-rounds, give it the
        ``DraftContinuation`` the exit level drafts with."""
        draft = adopt_draft_worker(self, EagleDraftWorker, HSDDraftWorker)
        if draft is None:
            return
        if self.hsd_hooks.config.is_tree and self.hsd_hooks.config.tree_draft == "sampled":
            from sglang.srt.speculative import eagle_worker_v2

            from sglang_hsd.sglang_plugin.tree_draft import RootQHook

            draft.hsd_config = self.hsd_hooks.config
            draft.hsd_root_q = RootQHook(draft.hsd_config.draft_temperature_scale)
            draft.hsd_root_q.install(eagle_worker_v2)
        if self.hsd_exit is not None and self.hsd_exit.buffer > 1:
            draft.hsd_continuation = DraftContinuation(draft, target_worker.model_config.vocab_size)
            self.hsd_exit.drafter = draft.hsd_continuation

    def verify(self, batch, pp_proxy_tensors=None, grammar_barrier=None):
        if (self.hsd_exit is None or batch.forward_mode.is_idle() or batch.has_grammar
                or pp_proxy_tensors is not None):
            # Grammar-constrained batches keep the two-level round: SGLang builds their
            # grammar tree from the drafts before the target forward.
            tree = getattr(self._draft_worker, "hsd_tree", None)
            with self.hsd_hooks.verify_call(tree=tree):
                return super().verify(batch, pp_proxy_tensors=pp_proxy_tensors,
                                      grammar_barrier=grammar_barrier)
        return self._verify_with_exit_level(batch, grammar_barrier)

    def _verify_with_exit_level(self, batch, grammar_barrier):
        """The same call as ``EAGLEWorkerV2.verify`` with the exit level standing in for the
        target worker; the round it leaves for the chain sampler lives only for this call."""
        target = ExitLevelTarget(self.target_worker, self.hsd_exit, self.hsd_hooks,
                                 batch.spec_info, batch.sampling_info, getattr(batch, "reqs", None))
        started = time.perf_counter()
        try:
            with self.hsd_hooks.verify_call():
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
            seconds = self.hsd_exit.stats.seconds
            seconds["verify_total"] = seconds.get("verify_total", 0.0) + (
                time.perf_counter() - started)


def build_exit_verifier(target_worker, plugin_config: PluginConfig,
                        exit_config: ExitLevelConfig) -> ExitLevelVerifier | None:
    """The ``ExitLevelVerifier`` for the configured exit layer, or None without one.

    Raises ``ExitLevelConfigError`` (naming the flag) for an exit layer outside the model, a heads
    folder without that layer, or an unsupported setting (tensor parallelism, CUDA graphs).
    """
    if not exit_config.enabled:
        return None
    runner = target_worker.model_runner
    check_exit_level_supported(exit_config, runner)
    vocab = runner.model_config.vocab_size
    hidden = runner.model_config.hidden_size
    A = b = None
    if exit_config.heads_dir is not None:
        A, b = load_exit_map(exit_config.heads_dir, exit_config.layer, hidden)
    head = ExitHead(runner.model, vocab, A, b)
    logger.info("sglang-hsd: exit level at layer %d of %d (%s), methods exit=%s target=%s, "
                "buffer %d", exit_config.layer, len(runner.model.model.layers),
                exit_config.heads_dir or "logit lens", exit_config.method,
                plugin_config.verify_method, exit_config.buffer)
    return ExitLevelVerifier(target_worker, exit_config.layer, head, exit_config.method,
                             plugin_config.verify_method, check_split=exit_config.check_split,
                             validate=plugin_config.validate, buffer=exit_config.buffer)


def check_exit_level_supported(exit_config: ExitLevelConfig, runner) -> None:
    """Raise ``ExitLevelConfigError`` unless the target model, the verify window and the
    parallel / CUDA-graph settings of ``runner`` (SGLang's target ``ModelRunner``) allow it."""
    from sglang.srt.runtime_context import get_parallel, get_spec

    exit_config.check_depth(check_layer_range_model(runner.model))
    exit_config.check_window(get_spec().speculative_num_draft_tokens)
    parallel = get_parallel()
    if parallel.tp_size > 1 or parallel.dp_size > 1:
        raise ExitLevelConfigError("--hsd-exit-layer: tensor / data parallelism (--tp-size, "
                                   "--dp-size > 1) is not supported by the exit level yet (its "
                                   "exit logits are not gathered across ranks); remove one of them")
    if getattr(runner, "decode_cuda_graph_runner", None) is not None:
        raise ExitLevelConfigError("--hsd-exit-layer: the exit level runs its forwards eagerly; "
                                   "add --disable-cuda-graph")
