"""Reading and writing for the GPU check (``benchmarks/gpu_check.py``): the run record, the
``--dry-run`` listing, JUnit XML from pytest, and the Markdown / JSON report."""

from __future__ import annotations

import json
import platform
import re
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from benchmarks.common import command_line, git_commit


def environment(cuda: bool) -> dict:
    """Versions and the device: torch, its CUDA, triton, the GPU's name, memory and capability."""
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    info = {"python": platform.python_version(), "torch": torch.__version__, "torch_cuda": torch.version.cuda,
            "triton": triton_version, "gpu": None}
    if cuda:
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_memory_gb=round(props.total_memory / 1e9, 1),
                    compute_capability=f"{props.major}.{props.minor}")
    return info


def run_record(script: str, argv: list[str] | None, ctx) -> dict:
    """Commit ("unknown" without git), command line, environment and the check's settings."""
    return {"commit": git_commit(), "command": command_line(script, argv), **environment(ctx.cuda),
            "device": ctx.device, "smoke_cpu": ctx.smoke, "quick": ctx.quick}


def timing_plan(configs, device_present: bool) -> list[str]:
    """``--dry-run`` lines of a timing grid: the count, then each configuration and its fate."""
    from benchmarks.gpu_timing import MEMORY_LIMIT_BYTES, estimated_bytes, resolved_backend

    shapes = len({c.shape() for c in configs})
    lines = [f"{len(configs)} configurations ({shapes} shapes)"]
    for config in configs:
        estimate = estimated_bytes(config)
        fate = "would run"
        if estimate > MEMORY_LIMIT_BYTES:
            fate = f"would skip: estimated {estimate / 1e9:.1f} GB > {MEMORY_LIMIT_BYTES / 1e9:.0f} GB"
        elif not device_present:
            fate = "would skip: no CUDA device"
        lines.append(f"{config.label()} -> {resolved_backend(config, True)} on a GPU, "
                     f"~{estimate / 1e9:.2f} GB: {fate}")
    return lines


def print_plan(ctx, sections, budget_s: float) -> None:
    """The ``--dry-run`` listing on stdout."""
    present = ctx.cuda or ctx.smoke
    print(f"# GPU check plan (dry run: nothing is executed)\n\ndevice: {ctx.device}"
          f"{' (smoke: TRITON_INTERPRET=1)' if ctx.smoke else ''}; CUDA available: {ctx.cuda}; "
          f"budget: no new timing configuration after {budget_s:.0f} s; results would go to {ctx.out_dir}")
    if not present:
        print("every section would skip: no CUDA device (torch.cuda.is_available() is False); "
              "--smoke-cpu runs a tiny CPU version")
    for section in sections:
        print(f"\n## {section.name}: {section.description}")
        for line in section.plan(ctx):
            print(f"- {line}")
        if not present:
            print("- would skip: no CUDA device")


def junit_rows(path: Path) -> list[dict]:
    """One row per test case of a pytest JUnit XML file: test id, status ("passed", "failed: ...",
    "error: ...", "skipped: ..."), seconds."""
    rows = []
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        status = "passed"
        for tag in ("failure", "error", "skipped"):
            found = case.find(tag)
            if found is not None:
                message = (found.get("message") or found.text or "").strip().splitlines()
                status = f"{'failed' if tag == 'failure' else tag}: {message[0] if message else ''}"
                break
        rows.append({"test": f"{case.get('classname')}::{case.get('name')}", "status": status,
                     "seconds": float(case.get("time") or 0.0)})
    return rows


VERBOSE_LINE = re.compile(r"^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED)")


def verbose_rows(output: str) -> list[dict]:
    """Rows (as ``junit_rows``) from ``pytest -v`` lines, for a run stopped before its XML was written."""
    rows = []
    for line in output.splitlines():
        found = VERBOSE_LINE.match(line)
        if found:
            outcome = {"PASSED": "passed", "FAILED": "failed: see the log", "ERROR": "error: see the log",
                       "SKIPPED": "skipped"}[found.group(2)]
            rows.append({"test": found.group(1), "status": outcome, "seconds": None})
    return rows


def _counts(rows: list[dict]) -> str:
    kinds = [row["status"].split(":")[0] for row in rows]
    return ", ".join(f"{kinds.count(k)} {k}" for k in ("passed", "failed", "error", "skipped") if kinds.count(k))


def _summary(result: dict) -> str:
    rows = result["rows"]
    if result["name"] == "kernel-tests":
        return _counts(rows) or "no tests ran"
    timed = sum(1 for r in rows if r.get("status") == "ok")
    skipped = [r["status"] for r in rows if str(r.get("status", "")).startswith("skipped")]
    errors = sum(1 for r in rows if str(r.get("status", "")).startswith(("error", "failed")))
    return f"{timed} timed, {len(skipped)} skipped, {errors} errors" if rows else ""


def _kernel_test_failures(results: list[dict]) -> list[str]:
    failed = [row for result in results if result["name"] == "kernel-tests" for row in result["rows"]
              if row["status"].startswith(("failed", "error"))]
    lines = [f"- `{row['test']}`: {row['status']}" for row in failed[:40]]
    return ["", "## Kernel test failures", "", *lines, ""] if failed else []


def timing_table(rows: list[dict]) -> list[str]:
    """One line per (kind, method, shape): the time of the default path (``backend="auto"``, or the
    kernel named in a smoke run), the torch reference's and their ratio."""
    merged: dict[tuple, dict] = {}
    for row in rows:
        key = (row["kind"], row["method"], row["batch"], row["nodes"], row["vocab"])
        merged.setdefault(key, {})["torch" if row["backend"] == "torch" else "default"] = row
    lines = ["| kind | method | B | N | V | default path | default us | torch us | torch / default | peak GB | note |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (kind, method, batch, nodes, vocab), pair in merged.items():
        auto, torch_row = pair.get("default", {}), pair.get("torch", {})
        auto_us, torch_us = auto.get("median_us"), torch_row.get("median_us")
        ratio = f"{torch_us / auto_us:.2f}x" if auto_us and torch_us else ""
        notes = "; ".join(f"{name}: {r['status']}" for name, r in pair.items() if r.get("status") != "ok")
        lines.append(f"| {kind} | {method} | {batch} | {nodes} | {vocab} | {auto.get('resolved', '')} | "
                     f"{auto_us if auto_us is not None else ''} | {torch_us if torch_us is not None else ''} | "
                     f"{ratio} | {auto.get('peak_gb') or ''} | {notes} |")
    return lines


def _status_table(results: list[dict]) -> list[str]:
    return ["| section | status | summary | seconds |", "|---|---|---|---|",
            *(f"| {r['name']} | {r['status']} | {_summary(r)} | {r['seconds']} |" for r in results)]


def summary(results: list[dict]) -> str:
    """Section statuses and kernel test failures (the report's head, repeated at the end of stdout)."""
    return "\n".join(["## Summary", "", *_status_table(results), *_kernel_test_failures(results)]) + "\n"


def markdown(record: dict, results: list[dict], wall_s: float) -> str:
    lines = ["# GPU check", "",
             f"- commit: `{record['commit']}`", f"- command: `{record['command']}`",
             f"- device: {record.get('gpu') or record['device']}"
             f"{' (smoke run on CPU under TRITON_INTERPRET=1: times mean nothing)' if record['smoke_cpu'] else ''}",
             f"- torch {record['torch']} (CUDA {record['torch_cuda']}), triton {record['triton']}, "
             f"Python {record['python']}", f"- wall time: {wall_s:.1f} s", "", *_status_table(results)]
    lines += _kernel_test_failures(results)
    for result in results:
        if result["name"].startswith("timing-") and result["rows"]:
            lines += ["", f"## {result['name']}: {result['description']}", "", *timing_table(result["rows"])]
        elif result["name"] == "draft-round" and result["rows"]:
            from benchmarks.gpu_draft_timing import draft_table

            lines += ["", f"## {result['name']}: {result['description']}", "", *draft_table(result["rows"])]
    return "\n".join(lines) + "\n"


def write_report(out_dir: Path, record: dict, results: list[dict], wall_s: float) -> str:
    """Write ``gpu_check.json`` and ``gpu_check.md`` in ``out_dir``; returns the Markdown."""
    text = markdown(record, results, wall_s)
    payload = {"run": {**record, "wall_s": round(wall_s, 1)}, "sections": results}
    (out_dir / "gpu_check.json").write_text(json.dumps(payload, indent=1) + "\n")
    (out_dir / "gpu_check.md").write_text(text)
    return text
