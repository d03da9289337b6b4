"""The server goodput goals, row by row, from a ``bench_serving_standalone.py`` result.

For every (prompt set, temperature, concurrency) where the adaptive default and no speculation
both ran: plain decoding's output tok/s, the default's ratio to it, the fastest fixed
configuration measured in the same row (``FIXED``: HSD chain K = --num-steps, the sampled tree,
SGLang's STANDALONE) and the default's ratio to that, each against its goal:

* concurrency 1: at least ``SINGLE_REQUEST_GOALS[(prompt set, T)]`` times no speculation;
* every row: at least ``ROW_FLOOR`` times no speculation and ``ROW_FLOOR`` times the best fixed
  configuration.

Ratios are within one run (one machine, one command): a row's ratio never mixes runs.

    python benchmarks/goodput_goals.py benchmarks/results/goodput30_humaneval_avx2.json
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from benchmarks.serving_harness import fmt

DEFAULT = "hsd-adaptive-k8"
PLAIN = "none"
FIXED = ("hsd", "hsd-tree", "standalone")
# (prompt set, temperature) -> the least ratio to no speculation at concurrency 1.
SINGLE_REQUEST_GOALS = {("sharegpt", 0.0): 1.5, ("humaneval", 0.0): 2.5,
                        ("sharegpt", 1.0): 1.3, ("humaneval", 1.0): 2.0}
ROW_FLOOR = 0.95


def goal_rows(records: Sequence[dict], default: str = DEFAULT, plain: str = PLAIN,
              fixed: Sequence[str] = FIXED) -> list[dict]:
    """One dict per row where ``default`` and ``plain`` both completed, in the records' order:
    ``prompt_set``, ``temperature``, ``concurrency``, ``plain_tok_s``, ``default_tok_s``,
    ``vs_plain``, ``best_fixed`` (name or None), ``best_fixed_vs_plain``, ``vs_best_fixed``,
    ``goal`` (the least ``vs_plain`` the row asks for), ``met`` (both goals held; None where
    no fixed configuration ran) and ``probe_ms`` (the machine probes of the plain, default and
    fastest fixed rows, None where not recorded)."""
    ok = [r for r in records if "error" not in r and r.get("output_throughput")]
    by_key = {(r["config"], r["prompt_set"], r["temperature"], r["concurrency"]): r for r in ok}
    rows = []
    for r in ok:
        if r["config"] != default:
            continue
        key = (r["prompt_set"], r["temperature"], r["concurrency"])
        base = by_key.get((plain, *key))
        if base is None:
            continue
        fixed_rows = {name: by_key[(name, *key)] for name in fixed if (name, *key) in by_key}
        best = max(fixed_rows, key=lambda n: fixed_rows[n]["output_throughput"], default=None)
        vs_plain = r["output_throughput"] / base["output_throughput"]
        goal = ROW_FLOOR
        if r["concurrency"] == 1:
            goal = max(goal, SINGLE_REQUEST_GOALS.get((r["prompt_set"], float(r["temperature"])), goal))
        vs_best = None if best is None else r["output_throughput"] / fixed_rows[best]["output_throughput"]
        rows.append({"prompt_set": r["prompt_set"], "temperature": r["temperature"],
                     "concurrency": r["concurrency"], "plain_tok_s": base["output_throughput"],
                     "default_tok_s": r["output_throughput"], "vs_plain": vs_plain,
                     "best_fixed": best,
                     "best_fixed_vs_plain": None if best is None
                     else fixed_rows[best]["output_throughput"] / base["output_throughput"],
                     "vs_best_fixed": vs_best, "goal": goal,
                     "probe_ms": (base.get("machine_probe_ms"), r.get("machine_probe_ms"),
                                  None if best is None else fixed_rows[best].get("machine_probe_ms")),
                     "met": None if vs_best is None else vs_plain >= goal and vs_best >= ROW_FLOOR})
    return rows


def markdown_goals(rows: Sequence[dict], default: str = DEFAULT) -> str:
    """The goals table (Markdown); empty without rows."""
    if not rows:
        return ""
    probes = any(value is not None for g in rows for value in g.get("probe_ms", ()))
    lines = [f"Goals for `{default}` (ratios within this run): concurrency 1 at least the listed "
             f"ratio to no speculation; every row at least {ROW_FLOOR:g}x no speculation and "
             f"{ROW_FLOOR:g}x the fastest fixed configuration of the row."
             + (" Machine probe: ms of the fixed probe before the plain / default / fastest fixed "
                "row (the machine's memory speed then: a large difference points at a drift, "
                "though the probe has also moved 12-20% where the rows' speed did not)."
                if probes else ""), "",
             "| prompts | T | concurrency | plain tok/s | default tok/s | vs none (goal) | fastest fixed "
             "(vs none) | vs fastest fixed | met |" + (" machine probe ms |" if probes else ""),
             "|---|---|---|---|---|---|---|---|---|" + ("---|" if probes else "")]
    for g in rows:
        fixed = "n/a" if g["best_fixed"] is None else f"{g['best_fixed']} ({fmt(g['best_fixed_vs_plain'])}x)"
        met = "n/a" if g["met"] is None else ("yes" if g["met"] else "**no**")
        lines.append(f"| {g['prompt_set']} | {g['temperature']:g} | {g['concurrency']} | "
                     f"{fmt(g['plain_tok_s'])} | {fmt(g['default_tok_s'])} | {fmt(g['vs_plain'])}x "
                     f"(>= {g['goal']:g}x) | {fixed} | "
                     f"{'n/a' if g['vs_best_fixed'] is None else fmt(g['vs_best_fixed'], 3)} | {met} |"
                     + (f" {' / '.join(fmt(v) for v in g['probe_ms'])} |" if probes else ""))
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("result", type=Path, help="a bench_serving_standalone.py JSON result")
    args = parser.parse_args(argv)
    payload = json.loads(args.result.read_text())
    print(markdown_goals(goal_rows(payload["results"])) or "no row has both the default and no speculation")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
