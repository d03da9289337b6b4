"""Signature checks for every SGLang symbol the plugin subclasses, wraps or replaces (and the
functions whose keyword arguments it relies on).

The plugin is written against SGLang 0.5.23. Before touching a symbol it compares the symbol's
parameters (names and kinds) with the ones recorded here and refuses with ``SGLangSignatureError``
naming the symbol, the expected and the found signature. A silent drift would otherwise surface
as a wrong keyword deep inside a scheduler process, or worse, as a verifier that never runs.
"""

from __future__ import annotations

import importlib
import inspect

# Expected parameter lists, written the way ``inspect.signature`` prints them.
EXPECTED_SIGNATURES: dict[str, str] = {
    "sglang.srt.speculative.spec_info.SpeculativeAlgorithm.register":
        "(name, *, supports_overlap=False, validate_server_args=None, spec_class=CustomSpecAlgo)",
    "sglang.srt.speculative.spec_registry.CustomSpecAlgo.__init__":
        "(self, name, factory, *, supports_overlap=False, validate_server_args=None)",
    "sglang.srt.speculative.spec_registry.CustomSpecAlgo.handle_server_args":
        "(self, server_args)",
    "sglang.srt.speculative.spec_registry.CustomSpecAlgo.create_worker":
        "(self, server_args)",
    "sglang.srt.speculative.spec_info.SpeculativeAlgorithm.create_future_map":
        "(self, device, req_to_token_pool, needs_cpu_seq_lens=True, needs_confidence_relay=False)",
    "sglang.srt.speculative.spec_info.SpeculativeAlgorithm.build_disagg_draft_input":
        "(self, batch, last_tokens_tensor, future_map)",
    # The predicates HSDSpecAlgo overrides (spec_algo.py).
    **{f"sglang.srt.speculative.spec_info.SpeculativeAlgorithm.{name}": "(self)" for name in (
        "is_eagle", "is_eagle3", "supports_grammar_overlap", "has_draft_kv", "need_topk",
        "carries_draft_hidden_states", "get_platform_worker_cls")},
    "sglang.srt.speculative.eagle_utils.chain_speculative_sampling_triton":
        "(predicts, accept_index, accept_token_num, candidates, retrive_index, "
        "retrive_next_token, retrive_next_sibling, uniform_samples, "
        "uniform_samples_for_final_sampling, target_probs, draft_probs, threshold_single, "
        "threshold_acc, deterministic, *, block_verification=False)",
    "sglang.srt.speculative.eagle_utils._verify_uses_greedy":
        "(*, is_all_greedy, is_cpu, is_hip, is_xpu, use_rejection_sampling)",
    "sglang.srt.speculative.eagle_utils.eagle_sample":
        "(verify_input, batch, logits_output, grammar_mask=None, uno_target_max_top_k=None, *, "
        "watermark_state=None, watermark_full_mask=True)",
    # The name run_eagle_verify calls (verify_hook.make_verify_entry replaces it).
    "sglang.srt.speculative.eagle_worker_common.eagle_sample":
        "(verify_input, batch, logits_output, grammar_mask=None, uno_target_max_top_k=None, *, "
        "watermark_state=None, watermark_full_mask=True)",
    "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.__init__":
        "(self, server_args, gpu_id, nccl_port, target_worker)",
    "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker.alloc_memory_pool":
        "(self, memory_pool_config=None, req_to_token_pool=None, token_to_kv_pool_allocator=None)",
    "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker.draft_forward":
        "(self, forward_batch)",
    "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker.draft":
        "(self, batch, *, with_topology=False)",
    "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker.init_cuda_graphs":
        "(self)",
    "sglang.srt.speculative.standalone_worker_v2.StandaloneWorkerV2.__init__":
        "(self, server_args, gpu_id, nccl_port, target_worker)",
    "sglang.srt.speculative.standalone_worker_v2.StandaloneDraftWorker.alloc_memory_pool":
        "(self, memory_pool_config=None, req_to_token_pool=None, token_to_kv_pool_allocator=None)",
    "sglang.srt.speculative.eagle_draft_cuda_graph_runner.EAGLEDraftCudaGraphRunner.execute":
        "(self, forward_batch)",
    # Sampled trees under the draft graph (tree_graph.py): the runner class the capture looks up
    # in eagle_worker_v2, its constructor and the slicing of padded outputs it overrides.
    "sglang.srt.speculative.eagle_worker_v2.EAGLEDraftCudaGraphRunner.__init__":
        "(self, eagle_worker, *, draft_attn_backend=None, speculative_num_steps=None)",
    "sglang.srt.speculative.eagle_draft_cuda_graph_runner.EAGLEDraftCudaGraphRunner"
    "._postprocess_output_to_raw_bs": "(self, out, raw_bs)",
    "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker._capture_cuda_graphs": "(self)",
    # --hsd-request-seeds (request_seeds.py).
    "sglang.srt.sampling.sampling_batch_info.SamplingBatchInfo.from_schedule_batch":
        "(batch, vocab_size)",
    "sglang.srt.managers.schedule_batch.ScheduleBatch.merge_batch": "(self, other)",
    "sglang.srt.managers.schedule_batch.ScheduleBatch.filter_batch":
        "(self, reqs_to_exclude=None, keep_indices=None)",
    "sglang.srt.layers.sampler.top_k_top_p_min_p_sampling_from_probs_torch":
        "(probs, top_ks, top_ps, min_ps, need_min_p_sampling, sampling_seed, positions, *, "
        "return_filtered_probs=False, max_top_k=None)",
    "sglang.srt.speculative.spec_utils.sample_draft_proposal":
        "(next_token_logits, temperatures, top_ks=None, *, sampling_seed=None, positions=None, "
        "draft_step=0)",
    "sglang.srt.speculative.spec_utils.row_argmax": "(x)",
    "sglang.srt.speculative.spec_utils.fast_sample":
        "(probs, num_samples=1, *, sampling_seed=None, positions=None, draft_step=0)",
    "sglang.srt.speculative.spec_utils._select_top_k_tokens_later":
        "(i, topk_p, topk_index, hidden_states, scores, topk)",
    "sglang.srt.sampling.penaltylib.repetition_penalty.apply_scaling_penalties":
        "(logits, scaling_penalties)",
    "sglang.srt.sampling.sampling_batch_info.apply_scaling_penalties":
        "(logits, scaling_penalties)",
    "sglang.srt.server_args.ServerArgs.add_cli_args": "(parser)",
    # Requests' token ids checked (request_validation.py).
    "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request":
        "(self, obj, input_ids)",
    "sglang.srt.managers.scheduler_components.internal_state.SchedulerInternalStateController"
    "._add_speculative": "(self, state)",
    "sglang.srt.speculative.eagle_worker_common.run_eagle_verify":
        "(batch, *, target_worker, req_to_token_pool, token_to_kv_pool_allocator, plan_stream, "
        "plan_stream_ctx, topk, num_draft_tokens, device, metadata_ready_pre_pad, "
        "finalize_tree_path, pp_proxy_tensors=None, grammar_barrier=None, "
        "uno_target_max_top_k=None)",
    "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.verify":
        "(self, batch, pp_proxy_tensors=None, grammar_barrier=None)",
    "sglang.srt.managers.tp_worker.TpModelWorker.forward_batch_generation":
        "(self, batch, forward_batch=None, pp_proxy_tensors=None, is_verify=False, "
        "skip_attn_backend_init=None, *, capture_hidden_mode=None, return_kv_loc_plan=False)",
    "sglang.srt.layers.layer_boundary.residual.batch.export_replay_handoff":
        "(hidden_states, forward_batch)",
    "sglang.srt.layers.layer_boundary.residual.batch.import_replay_handoff":
        "(handoff, forward_batch, *, update_context=None)",
    "sglang.srt.layers.layer_boundary.residual.batch.final_norm":
        "(hidden_states, forward_batch, layernorm, capture=None, *, finalize_norm=None, "
        "skip_empty=False, **read_kwargs)",
    "sglang.srt.layers.logits_processor.LogitsProcessor._compute_lm_head":
        "(self, hidden_states, lm_head, embedding_bias=None, *, out=None)",
    # The CPU linear path (cpu/linear_path.py, --hsd-cpu-linear onednn-packed).
    "sglang.srt.model_executor.model_runner.ModelRunner.load_model": "(self)",
    "sglang.srt.layers.quantization.unquant.UnquantizedLinearMethod.apply":
        "(self, layer, x, bias=None)",
    "sglang.srt.model_executor.model_runner_components.weight_updater.WeightUpdater"
    ".update_weights_from_disk":
        "(self, model_path, load_format, weight_name_filter=None, recapture_cuda_graph=False)",
    "sglang.srt.model_executor.model_runner_components.weight_updater.WeightUpdater"
    ".update_weights_from_tensor": "(self, named_tensors, load_format=None)",
    "sglang.srt.model_executor.model_runner_components.weight_updater.WeightUpdater"
    ".update_weights_from_ipc": "(self, recv_req)",
    "sglang.srt.model_executor.model_runner_components.weight_updater.WeightUpdater"
    ".load_weights_from_distributed": "(self, named_tensors)",
    "sglang.srt.speculative.eagle_utils._seeded_verify_coins":
        "(*, sampling_seed, seq_lens, draft_token_num, device)",
    # Draft trees (tree_draft.py, draft_worker.py).
    "sglang.srt.speculative.eagle_worker_v2.renorm_draft_probs":
        "(next_token_logits, sampling_info, use_rejection_sampling)",
    "sglang.srt.speculative.eagle_utils.per_step_draft_out_cache_loc":
        "(out_cache_loc, batch_size, topk, num_steps)",
    "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker._draft_extend_for_prefill":
        "(self, batch, target_hidden_states, next_token_ids, mm_input_embeds=None, "
        "kv_loc_plan=None)",
    "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker._draft_extend_for_decode":
        "(self, batch, batch_result, *, kv_loc_plan=None)",
    # The adaptive budgets reported once per request (adaptive_spec.install_request_level_key).
    "sglang.srt.managers.scheduler_components.output_streamer.SchedulerOutputStreamer"
    ".is_request_level_customized_info_key": "(self, key)",
}

# SGLang names the plugin replaces that have no SGLang code to pin: on CPU SGLang 0.5.23 leaves
# them None (their kernels come from sgl_kernel or FlashInfer, absent there), and the plugin puts
# torch versions in their place (path -> where). The sgl_kernel ops of
# ``cpu/kernel_ops.SGL_KERNEL_CPU_OPS`` are the other such stand-ins.
STAND_INS: dict[str, str] = {
    "sglang.srt.speculative.eagle_utils.top_k_renorm_prob":
        "runtime_patches (cpu_sampling), then verify_hook.make_deferred_renorm",
    "sglang.srt.speculative.eagle_utils.top_p_renorm_prob":
        "runtime_patches (cpu_sampling), then verify_hook.make_deferred_renorm",
    "sglang.srt.speculative.eagle_utils.tree_speculative_sampling_target_only":
        "verify_hook.make_hsd_tree_sampling (SGLang's kernel where it exists)",
}


class SGLangSignatureError(RuntimeError):
    """An SGLang symbol the plugin relies on changed shape."""


def resolve_symbol(path: str):
    """Import ``a.b.module.Class.attr`` and return the object (functions unwrapped)."""
    parts = path.split(".")
    for split in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attr in parts[split:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(path)


def _shape(sig: inspect.Signature) -> list[tuple[str, str]]:
    return [(p.name, p.kind.name) for p in sig.parameters.values()]


def _parse_expected(expected: str) -> list[tuple[str, str]]:
    # Evaluate the recorded text as a real signature; defaults are irrelevant, keep names/kinds.
    params = expected.strip()[1:-1]
    cleaned = []
    for chunk in [c.strip() for c in params.split(",") if c.strip()]:
        cleaned.append(chunk.split("=")[0].strip())
    namespace: dict = {}
    exec(f"def _f({', '.join(cleaned)}): pass", namespace)  # noqa: S102 - constant text above
    return _shape(inspect.signature(namespace["_f"]))


def check_signature(path: str, obj=None, expected: str | None = None) -> None:
    """Raise ``SGLangSignatureError`` unless ``path`` has the recorded parameter names/kinds."""
    expected = expected or EXPECTED_SIGNATURES[path]
    if obj is None:
        try:
            obj = resolve_symbol(path)
        except (ImportError, AttributeError) as exc:
            raise SGLangSignatureError(
                f"sglang-hsd needs SGLang symbol {path} with signature {expected}, but it does "
                f"not exist in the installed SGLang ({exc!r}). sglang-hsd supports sglang==0.5.23."
            ) from exc
    obj = inspect.unwrap(getattr(obj, "__sglang_hsd_original__", obj))
    found = inspect.signature(obj)
    if _shape(found) != _parse_expected(expected):
        raise SGLangSignatureError(
            f"SGLang symbol {path} changed: sglang-hsd expects {path.rsplit('.', 1)[-1]}"
            f"{expected} but found {found}. The HSD plugin refuses to patch it; "
            "use sglang==0.5.23 or update sglang_hsd/sglang_plugin for this version."
        )


def check_all_signatures(paths=None) -> None:
    """Check every recorded symbol (or ``paths``); collects nothing, fails on the first drift."""
    for path in paths or EXPECTED_SIGNATURES:
        check_signature(path)
