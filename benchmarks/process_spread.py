"""How much one fixed workload's speed differs between fresh processes on this host.

A serving comparison starts one server per configuration, one after another, so every ratio
between two configurations also carries whatever makes one process on this machine faster than
the next. This script measures that part alone: ``--processes`` fresh Python processes per
setting, each packing the float32 weights of one decode step's linear layers (oneDNN, as
``--hsd-cpu-linear onednn-packed`` runs them; the shapes of a model's decoder MLPs, ``--shape``
times ``--layers``) and timing a one-row pass over all of them (``--passes``, median; the weights
far exceed the caches, so each pass streams them from memory as a batch-1 decode step does).
Settings alternate process by process: ``default`` (this environment) and ``thp`` (torch's
allocator asked for transparent huge pages, ``THP_MEM_ALLOC_ENABLE=1``, which decides how the
weights' pages are mapped).

Writes ``benchmarks/results/<name>.{json,md}``: each process's median ms, and per setting the
least, median and largest, and the largest over the least.

    PYTHONPATH=. python benchmarks/process_spread.py --processes 6
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.common import REPO_ROOT, RESULTS_DIR, benchmark_parser, start_run, write_results

SETTINGS = {"default": {}, "thp": {"THP_MEM_ALLOC_ENABLE": "1"}}


def one_process(shape: tuple[int, int], layers: int, passes: int, threads: int) -> dict:
    """Runs in the child: ``{"median_ms", "passes_ms", "huge_pages_kb"}`` of one-row passes over
    ``layers`` x (gate, up, down) packed products of an MLP of ``shape`` (hidden, intermediate)."""
    import time

    import torch

    from sglang_hsd.runtime.layers import pack_linear_weight, packed_linear

    torch.set_num_threads(threads)
    hidden, inner = shape
    weights = []
    for _ in range(layers):
        for out_features, in_features in ((inner, hidden), (inner, hidden), (hidden, inner)):
            weights.append((in_features, pack_linear_weight(torch.randn(out_features, in_features))))
    inputs = {n: torch.randn(1, n) for n in (hidden, inner)}

    def one_pass() -> float:
        started = time.perf_counter()
        for in_features, packed in weights:
            packed_linear(inputs[in_features], packed, None)
        return (time.perf_counter() - started) * 1000

    one_pass()  # oneDNN builds its kernels on the first call
    times = [one_pass() for _ in range(passes)]
    rollup = Path("/proc/self/smaps_rollup")  # Linux: the process's transparent huge pages
    lines = rollup.read_text().splitlines() if rollup.exists() else []
    huge = next((int(line.split()[1]) for line in lines if line.startswith("AnonHugePages")), None)
    return {"median_ms": round(statistics.median(times), 2), "passes_ms": [round(t, 2) for t in times],
            "huge_pages_kb": huge}


def run_child(setting: str, args) -> dict:
    paths = [str(REPO_ROOT), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
    env = {**os.environ, **SETTINGS[setting], "PYTHONPATH": os.pathsep.join(paths)}
    code = ("import json; from benchmarks.process_spread import one_process; "
            f"print(json.dumps(one_process({tuple(args.shape)}, {args.layers}, {args.passes}, {args.threads})))")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO_ROOT, check=True, capture_output=True,
                         text=True)
    return {"setting": setting, **json.loads(out.stdout.strip().splitlines()[-1])}


def summary(rows: list[dict]) -> dict[str, dict]:
    """Per setting: least, median and largest of the processes' medians, and largest / least."""
    out = {}
    for setting in SETTINGS:
        values = sorted(r["median_ms"] for r in rows if r["setting"] == setting)
        if values:
            out[setting] = {"processes": len(values), "least_ms": values[0],
                            "median_ms": round(statistics.median(values), 2), "largest_ms": values[-1],
                            "largest_over_least": round(values[-1] / values[0], 3)}
    return out


def markdown(rows: list[dict], stats: dict[str, dict], args) -> str:
    gb = args.layers * 3 * args.shape[0] * args.shape[1] * 4 / 1e9
    lines = [f"One-row passes over {args.layers} x (gate, up, down) packed float32 products of an MLP "
             f"{args.shape[0]} x {args.shape[1]} ({gb:.2f} GB of weights), {args.threads} threads, median "
             f"of {args.passes} passes per fresh process; settings alternate process by process.", "",
             "| setting | processes | least ms | median ms | largest ms | largest / least |",
             "|---|---|---|---|---|---|"]
    for setting, s in stats.items():
        lines.append(f"| {setting} | {s['processes']} | {s['least_ms']} | {s['median_ms']} | {s['largest_ms']} | "
                     f"{s['largest_over_least']:.3f} |")
    lines += ["", "| process | setting | median ms | huge pages kB |", "|---|---|---|---|"]
    for index, r in enumerate(rows):
        lines.append(f"| {index} | {r['setting']} | {r['median_ms']} | {r['huge_pages_kb']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--processes", type=int, default=6, help="fresh processes per setting")
    parser.add_argument("--shape", type=int, nargs=2, default=(1536, 8960), metavar=("HIDDEN", "INTERMEDIATE"),
                        help="the MLP's sizes (default: Qwen2.5-Coder-1.5B's)")
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--passes", type=int, default=9)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--name", default="process_spread")
    args = parser.parse_args(argv)
    for name, value in (("--processes", args.processes), ("--layers", args.layers), ("--passes", args.passes),
                        ("--threads", args.threads)):
        if value < 1:
            parser.error(f"{name} must be at least 1, got {value}")
    run = start_run(__file__, argv)
    rows = []
    for index in range(args.processes):
        for setting in SETTINGS:
            rows.append(run_child(setting, args))
            print(f"[spread] {index} {setting}: {rows[-1]['median_ms']} ms", flush=True)
    stats = summary(rows)
    text = markdown(rows, stats, args)
    write_results(RESULTS_DIR / args.name, {"args": {k: (list(v) if isinstance(v, tuple) else v)
                                                     for k, v in vars(args).items()},
                                            "rows": rows, "summary": stats}, text, run)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
