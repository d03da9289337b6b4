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
