"""The command line: help texts and the check subcommand's verdicts."""

import subprocess
import sys

import pytest

from sglang_hsd import cli


def test_help_lists_every_subcommand(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for name in ("check", "demo"):
        assert name in out


def test_check_marks_each_method(capsys):
    code = cli.main(["check", "--worlds", "2", "--lengths", "2", "3", "--sampled", "20000"])
    out = capsys.readouterr().out
    assert code == 0
    rows = {line.split()[0]: line for line in out.splitlines() if line.split() and line.split()[0] in
            ("hsd", "tokenwise", "hsd-paper", "greedy")}
    assert "lossless" in rows["hsd"] and "LOSSY" not in rows["hsd"]
    assert "lossless" in rows["tokenwise"] and "LOSSY" not in rows["tokenwise"]
    assert "LOSSY" in rows["hsd-paper"]


def test_check_fails_when_a_lossless_claim_breaks(monkeypatch, capsys):
    # Swap the capped rule's law for the uncapped one: check must exit 1 and say so.
    from sglang_hsd.verify.oracles import exact

    monkeypatch.setitem(exact.OUTCOME_LAWS, "hsd", exact.OUTCOME_LAWS["hsd-paper"])
    exact._round_law_cached.cache_clear()
    try:
        code = cli.main(["check", "--worlds", "1", "--lengths", "2", "3", "--sampled", "0"])
    finally:
        exact._round_law_cached.cache_clear()
    assert code == 1
    assert "FAILED" in capsys.readouterr().out


def test_console_script_entry_point_runs():
    out = subprocess.run(
        [sys.executable, "-m", "sglang_hsd.cli", "check", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "--num-draft" in out


def test_installed_subcommands_are_discovered_from_the_entry_point_group(monkeypatch):
    import importlib.metadata

    from eagle_heads.cli import run_train_heads

    train_heads = importlib.metadata.EntryPoint(
        name="train-heads", value="eagle_heads.cli:add_train_heads_parser", group=cli.COMMANDS_ENTRY_POINT_GROUP)

    def entry_points(group=None):
        return [train_heads] if group == cli.COMMANDS_ENTRY_POINT_GROUP else []

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    args = cli.build_parser().parse_args(["train-heads", "--model", "tiny", "--no-exit"])
    assert args.func is run_train_heads and args.no_exit


def test_pyproject_registers_train_heads_in_the_entry_point_group():
    import importlib
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    module, _, name = pyproject["project"]["entry-points"][cli.COMMANDS_ENTRY_POINT_GROUP]["train-heads"].partition(":")
    assert callable(getattr(importlib.import_module(module), name))


def test_the_inference_package_never_imports_the_training_package():
    """Neither an import statement nor a module name handed to an importer (a string that is
    exactly a dotted ``eagle_heads`` path)."""
    import ast
    import re
    from pathlib import Path

    offenders = []
    for path in (Path(__file__).parents[1] / "sglang_hsd").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [node.value] if isinstance(node, ast.Constant) and isinstance(node.value, str) else []
            offenders += [f"{path}: {name}" for name in names if re.fullmatch(r"eagle_heads(\.\w+)*", name)]
    assert offenders == []


def test_generate_rejects_a_bad_draft_length_before_loading_a_model():
    with pytest.raises(ValueError, match="--draft-length must be fixed or adaptive"):
        cli.main(["generate", "--model", "no-such-model", "--draft-length", "adaptive:0.4:8:1"])
    with pytest.raises(ValueError, match="threshold"):
        cli.main(["generate", "--model", "no-such-model", "--draft-length", "adaptive:1.5"])


def test_generate_rejects_a_bad_tree_before_loading_a_model():
    with pytest.raises(ValueError, match="--tree must be none or D:k:N"):
        cli.main(["generate", "--model", "no-such-model", "--tree", "4x2x8"])


def test_generate_refuses_a_half_precision_exit_drafter_before_loading_a_model():
    with pytest.raises(ValueError, match="--drafter-precision bf16 needs a model:<name> level"):
        cli.main(["generate", "--model", "no-such-model", "--levels", "exit:8,target", "--drafter-precision", "bf16"])
    with pytest.raises(SystemExit):  # argparse: not one of the choices
        cli.main(["generate", "--model", "no-such-model", "--drafter-precision", "int3"])


def test_generate_measures_a_separate_drafters_precision_by_default():
    from sglang_hsd.runtime.cli import _drafter_precision

    assert _drafter_precision("model:qwen2.5-coder-0.5b,target", None) == "auto"
    assert _drafter_precision("model:qwen2.5-coder-0.5b,target", "bf16") == "bf16"
    assert _drafter_precision("exit:8,target", None) == "fp32"
    assert _drafter_precision("exit:8,target", "auto") == "fp32"  # the target's own numbers: nothing to choose


@pytest.mark.parametrize("option,value,message", [
    ("--drafter", "target", "--drafter"),
    ("--new-tokens", "0", "--new-tokens"),
    ("--fixed", "1-x", "--fixed"),
    ("--adaptive", "adaptive:0.45:16", "threshold"),
    ("--trees", "4x2", "--trees"),
    ("--kernel-paths", "mkl,int8", "kernel_path"),
    ("--drafter-precisions", "fp32,int3", "--drafter-precisions must be one of"),
    ("--lookups", "3:zero", "--lookups must be"),
    ("--lookups", "3:0:8", "--lookups must be"),
    ("--middles", "24:4", "--middles must be <exit layer>:<drafts>:<exit buffer>"),
    ("--middles", "24:0:8", "--middles must be"),
])
def test_round_plan_rejects_bad_options_before_loading_a_model(option, value, message):
    args = ["plan", "--model", "no-such-model", "--drafter", "model:no-such-drafter", option, value]
    with pytest.raises(ValueError, match=message):
        cli.main(args)


def test_round_plan_refuses_half_precision_for_an_exit_drafter():
    with pytest.raises(ValueError, match="--drafter-precisions: an exit drafter runs the target's own weights"):
        cli.main(["plan", "--model", "no-such-model", "--drafter", "exit:8", "--drafter-precisions", "bf16"])


def test_round_plan_refuses_a_lookup_verified_by_an_exit_drafter():
    with pytest.raises(ValueError, match="--lookups: n:N_d:N_1 needs a separate drafter model"):
        cli.main(["plan", "--model", "no-such-model", "--drafter", "exit:8", "--lookups", "3:4:8"])


def test_round_plan_refuses_a_middle_exit_above_an_exit_drafter():
    with pytest.raises(ValueError, match="--middles: an exit between the drafter and the target needs a separate"):
        cli.main(["plan", "--model", "no-such-model", "--drafter", "exit:8", "--middles", "24:4:8"])


def test_generate_offers_exactly_the_runtimes_drafter_precisions():
    from sglang_hsd.runtime.cli import DRAFTER_PRECISION_CHOICES
    from sglang_hsd.runtime.kernel_setup import DRAFTER_PRECISION_OPTIONS

    assert tuple(DRAFTER_PRECISION_CHOICES) == tuple(DRAFTER_PRECISION_OPTIONS)
