"""``sglang-hsd bench``'s results: the printed table, ``bench.json`` and ``bench.png``.

A row (one prompt set at one concurrency and temperature) is a dict: ``prompt_set``,
``concurrency``, ``temperature``, ``num_prompts``, ``max_new_tokens``, then ``plain`` and ``hsd``
(each the client's kept metrics, ``client.KEPT_METRICS``, or ``error``; ``hsd`` adds the
per-request accept lengths, their mean and standard error, and ``mean_draft_budget``, the mean
draft length the adaptive controller chose over the row's decode rounds) and ``ratio`` (HSD's
output tok/s over plain's; None where either failed). ``bench.json`` holds the rows, the options,
the servers and the run's record (``record.py``: commit, command, machine, load, dates).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from sglang_hsd.bench.record import png_metadata

# (header, cell of a row) of the printed table, in order.
COLUMNS = ("prompt set", "c", "T", "plain tok/s", "HSD tok/s", "ratio", "accepted/pass",
           "plain TPOT ms", "HSD TPOT ms", "draft budget")


def throughput_ratio(plain: dict, hsd: dict) -> float | None:
    """HSD's output tok/s over plain's (``output_throughput`` of each side's metrics); None when
    either side failed or reports no positive throughput."""
    if "error" in plain or "error" in hsd:
        return None
    base, value = plain.get("output_throughput"), hsd.get("output_throughput")
    if not _number(base) or not _number(value) or base <= 0:
        return None
    return value / base


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def cell(value, digits: int = 2, suffix: str = "") -> str:
    """A table cell: ``n/a`` for None, NaN or anything not a number."""
    return f"{value:.{digits}f}{suffix}" if _number(value) else "n/a"


def _row_cells(row: dict) -> list[str]:
    plain, hsd = row.get("plain", {}), row.get("hsd", {})

    def side(entry: dict, key: str, digits: int) -> str:
        return "failed" if "error" in entry else cell(entry.get(key), digits)

    return [row["prompt_set"], str(row["concurrency"]), f"{row['temperature']:g}",
            side(plain, "output_throughput", 2), side(hsd, "output_throughput", 2),
            cell(row.get("ratio"), 2, "x"), side(hsd, "accept_length_mean", 2),
            side(plain, "median_tpot_ms", 0), side(hsd, "median_tpot_ms", 0),
            side(hsd, "mean_draft_budget", 2)]


def _footnotes(rows: list[dict]) -> list[str]:
    """A line per failed side, and per side that completed fewer requests than it sent."""
    notes = []
    for row in rows:
        label = f"{row['prompt_set']} c={row['concurrency']} T={row['temperature']:g}"
        for tag in ("plain", "hsd"):
            entry = row.get(tag, {})
            completed = entry.get("completed")
            if "error" in entry:
                notes.append(f"{label}, {tag}: {entry['error']}")
            elif _number(completed) and completed < row["num_prompts"]:
                notes.append(f"{label}, {tag}: {completed} of {row['num_prompts']} requests completed")
    return notes


def format_table(rows: list[dict]) -> str:
    """The rows as an aligned text table (``COLUMNS``), failures and short rows noted below."""
    lines = [list(COLUMNS)] + [_row_cells(row) for row in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(COLUMNS))]

    def joined(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    text = [joined(lines[0]), "  ".join("-" * w for w in widths), *map(joined, lines[1:])]
    notes = _footnotes(rows)
    return "\n".join(text + ([""] + notes if notes else []))


def _json_safe(value):
    """NaN and infinities as None (JSON has no NaN), recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def write_json(path: Path, payload: dict) -> Path:
    """Write ``payload`` as indented JSON (NaN as null) through a temporary file, so a run stopped
    mid-write leaves the previous version whole."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(_json_safe(payload), indent=1) + "\n")
    partial.replace(path)
    return path


def plot_ratios(rows: list[dict], path: Path, record: dict | None = None) -> Path:
    """``bench.png``: a horizontal bar per row, HSD's output tok/s over plain's, a dashed line at 1
    (as fast as plain), and plain's tok/s written beside each bar (the ratio's base: 2x of a slow
    plain server and 2x of a fast one are different news). ``record`` goes into the PNG's text."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['prompt_set']} c={r['concurrency']} T={r['temperature']:g}" for r in rows]
    ratios = [r.get("ratio") if _number(r.get("ratio")) else 0.0 for r in rows]
    fig, ax = plt.subplots(figsize=(8.5, 1.2 + 0.45 * len(rows)))
    ax.barh(range(len(rows)), ratios, color=["#3a7dc9" if x >= 1 else "#c9503a" for x in ratios])
    ax.axvline(1.0, color="grey", linestyle="--", linewidth=1)
    right = max([1.0, *ratios])
    for i, (row, ratio) in enumerate(zip(rows, ratios)):
        plain = row.get("plain", {})
        base = "plain failed" if "error" in plain else f"plain {cell(plain.get('output_throughput'), 2)} tok/s"
        shown = f"{ratio:.2f}x" if _number(row.get("ratio")) else "n/a"
        ax.text(ratio + right * 0.02, i, f"{shown}  ({base})", va="center", fontsize=9,
                bbox={"facecolor": "white", "edgecolor": "none", "pad": 1})  # readable over the line at 1
    ax.set_yticks(range(len(rows)), labels)
    ax.invert_yaxis()
    ax.set_xlim(0, right * 1.6)
    ax.set_xlabel("HSD output tok/s / plain output tok/s")
    ax.set_title("sglang-hsd bench: HSD against no speculation")
    path = Path(path)
    fig.savefig(path, dpi=110, bbox_inches="tight", metadata=png_metadata(record))
    plt.close(fig)
    return path
