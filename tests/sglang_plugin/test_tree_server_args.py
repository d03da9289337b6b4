"""Server arguments and flags of draft trees (--speculative-eagle-topk > 1): what is accepted,
the verify-method / tree-draft pairs, and every refusal naming its flag (before models load)."""

from __future__ import annotations

import pytest

from sglang_hsd.sglang_plugin.config import PluginConfig
from tests.sglang_plugin.plugin_fixtures import (  # noqa: F401 (fixtures)
    args_namespace, eagle3_draft_kind, plugin_loaded)

pytestmark = pytest.mark.sglang

TREE = dict(speculative_num_steps=3, speculative_eagle_topk=2, speculative_num_draft_tokens=6,
            disable_overlap_schedule=True)


@pytest.fixture
def clean_env(monkeypatch):
    for name in ("SGLANG_HSD_VERIFY_METHOD", "SGLANG_HSD_TREE_DRAFT", "SGLANG_HSD_EXIT_LAYER",
                 "SGLANG_HSD_PLAN", "SGLANG_HSD_DRAFT_TEMPERATURE_SCALE", "SGLANG_HSD_TREE_RULE"):
        monkeypatch.setenv(name, "")  # recorded, so flag actions writing os.environ are undone
        monkeypatch.delenv(name)
    return monkeypatch


def _validate(**overrides):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    SpeculativeAlgorithm.from_string("HSD").validate_server_args(args_namespace(**{**TREE, **overrides}))


def test_tree_defaults_keep_sglang_rejection_sampling_off(plugin_loaded, clean_env):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    args = args_namespace(**{**TREE, "disable_overlap_schedule": False})
    SpeculativeAlgorithm.from_string("HSD").handle_server_args(args)
    assert args.speculative_use_rejection_sampling is False  # the HSD worker carries q
    assert (args.speculative_eagle_topk, args.speculative_num_draft_tokens) == (2, 6)
    assert args.disable_overlap_schedule is True  # CPU


@pytest.mark.parametrize("topk, tokens, draft", [
    (2, 3, "sampled"), (2, 7, "sampled"), (3, 4, "sampled"), (4, 13, "sampled"),
    (2, 11, "topk"), (4, 21, "topk")])
def test_tree_shapes_accepted(plugin_loaded, clean_env, topk, tokens, draft):
    clean_env.setenv("SGLANG_HSD_TREE_DRAFT", draft)
    _validate(speculative_eagle_topk=topk, speculative_num_draft_tokens=tokens)


@pytest.mark.parametrize("overrides, says", [
    (dict(speculative_num_draft_tokens=None), "--speculative-num-draft-tokens: required"),
    (dict(speculative_eagle_topk=4, speculative_num_draft_tokens=4), "larger than the node budget"),
    (dict(speculative_num_draft_tokens=12), "lower it to <= 11"),
    (dict(speculative_use_rejection_sampling=True), "--speculative-use-rejection-sampling"),
    (dict(disable_overlap_schedule=False, device="cuda"), "--disable-overlap-schedule"),
    (dict(speculative_accept_threshold_acc=0.5), "thresholds make verification lossy"),
    (dict(speculative_eagle_topk=0), "--speculative-eagle-topk 0: must be >= 1"),
])
def test_tree_refusals_name_the_flag(plugin_loaded, clean_env, overrides, says):
    from sglang_hsd.sglang_plugin.server_args import HSDServerArgsError

    with pytest.raises(HSDServerArgsError) as err:
        _validate(**overrides)
    assert says in str(err.value)


def test_budget_beyond_the_rules_capacity_is_refused(plugin_loaded, clean_env):
    """The default rule (spine_wide) can keep the whole pool; spine keeps at most D k nodes."""
    from sglang_hsd.sglang_plugin.server_args import HSDServerArgsError

    _validate(speculative_num_draft_tokens=8)  # (3, 2, 8) fits the default rule
    clean_env.setenv("SGLANG_HSD_TREE_RULE", "spine")
    with pytest.raises(HSDServerArgsError,
                       match=r"the sampled tree drafter \(--hsd-tree-rule spine\) keeps at most 6"):
        _validate(speculative_num_draft_tokens=8)


def test_tree_rule_flag(plugin_loaded, clean_env):
    """--hsd-tree-rule: any lossless level rule for sampled trees; the lossy one, unknown names,
    chains and stock top-k trees are refused naming the flag."""
    import argparse
    import os

    from sglang.srt.server_args import ServerArgs

    from sglang_hsd.tree_draft import DEFAULT_LEVEL_RULE, LOSSLESS_LEVEL_RULES

    assert PluginConfig.from_env(topk=2).tree_rule == DEFAULT_LEVEL_RULE
    assert set(LOSSLESS_LEVEL_RULES) == {"spine", "spine_wide", "beam"}
    clean_env.setenv("SGLANG_HSD_TREE_RULE", "beam")
    assert PluginConfig.from_env(topk=2).tree_rule == "beam"
    _validate(speculative_num_draft_tokens=8)
    for bad in ("pruned", "widest"):
        clean_env.setenv("SGLANG_HSD_TREE_RULE", bad)
        with pytest.raises(ValueError, match="--hsd-tree-rule.*lossless"):
            PluginConfig.from_env(topk=2)
    clean_env.setenv("SGLANG_HSD_TREE_RULE", "beam")
    with pytest.raises(ValueError, match="--hsd-tree-rule.*sampled trees only"):
        PluginConfig.from_env(topk=1)
    clean_env.setenv("SGLANG_HSD_TREE_DRAFT", "topk")
    clean_env.setenv("SGLANG_HSD_VERIFY_METHOD", "target-only")
    with pytest.raises(ValueError, match="--hsd-tree-rule.*sampled trees only"):
        PluginConfig.from_env(topk=2)
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    parser.parse_args(["--model-path", "x", "--hsd-tree-rule", "spine"])
    assert os.environ["SGLANG_HSD_TREE_RULE"] == "spine"
    with pytest.raises(SystemExit):  # argparse: not a lossless rule
        parser.parse_args(["--model-path", "x", "--hsd-tree-rule", "pruned"])


def test_exit_level_with_trees_is_refused_naming_both_flags(plugin_loaded, clean_env):
    from sglang_hsd.sglang_plugin.server_args import HSDServerArgsError

    clean_env.setenv("SGLANG_HSD_EXIT_LAYER", "2")
    with pytest.raises(HSDServerArgsError) as err:
        _validate()
    assert "--hsd-exit-layer" in str(err.value) and "--speculative-eagle-topk 2" in str(err.value)


@pytest.mark.parametrize("draft, method, expected", [
    (None, None, "hsd"), ("sampled", "rrs", "rrs"), ("topk", None, "target-only"),
    ("topk", "target-only", "target-only"),
])
def test_tree_method_pairs(clean_env, draft, method, expected):
    if draft:
        clean_env.setenv("SGLANG_HSD_TREE_DRAFT", draft)
    if method:
        clean_env.setenv("SGLANG_HSD_VERIFY_METHOD", method)
    config = PluginConfig.from_env(topk=3)
    assert (config.verify_method, config.tree_draft, config.is_tree) == (
        expected, draft or "sampled", True)


@pytest.mark.parametrize("draft, method", [
    ("sampled", "target-only"), ("sampled", "tokenwise"), ("topk", "hsd"), ("topk", "rrs")])
def test_unpaired_tree_methods_refused_naming_both_flags(clean_env, draft, method):
    clean_env.setenv("SGLANG_HSD_TREE_DRAFT", draft)
    clean_env.setenv("SGLANG_HSD_VERIFY_METHOD", method)
    with pytest.raises(ValueError, match="--hsd-verify-method.*--hsd-tree-draft"):
        PluginConfig.from_env(topk=2)


def test_chain_refuses_tree_only_flags(clean_env):
    clean_env.setenv("SGLANG_HSD_TREE_DRAFT", "topk")
    with pytest.raises(ValueError, match="--hsd-tree-draft"):
        PluginConfig.from_env(topk=1)
    clean_env.delenv("SGLANG_HSD_TREE_DRAFT")
    clean_env.setenv("SGLANG_HSD_VERIFY_METHOD", "rrs")
    with pytest.raises(ValueError, match="--hsd-verify-method"):
        PluginConfig.from_env(topk=1)


def test_cli_tree_draft_flag(plugin_loaded, clean_env):
    import argparse
    import os

    from sglang.srt.server_args import ServerArgs

    clean_env.setenv("SGLANG_HSD_TREE_DRAFT", "sampled")
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    parser.parse_args(["--model-path", "x", "--hsd-tree-draft", "topk",
                       "--hsd-verify-method", "target-only"])
    assert os.environ["SGLANG_HSD_TREE_DRAFT"] == "topk"
    assert os.environ["SGLANG_HSD_VERIFY_METHOD"] == "target-only"


@pytest.mark.parametrize("draft, method", [("topk", "target-only"), ("sampled", "rrs")])
def test_tree_worker_factory_reads_the_tree_configuration(plugin_loaded, clean_env, draft, method):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    clean_env.setenv("SGLANG_HSD_TREE_DRAFT", draft)
    clean_env.setenv("SGLANG_HSD_VERIFY_METHOD", method)
    worker = SpeculativeAlgorithm.from_string("HSD").create_worker(args_namespace(**TREE))
    config = worker.keywords["plugin_config"]
    assert (config.verify_method, config.tree_draft, config.topk) == (method, draft, 2)
    assert not worker.keywords["exit_config"].enabled  # its chain rule is not the tree's


def test_draft_temperature_scale(plugin_loaded, clean_env):
    """--hsd-draft-temperature-scale: parsed for sampled trees, refused (naming the flags) where
    it cannot apply and for values that are not positive finite numbers, before models load."""
    clean_env.setenv("SGLANG_HSD_DRAFT_TEMPERATURE_SCALE", "0.5")
    assert PluginConfig.from_env(topk=2).draft_temperature_scale == 0.5
    _validate()
    for topk, draft in ((1, None), (2, "topk")):
        if draft:
            clean_env.setenv("SGLANG_HSD_TREE_DRAFT", draft)
            clean_env.setenv("SGLANG_HSD_VERIFY_METHOD", "target-only")
        with pytest.raises(ValueError, match="--hsd-draft-temperature-scale.*sampled trees only"):
            PluginConfig.from_env(topk=topk)
    with pytest.raises(ValueError, match="--hsd-draft-temperature-scale"):
        _validate(speculative_eagle_topk=1, speculative_num_draft_tokens=4)
    clean_env.delenv("SGLANG_HSD_TREE_DRAFT")
    clean_env.delenv("SGLANG_HSD_VERIFY_METHOD")
    for bad in ("0", "-1", "inf", "nan", "sharp"):
        clean_env.setenv("SGLANG_HSD_DRAFT_TEMPERATURE_SCALE", bad)
        with pytest.raises(ValueError, match="--hsd-draft-temperature-scale.*positive finite"):
            PluginConfig.from_env(topk=2)
    clean_env.setenv("SGLANG_HSD_DRAFT_TEMPERATURE_SCALE", "1")
    assert PluginConfig.from_env(topk=1).draft_temperature_scale == 1.0


def test_cli_draft_temperature_scale_flag(plugin_loaded, clean_env):
    import argparse
    import os

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    parser.parse_args(["--model-path", "x", "--hsd-draft-temperature-scale", "0.25"])
    assert float(os.environ["SGLANG_HSD_DRAFT_TEMPERATURE_SCALE"]) == 0.25
    with pytest.raises(SystemExit):  # argparse: not a number
        parser.parse_args(["--model-path", "x", "--hsd-draft-temperature-scale", "sharp"])


def test_argmax_first_tree_draft(plugin_loaded, clean_env):
    """--hsd-tree-draft argmax-first: the level drafter with argmax-first children, verified by hsd
    (default) or rrs told the matching draft mode; the default stays sampled (Gumbel top-k)."""
    from sglang_hsd.tree_draft import CHILD_SAMPLERS

    default = PluginConfig.from_env(topk=2)
    assert default.tree_draft == "sampled" and default.child_sampler == "inverse_cdf" and default.sampled_tree
    clean_env.setenv("SGLANG_HSD_TREE_DRAFT", "argmax-first")
    config = PluginConfig.from_env(topk=2)
    assert (config.verify_method, config.child_sampler, config.sampled_tree) == ("hsd", "argmax_first_cdf", True)
    assert CHILD_SAMPLERS[config.child_sampler].draft_mode == "argmax-first"
    clean_env.setenv("SGLANG_HSD_TREE_RULE", "beam")
    assert PluginConfig.from_env(topk=2).tree_rule == "beam"
    _validate(speculative_num_draft_tokens=8)
    clean_env.setenv("SGLANG_HSD_VERIFY_METHOD", "target-only")
    with pytest.raises(ValueError, match="verified losslessly by"):
        PluginConfig.from_env(topk=2)
    clean_env.setenv("SGLANG_HSD_VERIFY_METHOD", "rrs")
    assert PluginConfig.from_env(topk=2).verify_method == "rrs"
