"""The GPU check: the Triton verifier kernels against their torch references, then hot-path timings,
in one command with one report, on a machine with only torch, triton, numpy and pytest.

    PYTHONPATH=. python benchmarks/gpu_check.py [--out DIR] [--quick] [--budget-s 240] [--sections a,b]
    PYTHONPATH=. python benchmarks/gpu_check.py --dry-run     # list sections and configurations, run nothing
    PYTHONPATH=. python benchmarks/gpu_check.py --smoke-cpu   # tiny CPU version under TRITON_INTERPRET=1

Sections (``SECTIONS``; a new check is one more ``Section`` appended there):

* ``kernel-tests``: ``pytest tests/gpu -m gpu`` in a subprocess (a kernel fault that poisons the
  CUDA context does not take the timings down with it); pass / fail counts and every failure's
  message from its JUnit XML.
* ``draft-round``: the sampled-tree round eagerly and as a CUDA-graph replay
  (``benchmarks/gpu_draft_timing.py``).
* ``timing-chain``, ``timing-tree``: the grid of ``benchmarks/gpu_timing.py``.

A section that raises is recorded as failed and the next one runs. The report (Markdown on stdout,
``gpu_check.json`` and ``gpu_check.md`` in ``--out``, default ``$OUT`` or a new temporary folder)
is rewritten after every section, so a run killed from outside still leaves what it finished. It
records the commit, torch / triton / CUDA versions, the GPU, the command, the wall time and each
section's status. ``--budget-s`` counts from the start: after it no new timing configuration
starts (the kernel tests get at most ``KERNEL_TESTS_TIMEOUT_S`` of it), and the report lists what
was skipped. The exit status is 1 when a section failed, else 0.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from benchmarks.common import REPO_ROOT

SMOKE_ENV = "SGLANG_HSD_GPU_SMOKE"  # read by tests/gpu/_support.py
GPU_TESTS = "tests/gpu"
DEFAULT_BUDGET_S = 240.0
# The kernel tests take about a minute on a GPU by estimate; past this they are stopped (hung
# kernel) so that the timings still run within the budget.
KERNEL_TESTS_TIMEOUT_S = 180.0


@dataclass
class CheckContext:
    """What every section gets.

    Fields:
        out_dir: where result files go.
        device: "cuda" or "cpu" (``--smoke-cpu``, or no GPU).
        cuda: a CUDA device is present and used.
        smoke: the tiny CPU configuration under ``TRITON_INTERPRET=1``.
        quick: the reduced timing grid.
        pytest_k: a ``-k`` expression selecting kernel tests ("" for all).
        deadline: ``time.monotonic()`` after which no new timing configuration starts.
        log: progress lines (stderr, so stdout is the report).
    """

    out_dir: Path
    device: str
    cuda: bool
    smoke: bool
    quick: bool
    deadline: float
    pytest_k: str = ""
    log: Callable[[str], None] = field(default=lambda line: print(line, file=sys.stderr, flush=True))


@dataclass(frozen=True)
class Section:
    """One named part of the check.

    Fields:
        name: what ``--sections`` selects and the report shows.
        description: one line.
        plan: context -> lines describing what would run (``--dry-run``; must run no kernel).
        run: context -> result rows (dicts with a ``"status"``); raising marks the section failed.
    """

    name: str
    description: str
    plan: Callable[[CheckContext], list[str]]
    run: Callable[[CheckContext], list[dict]]


def _kernel_test_command(junit: Path, pytest_k: str = "") -> list[str]:
    # -v: one line per test, so a run stopped by the timeout still says which tests finished.
    return [sys.executable, "-m", "pytest", GPU_TESTS, "-m", "gpu", "-v", "-p", "no:cacheprovider", "--tb=short",
            "--durations=10", f"--junitxml={junit}", *(["-k", pytest_k] if pytest_k else [])]


def plan_kernel_tests(ctx: CheckContext) -> list[str]:
    files = sorted(p.relative_to(REPO_ROOT).as_posix() for p in (REPO_ROOT / GPU_TESTS).glob("test_*.py"))
    env = f"{SMOKE_ENV}=1 TRITON_INTERPRET=1 " if ctx.smoke else ""
    select = f" -k {ctx.pytest_k!r}" if ctx.pytest_k else ""
    return [f"command: {env}python -m pytest {GPU_TESTS} -m gpu{select} (timeout {KERNEL_TESTS_TIMEOUT_S:.0f} s)",
            f"test files: {', '.join(files)}"]


def run_kernel_tests(ctx: CheckContext) -> list[dict]:
    from benchmarks.gpu_report import junit_rows, verbose_rows

    junit, log_path = ctx.out_dir / "kernel_tests.xml", ctx.out_dir / "kernel_tests.log"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    if ctx.smoke:
        env.update({SMOKE_ENV: "1", "TRITON_INTERPRET": "1"})
    timeout = max(30.0, min(KERNEL_TESTS_TIMEOUT_S, ctx.deadline - time.monotonic()))
    command = _kernel_test_command(junit, ctx.pytest_k)
    ctx.log(f"kernel-tests: {' '.join(command)} (timeout {timeout:.0f} s)")
    # Output goes straight to the log file, so a run killed from outside still leaves it.
    with open(log_path, "w") as log_file:
        try:
            done = subprocess.run(command, cwd=REPO_ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            done = None
    output = log_path.read_text(errors="replace")
    if done is None:
        stopped = {"test": "pytest", "status": f"error: stopped after {timeout:.0f} s; output so far in {log_path}",
                   "seconds": timeout}
        return verbose_rows(output) + [stopped]
    rows = junit_rows(junit) if junit.exists() else []
    if done.returncode != 0 and not any(r["status"].startswith(("failed", "error")) for r in rows):
        tail = " | ".join(output.strip().splitlines()[-5:])
        rows.append({"test": "pytest", "status": f"error: exit code {done.returncode}: {tail}", "seconds": None})
    return rows


def _timing_section(kind: str) -> Section:
    def plan(ctx: CheckContext) -> list[str]:
        from benchmarks.gpu_report import timing_plan
        from benchmarks.gpu_timing import grid

        return timing_plan(grid(kind, ctx.quick, ctx.smoke), ctx.cuda or ctx.smoke)

    def run(ctx: CheckContext) -> list[dict]:
        from benchmarks.gpu_timing import grid, run_grid

        return run_grid(grid(kind, ctx.quick, ctx.smoke), ctx.device, ctx.deadline, log=ctx.log)

    noun = "verify_chain (hsd, tokenwise; K = N - 1)" if kind == "chain" else "verify_tree (hsd, rrs, target-only)"
    return Section(f"timing-{kind}", f"median microseconds per hot-path call of {noun}", plan, run)


def _draft_round_section() -> Section:
    def plan(ctx: CheckContext) -> list[str]:
        from benchmarks.gpu_draft_timing import plan_lines

        return plan_lines(ctx.quick) if ctx.cuda else ["skipped without CUDA (no smoke version: CUDA graphs)"]

    def run(ctx: CheckContext) -> list[dict]:
        if not ctx.cuda:
            return [{"shape": [], "batch": 0, "vocab": 0, "status": "skipped: CUDA graphs need a CUDA device"}]
        from benchmarks.gpu_draft_timing import run_draft_rounds

        return run_draft_rounds(ctx.quick, ctx.deadline, log=ctx.log)

    return Section("draft-round", "sampled-tree round (drafter + tiny head + verify_tree hsd): eager vs CUDA-graph "
                   "replay, replay equal to eager", plan, run)


SECTIONS: list[Section] = [
    Section("kernel-tests", "pytest tests/gpu -m gpu: Triton kernels vs torch references, token for token",
            plan_kernel_tests, run_kernel_tests),
    _draft_round_section(),
    _timing_section("chain"),
    _timing_section("tree"),
]


def section_status(rows: list[dict]) -> str:
    """"failed" if a row failed or errored, "partial (budget)" if the budget cut it, else "passed"."""
    statuses = [str(row.get("status", "")) for row in rows]
    if any(s.startswith(("failed", "error")) for s in statuses):
        return "failed"
    if any(s == "skipped: budget" for s in statuses):
        return "partial (budget)"
    return "passed"


def run_section(section: Section, ctx: CheckContext) -> dict:
    """Run one section; an exception becomes a failed result (the next section still runs)."""
    import traceback

    started = time.monotonic()
    ctx.log(f"== {section.name}: {section.description}")
    if not (ctx.cuda or ctx.smoke):
        return {"name": section.name, "description": section.description, "rows": [], "seconds": 0.0,
                "status": "skipped: no CUDA device (torch.cuda.is_available() is False)"}
    try:
        rows = section.run(ctx)
        status = section_status(rows)
    except Exception as error:  # noqa: BLE001 - recorded; the check goes on with the next section
        ctx.log(traceback.format_exc())
        rows, status = [], f"failed: {type(error).__name__}: {error}"
    return {"name": section.name, "description": section.description, "rows": rows,
            "seconds": round(time.monotonic() - started, 1), "status": status}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="result folder (default: $OUT, else a new temporary folder)")
    parser.add_argument("--dry-run", action="store_true", help="list sections and configurations; run no kernel")
    parser.add_argument("--quick", action="store_true", help="the reduced timing grid")
    parser.add_argument("--smoke-cpu", action="store_true",
                        help="tiny configuration on CPU under TRITON_INTERPRET=1 (checks the plumbing, times nothing real)")
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                        help="seconds from the start after which no new timing configuration starts")
    parser.add_argument("--pytest-k", default="", metavar="EXPR", help="run only the kernel tests pytest -k EXPR selects")
    parser.add_argument("--sections", default=",".join(s.name for s in SECTIONS),
                        help="comma-separated section names to run, in registry order")
    args = parser.parse_args(argv)
    unknown = set(args.sections.split(",")) - {s.name for s in SECTIONS}
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; known: {[s.name for s in SECTIONS]}")
    return args


def _context(args: argparse.Namespace, started: float) -> CheckContext:
    import torch

    cuda = torch.cuda.is_available() and not args.smoke_cpu
    out = args.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    if out is None and not args.dry_run:
        out = Path(tempfile.mkdtemp(prefix="gpu_check-"))
    return CheckContext(out_dir=out or Path("(not written)"), device="cuda" if cuda else "cpu", cuda=cuda,
                        smoke=args.smoke_cpu, quick=args.quick, deadline=started + args.budget_s,
                        pytest_k=args.pytest_k)


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    args = parse_args(argv)
    if args.smoke_cpu:
        # Must precede the first import of triton (kernels decide interpreted or compiled then).
        os.environ["TRITON_INTERPRET"] = "1"
    from benchmarks.gpu_report import print_plan, run_record, summary, write_report

    ctx = _context(args, started)
    chosen = [s for s in SECTIONS if s.name in args.sections.split(",")]
    if args.dry_run:
        print_plan(ctx, chosen, args.budget_s)
        return 0
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    record = run_record(__file__, argv, ctx)
    results: list[dict] = []
    write_report(ctx.out_dir, record, results, time.monotonic() - started)  # the environment, at least
    for section in chosen:
        results.append(run_section(section, ctx))
        markdown = write_report(ctx.out_dir, record, results, time.monotonic() - started)
    print(markdown)
    # Again at the end, where a truncated console keeps it: statuses and kernel test failures.
    print(summary(results))
    print(f"written: {ctx.out_dir / 'gpu_check.json'}, {ctx.out_dir / 'gpu_check.md'}")
    return 1 if any(r["status"].startswith("failed") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
