"""Exit-level options (flags, environment, plan files, depth checks, exit-head folders) and the
CPU top-k / top-p renormalisation SGLang lacks on CPU. Fast: no server."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from sglang_hsd.sglang_plugin.adaptive_setting import ADAPTIVE_FLAG
from sglang_hsd.sglang_plugin.cpu import cpu_sampling
from sglang_hsd.sglang_plugin.cpu.draft_copies import DRAFT_PRECISION_FLAG
from sglang_hsd.sglang_plugin.cpu.linear_path import CPU_LINEAR_FLAG
from sglang_hsd.sglang_plugin.config import (
    EXIT_BUFFER_ENV,
    EXIT_HEADS_ENV,
    EXIT_LAYER_ENV,
    EXIT_METHOD_ENV,
    PLAN_ENV,
    ExitLevelConfig,
    ExitLevelConfigError,
)
from sglang_hsd.sampling import BatchSamplingParams, filter_probs


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in (EXIT_LAYER_ENV, EXIT_HEADS_ENV, EXIT_METHOD_ENV, EXIT_BUFFER_ENV, PLAN_ENV):
        # setenv first so that monkeypatch restores the variable (or its absence) afterwards,
        # also when a flag's action wrote it straight into os.environ.
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    return monkeypatch


def _plan(tmp_path, levels, buffers="2,4"):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"levels": levels, "buffers": buffers}))
    return str(path)


def test_no_exit_layer_means_two_levels():
    assert not ExitLevelConfig.from_env().enabled


def test_exit_layer_and_method_from_env(clean_env):
    clean_env.setenv(EXIT_LAYER_ENV, "8")
    clean_env.setenv(EXIT_METHOD_ENV, "tokenwise")
    config = ExitLevelConfig.from_env()
    assert (config.layer, config.method, config.heads_dir) == (8, "tokenwise", None)
    config.check_depth(30)
    with pytest.raises(ExitLevelConfigError, match=r"--hsd-exit-layer 8.*\[1, 7\]"):
        config.check_depth(8)


@pytest.mark.parametrize("env,says", [
    ({EXIT_LAYER_ENV: "x"}, "must be an integer"),
    ({EXIT_LAYER_ENV: "0"}, ">= 1"),
    ({EXIT_HEADS_ENV: "/tmp"}, "needs --hsd-exit-layer"),
    ({EXIT_LAYER_ENV: "2", EXIT_HEADS_ENV: "/no/such/dir"}, "not a directory"),
    ({EXIT_LAYER_ENV: "2", EXIT_METHOD_ENV: "hsd-paper"}, "not a lossless"),
])
def test_bad_exit_options_name_the_flag(clean_env, env, says):
    for name, value in env.items():
        clean_env.setenv(name, value)
    with pytest.raises(ExitLevelConfigError, match=says):
        ExitLevelConfig.from_env()


def test_plan_gives_its_intermediate_exit(clean_env, tmp_path):
    clean_env.setenv(PLAN_ENV, _plan(tmp_path, "exit:4,exit:12,target"))
    assert ExitLevelConfig.from_env().layer == 12
    clean_env.setenv(PLAN_ENV, _plan(tmp_path, "exit:4,target", "2"))
    assert not ExitLevelConfig.from_env().enabled
    clean_env.setenv(PLAN_ENV, _plan(tmp_path, "exit:4,exit:8,exit:12,target", "2,4,4"))
    with pytest.raises(ExitLevelConfigError, match="one intermediate exit level"):
        ExitLevelConfig.from_env()
    clean_env.setenv(EXIT_LAYER_ENV, "3")
    with pytest.raises(ExitLevelConfigError, match="not both"):
        ExitLevelConfig.from_env()


def test_a_plan_with_a_lookup_level_drafting_for_a_target_is_refused(clean_env, tmp_path):
    # The server drafts with its own drafter: dropping the plan's model level would run another hierarchy.
    clean_env.setenv(PLAN_ENV, _plan(tmp_path, "lookup:3,target", "8"))
    with pytest.raises(ExitLevelConfigError, match="runs a lookup level only below its draft model"):
        ExitLevelConfig.from_env()


def test_a_plan_with_a_lookup_level_below_the_draft_model_sets_the_lookup(clean_env, tmp_path):
    from types import SimpleNamespace

    from sglang_hsd.sglang_plugin.draft_lookup_setting import LOOKUP_ENV, LookupSetting, lookup_problems

    clean_env.setenv(PLAN_ENV, _plan(tmp_path, "lookup:3,model:d,target", "8,16"))
    assert not ExitLevelConfig.from_env().enabled
    assert LookupSetting.from_env() == LookupSetting(3, 8)
    clean_env.setenv("SGLANG_HSD_DRAFT_KIND", "model")
    args = SimpleNamespace(speculative_draft_model_path="/d", speculative_eagle_topk=1, device="cpu",
                           speculative_num_steps=16)
    assert lookup_problems(args, plan_exit_level=False) == []
    args.speculative_num_steps = 8
    (problem,) = lookup_problems(args, plan_exit_level=False)
    assert "pass --speculative-num-steps 16" in problem
    clean_env.setenv(LOOKUP_ENV, "2")  # the flag and the plan: one of them
    with pytest.raises(ValueError, match="with an --hsd-plan lookup level"):
        LookupSetting.from_env()


@pytest.mark.parametrize("levels,buffers,says", [
    ("exit:4,exit:12,target", "2", r"--hsd-plan .*plan field buffers must hold 2 values"),
    ("exit:4,exit:x,target", "2,4", r"--hsd-plan .*plan field levels: level 'exit:x'"),
    ("exit:4,exit:12", "2", r"--hsd-plan .*plan field levels: .*last level must be the target"),
])
def test_a_malformed_plan_is_refused_with_the_field_named(clean_env, tmp_path, levels, buffers, says):
    clean_env.setenv(PLAN_ENV, _plan(tmp_path, levels, buffers))
    with pytest.raises(ExitLevelConfigError, match=says):
        ExitLevelConfig.from_env()
    clean_env.setenv(PLAN_ENV, str(tmp_path / "missing.json"))
    with pytest.raises(ExitLevelConfigError, match="no such file"):
        ExitLevelConfig.from_env()


def test_exit_map_loading_names_missing_layers(tmp_path):
    from safetensors.torch import save_file

    from sglang_hsd.sglang_plugin.exit_head import load_exit_map

    save_file({"layer4.A": torch.zeros(8, 8), "layer4.b": torch.zeros(8)},
              str(tmp_path / "exit_heads.safetensors"))
    (tmp_path / "manifest.json").write_text(json.dumps({"layers": [4]}))
    A, b = load_exit_map(str(tmp_path), 4, 8)
    assert A.shape == (8, 8) and b.shape == (8,)
    with pytest.raises(KeyError, match="--hsd-exit-heads .*no head for exit layer 5.*layers \\[4\\]"):
        load_exit_map(str(tmp_path), 5, 8)
    with pytest.raises(ValueError, match="hidden size is 16"):
        load_exit_map(str(tmp_path), 4, 16)
    with pytest.raises(FileNotFoundError, match="manifest.json"):
        load_exit_map(str(tmp_path / "missing"), 4, 8)


def test_exit_buffer_from_flag_or_plan(clean_env, tmp_path):
    clean_env.setenv(EXIT_LAYER_ENV, "8")
    assert ExitLevelConfig.from_env().buffer == 1  # default: one exit sub-round per round
    clean_env.setenv(EXIT_BUFFER_ENV, "5")
    config = ExitLevelConfig.from_env()
    assert config.buffer == 5
    config.check_window(5)  # K = 4 drafts: a window of 5 positions holds N_i = 5
    with pytest.raises(ExitLevelConfigError, match=r"--hsd-exit-buffer 5.*at most 4"):
        config.check_window(4)
    clean_env.delenv(EXIT_LAYER_ENV)
    clean_env.delenv(EXIT_BUFFER_ENV)
    clean_env.setenv(PLAN_ENV, _plan(tmp_path, "exit:4,exit:16,target"))  # buffers "2,4"
    assert (ExitLevelConfig.from_env().layer, ExitLevelConfig.from_env().buffer) == (16, 4)
    clean_env.setenv(EXIT_BUFFER_ENV, "2")  # the flag wins over the plan
    assert ExitLevelConfig.from_env().buffer == 2


@pytest.mark.parametrize("env,says", [
    ({EXIT_LAYER_ENV: "2", EXIT_BUFFER_ENV: "two"}, "--hsd-exit-buffer .* must be an integer"),
    ({EXIT_LAYER_ENV: "2", EXIT_BUFFER_ENV: "0"}, "--hsd-exit-buffer must be >= 1"),
    ({EXIT_BUFFER_ENV: "3"}, "--hsd-exit-buffer .* needs --hsd-exit-layer"),
])
def test_bad_exit_buffer_is_refused_with_the_flag_named(clean_env, env, says):
    for name, value in env.items():
        clean_env.setenv(name, value)
    with pytest.raises(ExitLevelConfigError, match=says):
        ExitLevelConfig.from_env()


@pytest.mark.sglang
def test_cli_flags_reach_the_environment(clean_env):
    pytest.importorskip("sglang")
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import ServerArgs

    load_plugins()
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(["--model-path", "x", "--hsd-exit-layer", "8", "--hsd-exit-heads",
                            "none", "--hsd-exit-method", "tokenwise", "--hsd-exit-buffer", "3"])
    assert not any(name.startswith("hsd") for name in vars(ns))
    import os

    assert (os.environ[EXIT_LAYER_ENV], os.environ[EXIT_HEADS_ENV], os.environ[EXIT_METHOD_ENV],
            os.environ[EXIT_BUFFER_ENV]) == ("8", "none", "tokenwise", "3")
    with pytest.raises(SystemExit):
        parser.parse_args(["--model-path", "x", "--hsd-exit-layer", "eight"])


def test_cpu_renorm_shims_filter_like_flashinfers_kernels():
    """The CPU stand-ins for SGLang's renorm kernels (used outside HSD verify calls): each alone
    keeps the set ``sampling.filter_probs`` keeps; composed as ``eagle_sample`` composes them,
    top-p reads the row renormalised after top-k, which is not the non-speculative law."""
    torch.manual_seed(0)
    logits = torch.randn(6, 50, dtype=torch.float64) * 3
    top_k = torch.tensor([1, 5, 50, 0, 7, 3])
    top_p = torch.tensor([1.0, 0.9, 0.5, 0.3, 1.0, 0.99], dtype=torch.float64)
    probs = torch.softmax(logits, -1)
    none = torch.zeros(6)
    for alone, params in ((cpu_sampling.top_k_renorm_prob(probs, top_k), BatchSamplingParams(none, top_k, none + 1, none)),
                          (cpu_sampling.top_p_renorm_prob(probs, top_p), BatchSamplingParams(none, none.long(), top_p, none))):
        torch.testing.assert_close(alone, filter_probs(probs, params), rtol=0, atol=1e-12)
    composed = cpu_sampling.top_p_renorm_prob(cpu_sampling.top_k_renorm_prob(probs, top_k), top_p)
    joint = filter_probs(probs, BatchSamplingParams(none, top_k, top_p, none))
    assert torch.equal((composed[0] > 0).nonzero(), logits[0].argmax().view(1, 1))
    assert (composed - joint).abs().sum(-1).max() > 0.05  # row 1: top_k 5, top_p 0.9


def _plan_with(tmp_path, **knobs):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"levels": "exit:4,exit:12,target", "buffers": "2,4", **knobs}))
    return str(path)


@pytest.mark.parametrize("knob,value,setting", [
    ("draft_length", "adaptive:0.4:16", f"flags (--speculative-num-steps, {ADAPTIVE_FLAG})"),
    ("draft_length", "fixed", f"flags (--speculative-num-steps, {ADAPTIVE_FLAG})"),
    ("tree", "4:2:8", "flags (--speculative-eagle-topk / --speculative-num-draft-tokens)"),
    ("tree", "none", "flags (--speculative-eagle-topk / --speculative-num-draft-tokens)"),
    ("threads", 2, "threads (SGLang binds them to cores with SGLANG_CPU_OMP_THREADS_BIND)"),
    ("kernel_path", "onednn-packed", f"flag ({CPU_LINEAR_FLAG})"),
    ("drafter_precision", "bf16", f"flag ({DRAFT_PRECISION_FLAG})"),
])
def test_a_plan_knob_the_server_does_not_apply_is_refused_naming_its_flag(clean_env, tmp_path, knob, value, setting):
    plan = _plan_with(tmp_path, **{knob: value})
    clean_env.setenv(PLAN_ENV, plan)
    with pytest.raises(ExitLevelConfigError) as err:
        ExitLevelConfig.from_env()
    assert str(err.value) == (f"--hsd-plan {plan}: knob {knob!r} ({value}) is not applied by the server; set "
                              f"the server's own {setting} and remove it from the plan")


def test_every_knob_of_a_plan_is_refused_on_its_own_line(clean_env, tmp_path):
    knobs = dict(draft_length="adaptive:0.4:16", tree="none", threads=2, kernel_path="mkl", drafter_precision="fp32")
    clean_env.setenv(PLAN_ENV, _plan_with(tmp_path, **knobs))
    with pytest.raises(ExitLevelConfigError) as err:
        ExitLevelConfig.from_env()
    lines = str(err.value).splitlines()
    assert [line.split("knob ")[1].split(" ")[0] for line in lines] == [repr(knob) for knob in knobs]
    clean_env.setenv(PLAN_ENV, _plan_with(tmp_path))  # the same plan without knobs is served
    assert ExitLevelConfig.from_env().layer == 12


def test_the_server_arguments_refuse_plan_knobs_before_models_load(clean_env, tmp_path):
    from sglang_hsd.sglang_plugin.draft_kind import DRAFT_KIND_ENV, RESOLVED_DRAFT_KIND_ENV
    from sglang_hsd.sglang_plugin.server_args import HSDServerArgsError, validate_hsd_server_args
    from tests.sglang_plugin.plugin_fixtures import args_namespace

    for name in (DRAFT_KIND_ENV, RESOLVED_DRAFT_KIND_ENV):
        clean_env.setenv(name, "eagle3")  # the stand-in's draft path "/head" is an EAGLE-3 head
    clean_env.setenv(PLAN_ENV, _plan_with(tmp_path))
    validate_hsd_server_args(args_namespace())
    clean_env.setenv(PLAN_ENV, _plan_with(tmp_path, tree="4:2:8", kernel_path="onednn-packed"))
    with pytest.raises(HSDServerArgsError) as err:
        validate_hsd_server_args(args_namespace())
    assert "\n  - --hsd-plan " in str(err.value) and "knob 'tree' (4:2:8)" in str(err.value)
    assert "\n  - --hsd-plan" in str(err.value).split("knob 'tree'")[1]  # the second knob: a line of its own
    assert "knob 'kernel_path' (onednn-packed)" in str(err.value)
