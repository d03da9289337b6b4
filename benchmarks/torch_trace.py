"""Where a server's steps spend their time, from a torch.profiler trace of its scheduler.

SGLang's ``/start_profile`` (``{"num_steps": N, "activities": ["CPU"]}``, with
``SGLANG_TORCH_PROFILER_DIR`` set in the server's environment) writes a Chrome trace of the
scheduler's next N forward steps, each step an annotation (``step[DRAFT bs=1]``,
``step[VERIFY bs=1]``, ``draft_extend`` ...) holding the torch ops it ran. ``step_summary``
reads one annotation kind: how many ran, their median wall time, and for the median one the
total of its top-level ops by name and the time between them (Python, with no torch op running).
The profiler adds a few microseconds per op, so small-op totals are upper bounds.

``loaded_rounds.py --torch-profile-steps N`` uses it.
"""

from __future__ import annotations

import collections
import gzip
import json
import statistics
from pathlib import Path


def read_trace(path: Path) -> list[dict]:
    """The complete events (``ph == "X"``) of the thread that ran the most ops, in start order
    (ties: the longer, enclosing event first)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as handle:
        events = [e for e in json.load(handle)["traceEvents"] if e.get("ph") == "X"]
    by_thread: dict = collections.defaultdict(list)
    for event in events:
        by_thread[event.get("tid")].append(event)
    main = max(by_thread.values(), key=lambda evs: sum(e.get("cat") == "cpu_op" for e in evs))
    return sorted(main, key=lambda e: (e["ts"], -e["dur"]))


def _top_level(events: list[dict], outer: dict) -> list[dict]:
    """The ops directly inside ``outer``: inside it, and not inside an earlier such op."""
    end, top = outer["ts"], []
    for event in events:
        inside = outer["ts"] <= event["ts"] and event["ts"] + event["dur"] <= outer["ts"] + outer["dur"]
        if event is outer or not inside or event.get("cat") != "cpu_op":
            continue
        if event["ts"] >= end:
            top.append(event)
            end = event["ts"] + event["dur"]
    return top


def step_summary(events: list[dict], name: str, top: int = 8) -> dict | None:
    """``name``'s annotations: ``count``, ``median_ms``, and for the median one ``ops_ms`` (its
    top-level ops' total), ``gaps_ms`` (its time with no op running) and ``top_ops`` (name ->
    [calls, ms], the ``top`` largest). None when no such annotation ran."""
    steps = [e for e in events if e["name"] == name and e.get("cat") == "user_annotation"]
    if not steps:
        return None
    median = sorted(steps, key=lambda e: e["dur"])[(len(steps) - 1) // 2]
    ops = _top_level(events, median)
    totals, calls = collections.Counter(), collections.Counter()
    for op in ops:
        totals[op["name"]] += op["dur"]
        calls[op["name"]] += 1
    busy = sum(op["dur"] for op in ops)
    return {"count": len(steps), "median_ms": round(statistics.median(e["dur"] for e in steps) / 1e3, 2),
            "ops_ms": round(busy / 1e3, 2), "gaps_ms": round((median["dur"] - busy) / 1e3, 2),
            "top_ops": {k: [calls[k], round(v / 1e3, 2)] for k, v in totals.most_common(top)}}
