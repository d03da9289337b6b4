"""Shared pieces of the plugin's unit tests: the entry-point load, an EAGLE-3 draft kind for the
nonexistent draft path the tests name, a ``ServerArgs`` stand-in and SGLang's global state faked
for driving ``eagle_utils`` with CPU tensors. Import the fixtures into a test module to use them."""

from __future__ import annotations

import types

import pytest


@pytest.fixture(scope="module")
def plugin_loaded():
    from sglang.srt.plugins import load_plugins

    load_plugins()  # the installed entry point imports sglang_hsd.sglang_plugin:register
    import sglang_hsd.sglang_plugin as plugin

    assert plugin._REGISTERED, "the sglang.srt.plugins entry point did not run register()"
    return plugin


@pytest.fixture(autouse=True)
def eagle3_draft_kind(monkeypatch):
    """These tests name a draft path that does not exist ("/head"): say it is an EAGLE-3 head
    (setenv, so monkeypatch restores both variables, which the resolution writes directly)."""
    from sglang_hsd.sglang_plugin.draft_kind import DRAFT_KIND_ENV, RESOLVED_DRAFT_KIND_ENV

    monkeypatch.setenv(DRAFT_KIND_ENV, "eagle3")
    monkeypatch.setenv(RESOLVED_DRAFT_KIND_ENV, "eagle3")


def args_namespace(**overrides):
    """A stand-in for SGLang's ``ServerArgs`` with the fields HSD reads (CPU, no speculation set)."""
    base = dict(
        max_running_requests=None, device="cpu", disable_overlap_schedule=False,
        enable_mixed_chunk=True, speculative_num_steps=None, speculative_eagle_topk=None,
        speculative_num_draft_tokens=None, speculative_use_rejection_sampling=False,
        speculative_draft_model_path="/head", speculative_accept_threshold_single=1.0,
        speculative_accept_threshold_acc=1.0, speculative_use_block_verification=False,
        speculative_adaptive=False, enable_multi_layer_eagle=False,
        enable_deterministic_inference=False, enable_unified_memory=False,
        enable_watermark=False, pp_size=1, disaggregation_mode="null",
    )
    base.update(overrides)
    return types.SimpleNamespace(**base)


def fake_sglang_state(monkeypatch, algorithm="HSD"):
    """SGLang's process-global spec / parallel state, faked so ``eagle_utils`` runs on CPU tensors."""
    from sglang.srt import runtime_context
    from sglang.srt.layers import dp_attention
    from sglang.srt.speculative import eagle_utils

    spec = types.SimpleNamespace(
        speculative_algorithm=algorithm, speculative_use_rejection_sampling=True,
        speculative_use_block_verification=False, speculative_accept_threshold_single=1.0,
        speculative_accept_threshold_acc=1.0,
    )
    parallel = types.SimpleNamespace(tp_group=types.SimpleNamespace(world_size=1),
                                     attn_tp_group=types.SimpleNamespace(world_size=1))
    monkeypatch.setattr(eagle_utils, "get_spec", lambda: spec)
    monkeypatch.setattr(runtime_context, "get_spec", lambda: spec)
    monkeypatch.setattr(runtime_context, "get_parallel", lambda: parallel)
    monkeypatch.setattr(dp_attention, "is_dp_attention_enabled", lambda: False)
