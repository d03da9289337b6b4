"""``--hsd-draft-kind``: EAGLE-3 head or separate draft language model, detected from the draft's
config; what SGLang's scheduler sees for each kind (trees included); the refusals before any model
loads (another vocabulary or tokenizer, a tree without its node budget, the exit level, a token
map). Fast: no server."""

from __future__ import annotations

import argparse
import json
import types

import pytest

pytest.importorskip("sglang")
pytestmark = pytest.mark.sglang

from sglang_hsd.sglang_plugin.config import (  # noqa: E402
    EXIT_BUFFER_ENV, EXIT_LAYER_ENV, PLAN_ENV, ExitLevelConfig, PluginConfig)
from sglang_hsd.sglang_plugin.adaptive_setting import ADAPTIVE_ENV, CYCLE_ENV, TRACE_ENV, TUNING_ENV  # noqa: E402
from sglang_hsd.sglang_plugin.draft_catch_up_setting import CATCH_UP_ENV, EXTEND_ENV  # noqa: E402
from sglang_hsd.sglang_plugin.cpu.draft_copies import DRAFT_PRECISION_ENV  # noqa: E402
from sglang_hsd.sglang_plugin.draft_kind import (  # noqa: E402
    DRAFT_KIND_ENV,
    EAGLE3,
    MODEL,
    RESOLVED_DRAFT_KIND_ENV,
    DraftKindError,
    check_same_vocabulary,
    detect_draft_kind,
    resolve_draft_kind,
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    # setenv first so that monkeypatch restores each variable (or its absence) afterwards: the
    # resolution and the flags write os.environ directly.
    for name in (DRAFT_KIND_ENV, RESOLVED_DRAFT_KIND_ENV, EXIT_LAYER_ENV, EXIT_BUFFER_ENV, PLAN_ENV,
                 DRAFT_PRECISION_ENV, ADAPTIVE_ENV, CYCLE_ENV, CATCH_UP_ENV, EXTEND_ENV, TRACE_ENV,
                 TUNING_ENV):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    return monkeypatch


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from eagle_heads.eagle3 import build_random_eagle3_head
    from sglang_hsd.sglang_plugin.cpu.tiny_models import build_tiny_draft_pair

    root = tmp_path_factory.mktemp("draft_kind")
    target, draft = build_tiny_draft_pair(str(root))
    from transformers import AutoConfig

    build_random_eagle3_head(str(root / "eagle3"), AutoConfig.from_pretrained(target))
    return types.SimpleNamespace(root=root, target=target, draft=draft,
                                 head=str(root / "eagle3"))


@pytest.fixture(scope="module")
def hsd():
    from sglang.srt.plugins import load_plugins
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    load_plugins()
    return SpeculativeAlgorithm.from_string("HSD")


def _args(target, draft, **overrides):
    base = dict(
        model_path=target, speculative_draft_model_path=draft, max_running_requests=None,
        device="cpu", disable_overlap_schedule=False, enable_mixed_chunk=True,
        speculative_num_steps=None, speculative_eagle_topk=None,
        speculative_num_draft_tokens=None, speculative_use_rejection_sampling=False,
        speculative_accept_threshold_single=1.0, speculative_accept_threshold_acc=1.0,
        speculative_use_block_verification=False, speculative_adaptive=False,
        enable_multi_layer_eagle=False, enable_deterministic_inference=False,
        enable_unified_memory=False, enable_watermark=False, pp_size=1,
        disaggregation_mode="null", speculative_token_map=None, enable_dp_attention=False,
    )
    base.update(overrides)
    return types.SimpleNamespace(**base)


def test_draft_kind_detected_from_the_config(pair):
    assert resolve_draft_kind(pair.head) == EAGLE3
    assert resolve_draft_kind(pair.draft) == MODEL
    assert detect_draft_kind({"architectures": ["Qwen2ForCausalLM"]}) == MODEL
    assert detect_draft_kind({"architectures": ["LlamaForCausalLMEagle3"]}) == EAGLE3
    assert detect_draft_kind({"architectures": ["LlamaForCausalLM"],
                              "draft_vocab_size": 32000}) == EAGLE3


def test_draft_kind_override_and_bad_values(pair, clean_env):
    clean_env.setenv(DRAFT_KIND_ENV, "eagle3")
    assert resolve_draft_kind(pair.draft) == EAGLE3  # the flag wins over the detection
    clean_env.setenv(DRAFT_KIND_ENV, "tree")
    with pytest.raises(DraftKindError, match="--hsd-draft-kind"):
        resolve_draft_kind(pair.draft)
    clean_env.setenv(DRAFT_KIND_ENV, "auto")
    with pytest.raises(DraftKindError, match="--speculative-draft-model-path"):
        resolve_draft_kind(str(pair.root / "missing"))


def test_cli_flag_sets_draft_kind(hsd, clean_env):
    import os

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    parser.parse_args(["--model-path", "x", "--hsd-draft-kind", "model"])
    assert os.environ[DRAFT_KIND_ENV] == "model"
    with pytest.raises(SystemExit):  # argparse choices
        parser.parse_args(["--model-path", "x", "--hsd-draft-kind", "medusa"])


def test_scheduler_sees_a_standalone_algorithm_for_a_draft_model(hsd, pair):
    from sglang_hsd.sglang_plugin.standalone_worker import HSDStandaloneWorker
    from sglang_hsd.sglang_plugin.worker import HSDWorker

    args = _args(pair.target, pair.draft)
    hsd.handle_server_args(args)
    assert args.speculative_use_rejection_sampling  # drafts sampled from the draft's real q
    assert (args.speculative_num_steps, args.speculative_eagle_topk) == (4, 1)
    assert hsd.is_standalone() and not hsd.is_eagle() and not hsd.is_eagle3()
    assert not hsd.carries_draft_hidden_states() and hsd.need_topk()
    worker = hsd.create_worker(args)
    assert worker.func is HSDStandaloneWorker and worker.keywords == {
        "plugin_config": PluginConfig(), "exit_config": ExitLevelConfig()}
    hsd.handle_server_args(_args(pair.target, pair.head))  # an EAGLE-3 head: as before
    assert hsd.is_eagle3() and not hsd.is_standalone()
    assert hsd.create_worker(args).func is HSDWorker


def _with_vocab(src, dst, vocab_size=None, rename_token=False):
    """A copy of ``src``'s config and tokenizer with another vocab_size or one token renamed."""
    import shutil

    shutil.copytree(src, dst)
    if vocab_size is not None:
        config = json.loads((dst / "config.json").read_text())
        config["vocab_size"] = vocab_size
        (dst / "config.json").write_text(json.dumps(config))
    if rename_token:
        tok = json.loads((dst / "tokenizer.json").read_text())
        vocab = tok["model"]["vocab"]
        token = next(t for t in vocab if vocab[t] == 300)
        vocab["zz" + token] = vocab.pop(token)
        (dst / "tokenizer.json").write_text(json.dumps(tok))
    return str(dst)


def test_refuses_another_vocabulary_size(pair, tmp_path):
    other = _with_vocab(pair.root / "draft", tmp_path / "big", vocab_size=640)
    with pytest.raises(DraftKindError) as err:
        check_same_vocabulary(pair.target, other)
    message = str(err.value)
    assert "--speculative-draft-model-path" in message and "640" in message and "512" in message


def test_refuses_another_tokenizer(pair, tmp_path):
    other = _with_vocab(pair.root / "draft", tmp_path / "renamed", rename_token=True)
    with pytest.raises(DraftKindError, match="another tokenizer"):
        check_same_vocabulary(pair.target, other)
    check_same_vocabulary(pair.target, pair.draft)  # same family: accepted


def test_draft_model_trees_are_served_as_for_eagle3_heads(hsd, pair):
    from sglang_hsd.sglang_plugin.standalone_worker import HSDStandaloneWorker

    args = _args(pair.target, pair.draft, speculative_num_steps=3, speculative_eagle_topk=2,
                 speculative_num_draft_tokens=6)
    hsd.handle_server_args(args)
    assert not args.speculative_use_rejection_sampling  # HSD draws the tree and carries q itself
    assert args.disable_overlap_schedule and hsd.is_standalone()
    worker = hsd.create_worker(args)
    assert worker.func is HSDStandaloneWorker
    assert worker.keywords["plugin_config"].is_tree
    assert worker.keywords["plugin_config"].tree_draft == "sampled"


def test_draft_model_with_an_exit_level_is_served(hsd, pair, clean_env):
    from sglang_hsd.sglang_plugin.standalone_worker import HSDStandaloneWorker

    clean_env.setenv(EXIT_LAYER_ENV, "2")
    args = _args(pair.target, pair.draft)
    hsd.handle_server_args(args)
    worker = hsd.create_worker(args)
    assert worker.func is HSDStandaloneWorker
    assert (worker.keywords["exit_config"].layer, worker.keywords["exit_config"].buffer) == (2, 1)


@pytest.mark.parametrize("env, overrides, says", [
    ({}, dict(speculative_num_steps=3, speculative_eagle_topk=2), "--speculative-num-draft-tokens: "
     "required with --speculative-eagle-topk 2"),
    ({EXIT_LAYER_ENV: "2", EXIT_BUFFER_ENV: "2"}, {},
     "--hsd-exit-buffer 2 (or the --hsd-plan buffer) with --hsd-draft-kind model"),
    ({}, dict(speculative_token_map="map.pt"), "--speculative-token-map"),
    ({}, dict(enable_dp_attention=True), "--enable-dp-attention"),
    ({DRAFT_PRECISION_ENV: "int4"}, dict(dtype="bfloat16"),
     "--hsd-draft-precision int4: the copies are built from float32 weights; serve with --dtype float32"),
    ({DRAFT_PRECISION_ENV: "int4"}, dict(device="cuda"), "--hsd-draft-precision int4: weight copies run on CPU"),
    ({DRAFT_PRECISION_ENV: "int5"}, {}, "--hsd-draft-precision (SGLANG_HSD_DRAFT_PRECISION) must be one of"),
    # The runtime's copy mixes are not the server's: it keeps one copy per layer.
    ({DRAFT_PRECISION_ENV: "int4+w8a8"}, {}, "--hsd-draft-precision (SGLANG_HSD_DRAFT_PRECISION) must be one of "
     "fp32, bf16, fp16, int8, int4, w8a8, auto, got 'int4+w8a8'"),
    ({ADAPTIVE_ENV: "on"}, dict(speculative_num_steps=3, speculative_eagle_topk=2, speculative_num_draft_tokens=6,
                                device="cuda"),
     "--hsd-adaptive on with --speculative-eagle-topk 2 on --device cuda (tree budgets run on CPU"),
    ({ADAPTIVE_ENV: "on", EXIT_LAYER_ENV: "2"}, {}, "--hsd-adaptive on with --hsd-exit-layer"),
    ({ADAPTIVE_ENV: "maybe"}, {}, "--hsd-adaptive (SGLANG_HSD_ADAPTIVE) must be one of on, off"),
    ({CYCLE_ENV: "0,5"}, dict(speculative_num_steps=3),
     "--hsd-draft-lengths-cycle: every length must be in 0..3 (--speculative-num-steps), got [5]"),
    ({CYCLE_ENV: "0,x"}, {}, "--hsd-draft-lengths-cycle (SGLANG_HSD_DRAFT_LENGTHS_CYCLE) must be "
     "comma-separated draft lengths"),
    ({CYCLE_ENV: "0,2", ADAPTIVE_ENV: "off"}, {}, "--hsd-draft-lengths-cycle: the lengths replace "
     "--hsd-adaptive's choice; it is off"),
    ({CYCLE_ENV: "0,2"}, dict(speculative_num_steps=3, speculative_eagle_topk=2, speculative_num_draft_tokens=6,
                              device="cuda"),
     "--hsd-draft-lengths-cycle with --speculative-eagle-topk 2 on --device cuda"),
    ({TRACE_ENV: "/nonexistent-hsd/trace.jsonl"}, {},
     "--hsd-adaptive-trace /nonexistent-hsd/trace.jsonl: the folder /nonexistent-hsd does not exist"),
    ({TRACE_ENV: "/"}, {}, "--hsd-adaptive-trace /: a directory; expected a file to append to"),
    ({TRACE_ENV: "trace.jsonl", ADAPTIVE_ENV: "off"}, {},
     "--hsd-adaptive-trace: it records --hsd-adaptive's choices; it is off"),
    ({TRACE_ENV: "trace.jsonl", CYCLE_ENV: "0,2"}, {},
     "--hsd-adaptive-trace with --hsd-draft-lengths-cycle: the cycle forces every length"),
    ({TRACE_ENV: "trace.jsonl"}, dict(speculative_num_steps=3, speculative_eagle_topk=2, speculative_num_draft_tokens=6,
                                      device="cuda"),
     "--hsd-adaptive-trace with --speculative-eagle-topk 2 on --device cuda (tree budgets run on CPU; "
     "GPU trees keep their configured shape): --hsd-adaptive is not applied there"),
    ({TUNING_ENV: "draft_margin=0.9"}, {}, "--hsd-adaptive-tuning: draft_margin must be >= 1, got 0.9"),
    ({TUNING_ENV: "spread_trials=0"}, {}, "--hsd-adaptive-tuning: spread_trials must be >= 1 (inf: never fitted), got 0.0"),
    ({TUNING_ENV: "margin=1.05"}, {}, "--hsd-adaptive-tuning (SGLANG_HSD_ADAPTIVE_TUNING) takes name=value "
     "pairs of prior_rate, prior_rounds, memory"),
    ({TUNING_ENV: "cost_window=2.5"}, {}, "--hsd-adaptive-tuning (SGLANG_HSD_ADAPTIVE_TUNING): cost_window "
     "must be an integer, got '2.5'"),
    ({TUNING_ENV: "memory=0.8", ADAPTIVE_ENV: "off"}, {},
     "--hsd-adaptive-tuning: it tunes --hsd-adaptive's controller; it is off"),
    ({TUNING_ENV: "memory=0.8", CYCLE_ENV: "0,2"}, {},
     "--hsd-adaptive-tuning with --hsd-draft-lengths-cycle: the cycle forces every length"),
    ({CATCH_UP_ENV: "on", ADAPTIVE_ENV: "off"}, {},
     "--hsd-draft-catch-up on with --hsd-adaptive off (no round drafts zero tokens)"),
    ({CATCH_UP_ENV: "on"}, dict(device="cuda"), "--hsd-draft-catch-up on with --device cuda"),
    ({CATCH_UP_ENV: "on"}, dict(speculative_num_steps=3, speculative_eagle_topk=2, speculative_num_draft_tokens=6,
                                device="cuda"),
     "--hsd-draft-catch-up on with --device cuda"),
    ({CATCH_UP_ENV: "yes"}, {}, "--hsd-draft-catch-up (SGLANG_HSD_DRAFT_CATCH_UP) must be one of on, off"),
    ({EXTEND_ENV: "tail"}, dict(speculative_num_steps=3, speculative_eagle_topk=2, speculative_num_draft_tokens=6),
     "--hsd-draft-extend tail with --speculative-eagle-topk 2: a drafting tree round keeps SGLang's window extend"),
    ({EXTEND_ENV: "rows"}, {}, "--hsd-draft-extend (SGLANG_HSD_DRAFT_EXTEND) must be one of tail, window"),
    ({EXTEND_ENV: "tail", CATCH_UP_ENV: "off"}, {},
     "--hsd-draft-extend tail with --hsd-draft-catch-up off: the tail extend is part of the catch-up"),
    ({EXTEND_ENV: "tail"}, dict(device="cuda"),
     "--hsd-draft-extend tail with --device cuda (the overlap scheduler and draft CUDA graphs "
     "bypass the catch-up; CPU only): the tail extend runs with the draft catch-up only"),
])
def test_draft_model_refusals(hsd, pair, clean_env, env, overrides, says):
    from sglang_hsd.sglang_plugin.server_args import HSDServerArgsError

    for name, value in env.items():
        clean_env.setenv(name, value)
    with pytest.raises(HSDServerArgsError) as err:
        hsd.validate_server_args(_args(pair.target, pair.draft, **overrides))
    assert says in str(err.value)


def test_catch_up_and_lengths_cycle_accepted_where_they_run(hsd, pair, clean_env):
    """An explicit ``--hsd-draft-catch-up on``, ``--hsd-draft-extend tail`` and a valid cycle pass
    with a draft model on CPU (chains, adaptive on); ``window`` passes anywhere, and the default
    catch-up is not refused where it cannot run."""
    clean_env.setenv(CATCH_UP_ENV, "on")
    clean_env.setenv(CYCLE_ENV, "0,0,3,1")
    hsd.validate_server_args(_args(pair.target, pair.draft, speculative_num_steps=3))
    clean_env.setenv(EXTEND_ENV, "tail")
    hsd.validate_server_args(_args(pair.target, pair.draft, speculative_num_steps=3))
    clean_env.delenv(CATCH_UP_ENV)
    clean_env.setenv(EXTEND_ENV, "window")  # SGLang's extend: nothing to refuse anywhere
    hsd.validate_server_args(_args(pair.target, pair.draft, device="cuda"))
    clean_env.delenv(EXTEND_ENV)
    clean_env.delenv(CYCLE_ENV)
    clean_env.setenv(ADAPTIVE_ENV, "off")
    hsd.validate_server_args(_args(pair.target, pair.draft, device="cuda"))


def test_a_writable_trace_is_accepted(hsd, pair, clean_env, tmp_path):
    """``--hsd-adaptive-trace`` into an existing folder passes with the adaptive default; nothing
    is written before the server runs."""
    clean_env.setenv(TRACE_ENV, str(tmp_path / "trace.jsonl"))
    hsd.validate_server_args(_args(pair.target, pair.draft, speculative_num_steps=3))
    assert not (tmp_path / "trace.jsonl").exists()


def test_adaptive_tuning_reaches_the_controllers_configuration(hsd, pair, clean_env):
    """``--hsd-adaptive-tuning`` values pass the checks and become ``AdaptiveConfig`` fields of
    their own types; the candidates still come from ``--speculative-num-steps``."""
    from sglang_hsd.sglang_plugin.adaptive_setting import AdaptiveSetting

    clean_env.setenv(TUNING_ENV, "draft_margin=1.05, server_memory=0.99,refresh_rounds=32")
    hsd.validate_server_args(_args(pair.target, pair.draft, speculative_num_steps=3))
    config = AdaptiveSetting.from_env().config(3)
    assert (config.draft_margin, config.server_memory, config.refresh_rounds) == (1.05, 0.99, 32)
    assert isinstance(config.refresh_rounds, int) and config.candidates == (0, 1, 2, 3)
    clean_env.setenv(TUNING_ENV, "spread_trials=inf")  # the geometric model: no spread fitted
    hsd.validate_server_args(_args(pair.target, pair.draft, speculative_num_steps=3))
    assert AdaptiveSetting.from_env().config(3).spread_trials == float("inf")
    clean_env.setenv(TUNING_ENV, "")
    assert AdaptiveSetting.from_env().config(3) == AdaptiveSetting().config(3)


def test_catch_up_refused_for_an_eagle3_head(hsd, pair, clean_env):
    from sglang_hsd.sglang_plugin.server_args import HSDServerArgsError

    clean_env.setenv(CATCH_UP_ENV, "on")
    with pytest.raises(HSDServerArgsError, match="--hsd-draft-catch-up on with an EAGLE-3 draft head"):
        hsd.validate_server_args(_args(pair.target, pair.head))


def test_draft_precision_copy_refused_for_an_eagle3_head(hsd, pair, clean_env):
    from sglang_hsd.sglang_plugin.server_args import HSDServerArgsError

    clean_env.setenv(DRAFT_PRECISION_ENV, "int8")
    with pytest.raises(HSDServerArgsError, match="copies are for a separate draft language model"):
        hsd.validate_server_args(_args(pair.target, pair.head))


def test_server_args_refuse_a_mismatched_pair_before_models_load(hsd, pair, tmp_path):
    other = _with_vocab(pair.root / "draft", tmp_path / "big", vocab_size=1024)
    with pytest.raises(DraftKindError, match="1024"):
        hsd.handle_server_args(_args(pair.target, other))


def test_draft_extend_keeps_the_logits_of_each_requests_last_accepted_token():
    """SGLang's eager draft extend keeps row ``b * num_draft_tokens + accept_lens[b] - 1`` of its
    logits (its ``select_index``); on CPU the draft LM head computes only those rows."""
    import torch
    from torch import nn

    from sglang_hsd.sglang_plugin.cpu.linear_path import LOGIT_ROWS_ATTR
    from sglang_hsd.sglang_plugin.draft_worker import HSDStandaloneDraftWorker

    lm_head = nn.Module()
    worker = types.SimpleNamespace(device="cpu", speculative_num_draft_tokens=3,
                                   draft_runner=types.SimpleNamespace(model=types.SimpleNamespace(lm_head=lm_head)))
    mode = types.SimpleNamespace(is_idle=lambda: False)
    batch = types.SimpleNamespace(seq_lens=torch.tensor([9, 5, 7]), forward_mode=mode)
    result = types.SimpleNamespace(accept_lens=torch.tensor([1, 3, 2]), prepared_draft_extend_inputs=None)
    with HSDStandaloneDraftWorker._kept_logit_rows(worker, batch, result):
        rows = getattr(lm_head, LOGIT_ROWS_ATTR)
        assert rows.total == 9 and rows.index.tolist() == [0, 5, 7]
    assert not hasattr(lm_head, LOGIT_ROWS_ATTR)
    worker.device = "cuda"  # elsewhere the extend keeps SGLang's own path
    with HSDStandaloneDraftWorker._kept_logit_rows(worker, batch, result):
        assert not hasattr(lm_head, LOGIT_ROWS_ATTR)


def test_draft_model_trees_take_adaptive_budgets_on_cpu(hsd, pair, clean_env):
    """An explicit ``--hsd-adaptive on`` (and a lengths cycle over depths) with a CPU tree is served."""
    clean_env.setenv(ADAPTIVE_ENV, "on")
    args = _args(pair.target, pair.draft, speculative_num_steps=3, speculative_eagle_topk=2,
                 speculative_num_draft_tokens=6)
    hsd.validate_server_args(args)
    clean_env.setenv(CYCLE_ENV, "0,3,1")
    hsd.validate_server_args(args)
