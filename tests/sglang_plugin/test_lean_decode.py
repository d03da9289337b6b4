"""``--hsd-draft-forward`` (``sglang_plugin/cpu/lean_decode.py``) without a server: the setting's
checks, the refusals before models load, and what the install does for a model the lean forward
does not support. That its forwards match SGLang's (chains, trees, extends, prefill) is checked
in ``test_draft_model_server.py``, whose servers run it ``checked``."""

from __future__ import annotations

import argparse

import pytest
from torch import nn

from sglang_hsd.sglang_plugin.cpu.lean_decode import (
    LEAN_DECODE_ENV, DraftForwardConfig, LeanDecodeUnsupported, install_lean_decode)

pytest.importorskip("sglang")
pytestmark = pytest.mark.sglang


def test_config_reads_the_environment(monkeypatch):
    monkeypatch.delenv(LEAN_DECODE_ENV, raising=False)
    assert DraftForwardConfig.from_env().mode == "auto"
    monkeypatch.setenv(LEAN_DECODE_ENV, "Checked")
    assert DraftForwardConfig.from_env().mode == "checked"
    monkeypatch.setenv(LEAN_DECODE_ENV, "fast")
    with pytest.raises(ValueError, match=r"--hsd-draft-forward \(SGLANG_HSD_DRAFT_FORWARD\).*'fast'"):
        DraftForwardConfig.from_env()


def _unsupported_model() -> nn.Module:
    """A CausalLM-shaped module whose decoder has no ``layers``."""
    model = nn.Module()
    model.model = nn.Module()
    return model


def test_auto_keeps_sglangs_forward_for_an_unsupported_model_and_says_why():
    model = _unsupported_model()
    forward = model.model.forward
    stats = install_lean_decode(model, DraftForwardConfig("auto"))
    assert stats.path.startswith("sglang (") and "layers" in stats.path
    assert model.model.forward == forward


@pytest.mark.parametrize("mode", ["lean", "checked"])
def test_an_explicit_lean_forward_is_refused_for_an_unsupported_model(mode):
    with pytest.raises(LeanDecodeUnsupported, match=rf"--hsd-draft-forward {mode}: .*layers.*auto or sglang"):
        install_lean_decode(_unsupported_model(), DraftForwardConfig(mode))


def test_sglang_mode_installs_nothing():
    model = _unsupported_model()
    forward = model.model.forward
    assert install_lean_decode(model, DraftForwardConfig("sglang")).path == "sglang"
    assert model.model.forward == forward


def _args(device="cpu", draft="draft"):
    return argparse.Namespace(device=device, speculative_draft_model_path=draft)


@pytest.mark.parametrize("mode", ["lean", "checked"])
def test_explicit_lean_forward_off_cpu_or_without_a_draft_model_is_refused_before_loading(monkeypatch, mode):
    from sglang_hsd.sglang_plugin import server_args

    monkeypatch.setenv(LEAN_DECODE_ENV, mode)
    monkeypatch.setattr(server_args, "resolve_draft_kind", lambda path: server_args.MODEL)
    assert server_args.draft_forward_problems(_args()) == []
    for args in (_args(device="cuda"), _args(draft=None)):
        problems = server_args.draft_forward_problems(args)
        assert len(problems) == 1 and problems[0].startswith(f"--hsd-draft-forward {mode}:"), problems
    monkeypatch.setattr(server_args, "resolve_draft_kind", lambda path: "eagle3")
    assert server_args.draft_forward_problems(_args())


def test_auto_and_a_bad_value_before_loading(monkeypatch):
    from sglang_hsd.sglang_plugin import server_args

    monkeypatch.setenv(LEAN_DECODE_ENV, "auto")
    assert server_args.draft_forward_problems(_args(device="cuda")) == []  # auto applies where it can
    monkeypatch.setenv(LEAN_DECODE_ENV, "fast")
    assert "--hsd-draft-forward" in server_args.draft_forward_problems(_args())[0]


def test_stats_count_forwards_and_rows_per_mode():
    from sglang_hsd.sglang_plugin.cpu.lean_decode import LeanDecodeStats

    stats = LeanDecodeStats("lean")
    stats.count("DECODE", 4)
    stats.count("DECODE", 2)
    stats.count("EXTEND", 30)
    assert stats.as_dict() == {"path": "lean", "forwards": {"DECODE": 2, "EXTEND": 1},
                               "rows": {"DECODE": 6, "EXTEND": 30}, "max_checked_error": None}
