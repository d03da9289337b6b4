"""``benchmarks/gpu_check.py`` on CPU: the dry-run listing, and the plumbing of the sections in the
tiny ``--smoke-cpu`` configuration (Triton under TRITON_INTERPRET=1), so the GPU run is not the
first time this code runs."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from benchmarks import gpu_check, gpu_timing
from benchmarks.gpu_report import junit_rows, verbose_rows


def _no_section_may_run(monkeypatch):
    def refuse(ctx):
        raise AssertionError("a dry run must not run a section")

    monkeypatch.setattr(gpu_check, "SECTIONS", [replace(s, run=refuse) for s in gpu_check.SECTIONS])


@pytest.mark.parametrize("quick,chain,tree", [(False, 128, 160), (True, 32, 40)])
def test_dry_run_lists_every_section_and_configuration_and_runs_nothing(monkeypatch, capsys, quick, chain, tree):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _no_section_may_run(monkeypatch)
    assert gpu_check.main(["--dry-run", *(["--quick"] if quick else [])]) == 0
    out = capsys.readouterr().out
    for section in ("kernel-tests", "timing-chain", "timing-tree"):
        assert f"## {section}:" in out
    assert f"- {chain} configurations (" in out and f"- {tree} configurations (" in out
    config_lines = [line for line in out.splitlines() if " backend=" in line]
    assert len(config_lines) == chain + tree
    assert all(line.endswith("would skip: no CUDA device") for line in config_lines)
    assert "tests/gpu/test_chain_kernels.py" in out and "tests/gpu/test_tree_kernels.py" in out
    # The biggest shape fits the memory limit (about 10 GB), so nothing is skipped for memory.
    assert "GB >" not in out


def test_full_grid_matches_the_documented_sizes():
    configs = gpu_timing.grid("tree") + gpu_timing.grid("chain")
    assert {c.batch for c in configs} == {1, 4, 16, 64} and {c.vocab for c in configs} == {32000, 128256}
    assert {c.nodes for c in configs} == {8, 16, 32, 64}
    assert {(c.kind, c.method) for c in configs if c.backend == "torch"} == {
        ("chain", "hsd"), ("chain", "tokenwise"), ("tree", "hsd"), ("tree", "target-only")}
    largest = max(configs, key=lambda c: gpu_timing.estimated_bytes(c))
    assert gpu_timing.estimated_bytes(largest) < gpu_timing.MEMORY_LIMIT_BYTES


def _smoke(monkeypatch, tmp_path, *extra):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    code = gpu_check.main(["--smoke-cpu", "--out", str(tmp_path), *extra])
    return code, json.loads((tmp_path / "gpu_check.json").read_text())


def test_smoke_timing_runs_the_kernels_and_writes_the_report(monkeypatch, tmp_path, capsys):
    code, report = _smoke(monkeypatch, tmp_path, "--sections", "timing-chain,timing-tree")
    assert code == 0
    sections = {s["name"]: s for s in report["sections"]}
    assert [s["status"] for s in sections.values()] == ["passed", "passed"]
    rows = sections["timing-chain"]["rows"] + sections["timing-tree"]["rows"]
    assert all(r["status"] == "ok" and r["median_us"] > 0 for r in rows)
    kernel_rows = {(r["kind"], r["method"]) for r in rows if r["resolved"] == "triton"}
    assert kernel_rows == {("chain", "hsd"), ("chain", "tokenwise"), ("tree", "hsd"), ("tree", "target-only")}
    run = report["run"]
    assert run["commit"] and run["torch"] == torch.__version__ and "--smoke-cpu" in run["command"]
    markdown = (tmp_path / "gpu_check.md").read_text()
    assert "| tree | rrs | 2 | 8 | 64 | torch |" in markdown and markdown in capsys.readouterr().out


def test_budget_guard_skips_new_configurations_and_says_so(monkeypatch, tmp_path):
    code, report = _smoke(monkeypatch, tmp_path, "--sections", "timing-chain", "--budget-s", "0")
    assert code == 0
    section = report["sections"][0]
    assert section["status"] == "partial (budget)"
    assert section["rows"] and all(r["status"] == "skipped: budget" for r in section["rows"])


def test_a_failing_section_is_recorded_and_the_next_one_runs(monkeypatch, tmp_path):
    def broken(ctx):
        raise RuntimeError("kernel exploded")

    first = gpu_check.Section("broken", "always raises", plan=lambda ctx: [], run=broken)
    monkeypatch.setattr(gpu_check, "SECTIONS", [first, *gpu_check.SECTIONS])
    code, report = _smoke(monkeypatch, tmp_path, "--sections", "broken,timing-chain")
    assert code == 1
    statuses = {s["name"]: s["status"] for s in report["sections"]}
    assert statuses == {"broken": "failed: RuntimeError: kernel exploded", "timing-chain": "passed"}


def test_kernel_tests_section_runs_pytest_and_counts(monkeypatch, tmp_path):
    code, report = _smoke(monkeypatch, tmp_path, "--sections", "kernel-tests", "--pytest-k", "tokenwise and V64-K1")
    assert code == 0
    rows = report["sections"][0]["rows"]
    assert len(rows) == 3 and all(r["status"] == "passed" for r in rows)
    assert (tmp_path / "kernel_tests.log").read_text().count("PASSED") == 3


def test_kernel_tests_section_fails_when_nothing_ran(monkeypatch, tmp_path):
    code, report = _smoke(monkeypatch, tmp_path, "--sections", "kernel-tests", "--pytest-k", "no_such_test")
    assert code == 1
    assert report["sections"][0]["status"] == "failed"
    assert report["sections"][0]["rows"][-1]["status"].startswith("error: exit code 5")


def test_junit_and_verbose_parsing(tmp_path):
    xml = tmp_path / "x.xml"
    xml.write_text(
        '<testsuites><testsuite><testcase classname="tests.gpu.t" name="a" time="0.5"/>'
        '<testcase classname="tests.gpu.t" name="b" time="1"><failure message="AssertionError: rows differ">x'
        '</failure></testcase><testcase classname="tests.gpu.t" name="c"><skipped message="no CUDA"/></testcase>'
        "</testsuite></testsuites>")
    assert [r["status"] for r in junit_rows(xml)] == ["passed", "failed: AssertionError: rows differ",
                                                      "skipped: no CUDA"]
    lines = "tests/gpu/t.py::a[x-1] PASSED [ 50%]\ntests/gpu/t.py::b FAILED [100%]\nnoise\n"
    assert [(r["test"], r["status"]) for r in verbose_rows(lines)] == [
        ("tests/gpu/t.py::a[x-1]", "passed"), ("tests/gpu/t.py::b", "failed: see the log")]
