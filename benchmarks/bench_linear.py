"""One linear layer's cost against its row count, per CPU kernel path, on a model's real shapes.

A (K + 1)-token verification forward is a stack of linear layers over K + 1 rows; this measures
what each kernel path charges for 1..24 rows of every distinct weight shape of a model (its
q/k/v/o, gate/up, down projections and LM head, read from the model's ``config.json``), or of
shapes given with ``--shapes IN x OUT,...``, on random fp32 weights of those shapes:

* ``mkl``: ``F.linear`` (torch's default BLAS path);
* ``onednn-packed``: the runtime's ``PackedLinear`` (weight reordered once for oneDNN);
* ``inductor``: ``torch.compile(mode="max-autotune")`` with ``freezing=True`` and the C++ GEMM
  template (``max_autotune_gemm_backends="CPP,ATEN"``), compiled once per shape, row count and
  thread count; compile time is recorded apart, a failed compile is recorded as that path's error;
* ``mkl-bf16``: ``F.linear`` on bfloat16 weights and input, what SGLang runs for a bf16 model on
  a CPU without AMX. A different product (the exactness table says so), timed for reference;
* ``drafter-bf16`` / ``-fp16`` / ``-int8`` / ``-int4``: a separate drafter's weight copies
  (``runtime/weight_copies.py``), every row on the copy. Other products too: a drafter may run
  them (the verifier uses its actual probabilities), a target never does.

each at every ``--threads`` count. Every timed call follows a cache flush (``--flush-mb``), as in
a model forward where each layer's weights evict the previous ones; the median of ``--repeats``
calls after ``--warmup`` untimed ones. Each path's output is compared with ``F.linear`` on the same
weights and input (largest absolute difference; the runtime's paths and inductor are fp32).

With ``--model``, the distinct shapes follow ``--layout``: ``hf`` (q/k/v, gate/up apart, as the
runtime's layers) or ``sglang`` (q/k/v and gate/up merged, as SGLang's ``QKVParallelLinear`` and
``MergedColumnParallelLinear``), and a last table sums one forward's linear layers (every shape
times its count in the model: once per decoder layer, the LM head once) per path, threads and rows.

Writes ``benchmarks/results/<name>.{json,md,png}`` (default name ``linear_paths_<model>``): cost in
ms and as a ratio to one MKL row on the fewest threads, per shape, path, threads and rows; the
fastest path per shape and row count; the runtime's table (``sglang_hsd.runtime.kernel_paths``,
selectable paths only), which ``KernelTable.from_json(path, threads=N)`` reads back.

    PYTHONPATH=. python benchmarks/bench_linear.py --model qwen2.5-coder-1.5b --rows 1-24 --threads 1 2
    PYTHONPATH=. python benchmarks/bench_linear.py --shapes 1536x8960 --rows 1 2 5 8 --paths mkl onednn-packed
    PYTHONPATH=. python benchmarks/bench_linear.py --model qwen2.5-coder-1.5b --layout sglang \
        --rows 1 5 8 --threads 2 --paths mkl onednn-packed mkl-bf16 --name linear_server_qwen2.5-coder-1.5b
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.common import RESULTS_DIR, benchmark_parser, start_run, write_results
from sglang_hsd.runtime.kernel_paths import (
    PATH_MKL,
    RUNTIME_PATHS,
    SAME_PRODUCT_ATOL,
    KernelTable,
    LinearPath,
    MeasureConfig,
    Measurement,
    measure,
)
from sglang_hsd.runtime.kernel_setup import COPY_PATHS

PATH_INDUCTOR = "inductor"
PATH_MKL_BF16 = "mkl-bf16"
DRAFTER_COPY_PREFIX = "drafter-"
LAYOUTS = ("hf", "sglang")


@dataclass(frozen=True)
class LayerShape:
    """A distinct weight shape, the model's layers that have it (``label``) and how many times it
    occurs in one forward (``count``)."""

    label: str
    in_features: int
    out_features: int
    count: int = 1


def _compile_inductor(linear: torch.nn.Linear, rows: int, threads: int):
    """``linear`` compiled for ``[rows, in]`` inputs at the current thread count (the generated
    code fixes both; changing the thread count afterwards would recompile)."""
    import torch._inductor.config as inductor_config

    torch._dynamo.reset()  # one compile per (shape, rows, threads): no recompile limit, no stale graphs
    compiled = torch.compile(linear, mode="max-autotune", dynamic=False)
    with inductor_config.patch(freezing=True, max_autotune_gemm_backends="CPP,ATEN"), torch.no_grad():
        compiled(torch.zeros(rows, linear.in_features))
    return compiled


def _bf16_weight(linear: torch.nn.Linear) -> torch.Tensor:
    return linear.weight.detach().to(torch.bfloat16)


ALL_PATHS: dict[str, LinearPath] = {
    **RUNTIME_PATHS,
    PATH_INDUCTOR: LinearPath(PATH_INDUCTOR, lambda linear: linear, _compile_inductor, selectable=False),
    PATH_MKL_BF16: LinearPath(PATH_MKL_BF16, _bf16_weight,
                              lambda weight, rows, threads: lambda x: F.linear(x.to(weight.dtype), weight),
                              selectable=False),
    # A separate drafter's weight copies (runtime/weight_copies.py), every row on the copy: never a
    # target's path (other numbers), timed to show what a drafter's few-row calls cost on them.
    **{f"{DRAFTER_COPY_PREFIX}{kind}": dataclasses.replace(path, name=f"{DRAFTER_COPY_PREFIX}{kind}")
       for kind, path in COPY_PATHS.items()},
}


def model_shapes(config: dict, layout: str = "hf") -> list[LayerShape]:
    """The distinct linear shapes of a Llama/Qwen2-style decoder from its HF ``config.json``, with
    their counts in one forward; ``layout`` ``sglang`` merges q/k/v and gate/up as SGLang does."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    config = config.get("text_config", config)
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    kv = config.get("num_key_value_heads", heads) * head_dim
    inter, depth = config["intermediate_size"], config["num_hidden_layers"]
    if layout == "hf":
        layers = [("q_proj", hidden, heads * head_dim), ("k_proj", hidden, kv), ("v_proj", hidden, kv),
                  ("o_proj", heads * head_dim, hidden), ("gate_proj", hidden, inter),
                  ("up_proj", hidden, inter), ("down_proj", inter, hidden)]
    else:
        layers = [("qkv_proj", hidden, heads * head_dim + 2 * kv), ("o_proj", heads * head_dim, hidden),
                  ("gate_up_proj", hidden, 2 * inter), ("down_proj", inter, hidden)]
    layers = [(name, in_f, out_f, depth) for name, in_f, out_f in layers]
    layers.append(("lm_head", hidden, config["vocab_size"], 1))
    labels: dict[tuple[int, int], list[str]] = {}
    counts: dict[tuple[int, int], int] = {}
    for name, in_f, out_f, count in layers:
        labels.setdefault((in_f, out_f), []).append(name)
        counts[(in_f, out_f)] = counts.get((in_f, out_f), 0) + count
    return [LayerShape(", ".join(names), *shape, counts[shape]) for shape, names in labels.items()]


def parse_shapes(text: str) -> list[LayerShape]:
    """``"1536x8960,8960x1536"`` (in x out) -> shapes labelled by themselves."""
    out = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        parts = item.lower().split("x")
        if len(parts) != 2 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
            raise ValueError(f"--shapes expects IN x OUT pairs like 1536x8960, got {item!r}")
        out.append(LayerShape(item, int(parts[0]), int(parts[1])))
    if not out:
        raise ValueError("--shapes expects at least one IN x OUT pair")
    return out


def parse_rows(items: list[str]) -> tuple[int, ...]:
    """``["1-24"]`` or ``["1", "2", "5"]`` (ranges inclusive) -> sorted distinct row counts."""
    rows: set[int] = set()
    for item in items:
        first, _, last = item.partition("-")
        if not first.isdigit() or (last and not last.isdigit()) or int(first) < 1 or int(last or first) < int(first):
            raise ValueError(f"--rows expects counts >= 1 or ranges like 1-24, got {item!r}")
        rows.update(range(int(first), int(last or first) + 1))
    return tuple(sorted(rows))


def load_model_shapes(model: str, layout: str = "hf") -> list[LayerShape]:
    """Shapes of a model in the cache (``sglang-hsd fetch NAME``) or of a folder with ``config.json``."""
    from sglang_hsd.assets.fetch import fill_command, model_path

    folder = Path(model) if Path(model).is_dir() else model_path(model)
    if folder is None:
        raise ValueError(f"--model {model!r} is not in the cache: run `{fill_command(model)}` or give --shapes")
    return model_shapes(json.loads((folder / "config.json").read_text()), layout)


def model_totals(shapes: list[LayerShape], measurements: list[Measurement]) -> list[dict]:
    """One forward's linear cost per (path, threads, rows): every shape's ms times its count,
    for the keys measured without error on every shape; ratio to one MKL row on the fewest threads."""
    cells: dict[tuple[str, int, int], dict[tuple[int, int], float]] = {}
    for m in measurements:
        if m.error is None and not math.isnan(m.ms):
            cells.setdefault((m.path, m.threads, m.rows), {})[m.shape] = m.ms
    counts = {(s.in_features, s.out_features): s.count for s in shapes}
    totals = {key: sum(ms * counts[shape] for shape, ms in got.items())
              for key, got in cells.items() if set(got) == set(counts)}
    base_keys = sorted((k for k in totals if k[0] == PATH_MKL and k[2] == 1), key=lambda k: k[1])
    base = totals[base_keys[0]] if base_keys else float("nan")
    return [{"path": path, "threads": threads, "rows": rows, "ms": ms, "ratio": ms / base}
            for (path, threads, rows), ms in sorted(totals.items(), key=lambda kv: (kv[0][2], kv[0][0], kv[0][1]))]


def summarize(shapes: list[LayerShape], measurements: list[Measurement], whole_model: bool = False) -> dict:
    """Ratios to one MKL row on the fewest threads, the fastest path per (shape, rows), the runtime
    table; with ``whole_model``, one forward's summed linear cost (:func:`model_totals`)."""
    rows_out, fastest = [], []
    for shape in shapes:
        mine = [m for m in measurements if m.shape == (shape.in_features, shape.out_features)]
        base = [m for m in mine if m.path == PATH_MKL and m.error is None]
        base_ms = min(base, key=lambda m: (m.rows, m.threads)).ms if base else float("nan")
        for m in mine:
            rows_out.append({**asdict(m), "label": shape.label, "ratio": m.ms / base_ms})
        for rows in sorted({m.rows for m in mine}):
            ok = [m for m in mine if m.rows == rows and m.error is None]
            if ok:
                best = min(ok, key=lambda m: m.ms)
                fastest.append({"label": shape.label, "in_features": shape.in_features,
                                "out_features": shape.out_features, "rows": rows, "path": best.path,
                                "threads": best.threads, "ms": best.ms, "ratio": best.ms / base_ms})
    return {"shapes": [asdict(s) for s in shapes], "rows": rows_out, "fastest": fastest,
            "runtime_table": KernelTable.from_measurements(measurements).as_dicts(),
            "model_total": model_totals(shapes, measurements) if whole_model else [],
            "measurements": [asdict(m) for m in measurements]}


def format_markdown(result: dict, title: str) -> str:
    """Per shape: ms and ratio per (path, threads) and rows, the fastest path; then the exactness check."""
    lines = [f"# {title}", "", "Cost of one linear call, ms (ratio to one MKL row on the fewest threads); "
             "`fastest` is the fastest measured path / threads, `runtime` the fastest path the runtime can run.", ""]
    table = KernelTable.from_measurements([Measurement(**m) for m in result["measurements"]])
    for shape in result["shapes"]:
        rows = [r for r in result["rows"] if r["label"] == shape["label"]]
        keys = list(dict.fromkeys((r["path"], r["threads"]) for r in rows))
        lines += [f"## {shape['label']}: {shape['in_features']} x {shape['out_features']} (in x out)", "",
                  "| rows | " + " | ".join(f"{p} t{t}" for p, t in keys) + " | fastest | runtime |",
                  "|---" * (len(keys) + 3) + "|"]
        for count in sorted({r["rows"] for r in rows}):
            cells = {(r["path"], r["threads"]): r for r in rows if r["rows"] == count}
            best = [f for f in result["fastest"] if f["label"] == shape["label"] and f["rows"] == count]
            runtime = table.choose(shape["in_features"], shape["out_features"], count)
            lines.append(f"| {count} | " + " | ".join(_cell(cells.get(k)) for k in keys)
                         + f" | {_choice(best[0] if best else None)} | {_choice(runtime and asdict(runtime))} |")
        lines.append("")
    return "\n".join(lines + _model_total_lines(result) + _exactness_lines(result))


def _model_total_lines(result: dict) -> list[str]:
    """One forward's summed linear cost, ms (ratio), rows down and (path, threads) across."""
    totals = result.get("model_total") or []
    if not totals:
        return []
    keys = list(dict.fromkeys((t["path"], t["threads"]) for t in totals))
    counts = ", ".join(f"{s['label']} x{s['count']}" for s in result["shapes"])
    lines = ["## One forward's linear layers", "",
             f"Sum over the model's linear layers ({counts}), ms (ratio to one MKL row on the fewest "
             "threads).", "", "| rows | " + " | ".join(f"{p} t{t}" for p, t in keys) + " |",
             "|---" * (len(keys) + 1) + "|"]
    for count in sorted({t["rows"] for t in totals}):
        cells = {(t["path"], t["threads"]): t for t in totals if t["rows"] == count}
        lines.append(f"| {count} | " + " | ".join(
            f"{cells[k]['ms']:.1f} ({cells[k]['ratio']:.2f}x)" if k in cells else "" for k in keys) + " |")
    return lines + [""]


def _cell(row: dict | None) -> str:
    if row is None:
        return ""
    return "error" if row["error"] else f"{row['ms']:.3f} ({row['ratio']:.2f}x)"


def _choice(choice: dict | None) -> str:
    return "-" if not choice else f"{choice['path']} t{choice['threads']}"


def _exactness_lines(result: dict) -> list[str]:
    lines = ["## Same numbers as F.linear", "",
             f"Largest |path - F.linear| over all rows (same weights and input; tolerance {SAME_PRODUCT_ATOL:g}).", "",
             "| shape | path | threads | max abs diff | within tolerance | setup s (max) |", "|---|---|---|---|---|---|"]
    errors = []
    groups: dict[tuple, list[dict]] = {}
    for r in result["rows"]:
        groups.setdefault((r["label"], r["path"], r["threads"]), []).append(r)
    for (label, path, threads), rows in groups.items():
        ok = [r for r in rows if not r["error"]]
        errors += [f"- {label}, {path}, {threads} threads, {r['rows']} rows: {r['error']}" for r in rows if r["error"]]
        diff = max((r["max_abs_diff"] for r in ok), default=float("nan"))
        lines.append(f"| {label} | {path} | {threads} | {diff:.2e} | {'yes' if diff <= SAME_PRODUCT_ATOL else 'NO'} | "
                     f"{max((r['setup_s'] for r in rows), default=0.0):.1f} |")
    return lines + ([""] + ["## Errors", ""] + errors if errors else []) + [""]


def plot(result: dict, path: Path, run: dict | None) -> Path:
    """Rows on x, ratio to one MKL row on y, one line per (path, threads), one panel per shape."""
    from benchmarks.bench_report import _pyplot, _save

    plt = _pyplot()
    shapes = result["shapes"]
    cols = min(3, len(shapes))
    fig, axes = plt.subplots(math.ceil(len(shapes) / cols), cols, figsize=(5 * cols, 3.6 * math.ceil(len(shapes) / cols)),
                             squeeze=False)
    for ax, shape in zip(axes.flat, shapes):
        rows = [r for r in result["rows"] if r["label"] == shape["label"] and not r["error"]]
        for key in dict.fromkeys((r["path"], r["threads"]) for r in rows):
            line = sorted((r["rows"], r["ratio"]) for r in rows if (r["path"], r["threads"]) == key)
            ax.plot(*zip(*line), marker=".", label=f"{key[0]}, {key[1]} thread{'s' if key[1] > 1 else ''}")
        ax.set_title(f"{shape['label']} ({shape['in_features']} x {shape['out_features']})", fontsize=9)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_xlabel("rows")
        ax.set_ylabel("x one MKL row")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(shapes):]:
        ax.set_visible(False)
    return _save(fig, plt, path, run)


def parse_args(argv: list[str] | None = None):
    parser = benchmark_parser(__doc__)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", help="a model of `sglang-hsd fetch` (or a folder with config.json)")
    source.add_argument("--shapes", help="IN x OUT shapes, comma separated, e.g. 1536x8960,8960x1536")
    parser.add_argument("--layout", choices=LAYOUTS, default="hf",
                        help="with --model: hf (separate q/k/v, gate/up) or sglang (merged, as SGLang's layers)")
    parser.add_argument("--rows", nargs="+", default=["1-24"], help="row counts or ranges, e.g. 1-24 or 1 2 5 8")
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--paths", nargs="+", default=list(ALL_PATHS), choices=list(ALL_PATHS))
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--flush-mb", type=int, default=64, help="cache flush before each timed call, MB (0: none)")
    parser.add_argument("--name", help="results file stem (default linear_paths_<model>, or linear_paths_shapes)")
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    run = start_run(__file__, argv)
    shapes = load_model_shapes(args.model, args.layout) if args.model else parse_shapes(args.shapes)
    if PATH_MKL not in args.paths:
        raise ValueError("--paths must include mkl: every ratio is to one MKL row")
    config = MeasureConfig(rows=parse_rows(args.rows), threads=tuple(args.threads), repeats=args.repeats,
                           warmup=args.warmup, flush_mb=args.flush_mb)
    measurements = []
    for shape in shapes:  # one shape at a time, printed as it finishes
        got = measure([(shape.in_features, shape.out_features)], config, {p: ALL_PATHS[p] for p in args.paths})
        measurements += got
        print(f"{shape.label}: {len(got)} measurements, {sum(m.error is not None for m in got)} errors", flush=True)
    result = summarize(shapes, measurements, whole_model=bool(args.model))
    name = args.name or f"linear_paths_{Path(args.model).name if args.model else 'shapes'}"
    stem = args.out_dir / name
    write_results(stem, result, format_markdown(result, f"Linear layer cost by row count and kernel path ({name})"), run)
    plot(result, stem.with_name(stem.name + ".png"), run.as_dict())
    print(f"wrote {stem}.json, .md, .png")
    return result


if __name__ == "__main__":
    main()
