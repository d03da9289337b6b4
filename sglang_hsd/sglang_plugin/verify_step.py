"""The verify step every HSD speculative worker shares (``worker.HSDWorker`` on SGLang's EAGLE-3 V2
worker, ``standalone_worker.HSDStandaloneWorker`` on its STANDALONE V2 worker): ``HSDVerify``
runs SGLang's verify under the verify hooks' call scope, or, with an early-exit level, through
``ExitLevelTarget``; ``build_exit_verifier`` builds that level from its configuration.

This module imports SGLang at import: only the two worker modules import it, once SGLang builds
the HSD worker (after ``register()`` checked every signature).
"""

from __future__ import annotations

import logging
import time

import torch
from sglang.srt.speculative import eagle_worker_common

from sglang_hsd.sglang_plugin.adaptive_setting import AdaptiveSetting
from sglang_hsd.sglang_plugin.adaptive_spec import install_adaptive
from sglang_hsd.sglang_plugin.config import ExitLevelConfig, ExitLevelConfigError, PluginConfig
from sglang_hsd.sglang_plugin.exit_head import ExitHead, load_exit_map
from sglang_hsd.sglang_plugin.exit_level import ExitLevelTarget, ExitLevelVerifier
from sglang_hsd.sglang_plugin.layer_range import check_layer_range_model

logger = logging.getLogger(__name__)


class HSDVerify:
    """Mixin for SGLang's V2 speculative workers (EAGLE-3, STANDALONE): ``verify`` runs under
    the verify hooks' call scope with the round's sampled tree, and with an exit level
    (``hsd_exit``, an ``ExitLevelVerifier`` or None) through ``ExitLevelTarget`` standing in for
    the target worker. Needs ``hsd_hooks`` and ``hsd_exit`` set by the worker's ``__init__``.
    """

    def forward_batch_generation(self, batch, *args, **kwargs):
        """SGLang's round; with ``--hsd-adaptive`` (``hsd_adaptive``, an
        ``adaptive_spec.AdaptiveRounds``) a decode round's draft length is chosen first (SGLang's
        adaptive controller then activates it) and the round is timed; with ``hsd_catch_up`` (a
        ``draft_catch_up.DraftCatchUp``) a round of length 0 skips the draft extend and a later
        one catches the draft cache up, a cost the controller weighs before choosing."""
        rounds = getattr(self, "hsd_adaptive", None)
        if rounds is None:
            return super().forward_batch_generation(batch, *args, **kwargs)
        if not batch.forward_mode.is_decode() or not batch.reqs:
            rounds.interrupt()
            return super().forward_batch_generation(batch, *args, **kwargs)
        catch_up = getattr(self, "hsd_catch_up", None)
        owed = (0.0, 0.0) if catch_up is None else catch_up.pending_seconds(batch)
        length = rounds.begin(batch.reqs, *owed)
        caught_up = 0.0
        if catch_up is not None:
            catch_up.begin_round(batch, length)
            caught_up = catch_up.seconds
        try:
            return super().forward_batch_generation(batch, *args, **kwargs)
        finally:
            rounds.end(excluded=catch_up.seconds - caught_up if catch_up is not None else 0.0)
            if catch_up is not None:
                catch_up.end_round()

    def build_adaptive_runtime_state(self, speculative_num_steps, speculative_num_draft_tokens,
                                     cuda_graph_bs=None):
        """SGLang's runtime state of ``speculative_num_steps``; for a tree under
        ``--hsd-adaptive`` (``hsd_tree_budgets``) with the node count of that depth's budget
        instead of the chain's ``steps + 1`` SGLang's ``AdaptiveController.init_states`` asks for."""
        budgets = getattr(self, "hsd_tree_budgets", None)
        if budgets is not None and speculative_num_steps > 0:
            speculative_num_draft_tokens = budgets[speculative_num_steps].num_draft_tokens
        return super().build_adaptive_runtime_state(speculative_num_steps, speculative_num_draft_tokens,
                                                    cuda_graph_bs=cuda_graph_bs)

    def _build_trivial_verify_input(self, batch):
        """SGLang's one-node verify input of a round that drafts nothing (``--hsd-adaptive``
        chose 0), with an all-zero draft q ``[bs, 1, V]``: SGLang's sampler requires a q of the
        target's width, and the chain verifier reads no row of it for an empty chain (the token
        is drawn from the target's p)."""
        verify_input = super()._build_trivial_verify_input(batch)
        if getattr(verify_input, "draft_probs", None) is None and not batch.forward_mode.is_idle():
            vocab = self.target_worker.model_config.vocab_size
            verify_input.draft_probs = torch.zeros(batch.seq_lens.shape[0], 1, vocab,
                                                   dtype=torch.float32, device=self.device)
        return verify_input

    def verify(self, batch, pp_proxy_tensors=None, grammar_barrier=None):
        if (self.hsd_exit is None or batch.forward_mode.is_idle() or batch.has_grammar
                or pp_proxy_tensors is not None):
            # Grammar-constrained batches keep the two-level round: SGLang builds their
            # grammar tree from the drafts before the target forward.
            # A round of budget 0 (``--hsd-adaptive``) drafted no tree: the last one is stale.
            tree = (getattr(self._draft_worker, "hsd_tree", None)
                    if self.speculative_num_steps > 0 else None)
            with self.hsd_hooks.verify_call(batch.sampling_info, tree=tree):
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
            with self.hsd_hooks.verify_call(batch.sampling_info):
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


def build_adaptive(worker, plugin_config: PluginConfig):
    """``--hsd-adaptive`` for ``worker`` (after SGLang's ``__init__``, ``hsd_exit`` set): an
    ``adaptive_spec.AdaptiveRounds`` or None (off, or trees / an exit level)."""
    return install_adaptive(worker, AdaptiveSetting.from_env(), plugin_config.topk,
                            exit_layer=worker.hsd_exit is not None, tree_rule=plugin_config.tree_rule)


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
