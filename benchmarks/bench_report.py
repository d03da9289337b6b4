"""Tables, the coupling bound and PNG plots for ``bench_verify.py`` and ``bench_e2e.py``.

Kept apart from the scripts (which load models) so the tests can run it on synthetic results.
Plots need matplotlib, an optional extra: ``pip install -e '.[bench]'`` (``scripts/setup_env.sh``
installs it); everything else here imports without it.

The upper bound of ``bench_verify``: a lossless verifier emits Y ~ p while the draft X ~ q, so
P(accepted >= k) <= P(Y_1..k = X_1..k) <= 1 - TV(p_1..k, q_1..k) (maximal coupling of the two
k-token laws), and E[accepted] <= sum_{k <= K} (1 - TV(p_1..k, q_1..k)). With X ~ q,
1 - TV(p_1..k, q_1..k) = E_q[min(1, R_k(X))], R_k = prod_{j <= k} p_j(x_j) / q_j(x_j), so
``coupling_bound_per_length`` evaluated on the sampled drafts and averaged is an unbiased
estimate of the bound, paired with the verifiers' exact expectations on the same drafts.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from benchmarks.common import benchmark_parser, png_metadata

BENCH_EXTRA_HINT = "plots need matplotlib: pip install -e '.[bench]' (or run scripts/setup_env.sh)"


# --------------------------------------------------------------------------- bench_verify
def coupling_bound_per_length(tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor) -> torch.Tensor:
    """Per-draft estimate of sum_{k <= K'} (1 - TV(p_1..k, q_1..k)) for every K' = 1..K.

    Args:
        tokens: int64 [N, K]; draft_probs: float [N, K, V] (q_j, the law token j was drawn from);
        target_probs: float [N, K + 1, V] (p_j at the same positions; the last row is unused).
    Returns:
        float64 [N, K]; column K' - 1 is sum_{k <= K'} min(1, R_k) for this draft.
    """
    if tokens.dim() != 2 or draft_probs.shape[:2] != tokens.shape or target_probs.shape[1] != tokens.shape[1] + 1:
        raise ValueError(f"tokens [N, K], draft_probs [N, K, V], target_probs [N, K + 1, V] expected, got "
                         f"{tuple(tokens.shape)}, {tuple(draft_probs.shape)}, {tuple(target_probs.shape)}")
    idx = tokens.unsqueeze(-1)
    p_draft = target_probs[:, :-1].gather(-1, idx).squeeze(-1).double()
    q_draft = draft_probs.gather(-1, idx).squeeze(-1).double()
    if bool((q_draft <= 0).any()):
        raise ValueError("draft_probs gives probability 0 to a drafted token: q is not the law it was drawn from")
    joint_ratio = torch.cumprod(p_draft / q_draft, dim=-1)
    return joint_ratio.clamp(max=1.0).cumsum(-1)


def summarize_draft_values(values: dict[str, torch.Tensor]) -> dict[str, list[float]]:
    """Per-draft expected accepted tokens -> block efficiencies and the paired hsd gain.

    Args:
        values: name (``tokenwise``, ``hsd``, ..., ``bound``) -> float64 [N, K].
    Returns:
        ``block_eff_<name>`` -> [K] means of 1 + value, ``hsd_gain`` and ``hsd_gain_se`` -> [K]
        relative gain of hsd over tokenwise and its standard error (paired over drafts).
    """
    out = {f"block_eff_{name}": (1 + v.mean(0)).tolist() for name, v in values.items()}
    if "hsd" in values and "tokenwise" in values:
        diff = values["hsd"] - values["tokenwise"]
        base = 1 + values["tokenwise"].mean(0)
        count = diff.shape[0]
        se = diff.std(0) / math.sqrt(count) if count > 1 else torch.full_like(base, float("nan"))
        out["hsd_gain"] = (diff.mean(0) / base).tolist()
        out["hsd_gain_se"] = (se / base).tolist()
    return out


def format_verify_table(rows: list[dict], header: str) -> str:
    """Every row of ``bench_verify``: one per drafter, prompt group, temperature and K."""
    lines = [
        header,
        "",
        "| drafter | prompts | T | K | drafts | tokenwise | hsd (= block, lossless optimum) | hsd gain (± 1 SE) "
        "| hsd-paper (lossy) | coupling bound |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['drafter']} | {r['prompt_set']} | {r['temperature']} | {r['K']} | {r['drafts']} | "
            f"{r['block_eff_tokenwise']:.3f} | {r['block_eff_hsd']:.3f} | {_pct(r['hsd_gain'])} ± "
            f"{_pct(r['hsd_gain_se'], sign=False)} | {r['block_eff_hsd-paper']:.3f} | {r['block_eff_bound']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def format_verify_summary(rows: list[dict], ks: tuple[int, ...] = (2, 4, 8)) -> str:
    """One line per drafter, prompt group and temperature: tokenwise / hsd / bound at ``ks``."""
    keyed = {(r["drafter"], r["prompt_set"], r["temperature"], r["K"]): r for r in rows}
    groups = list(dict.fromkeys((r["drafter"], r["prompt_set"], r["temperature"]) for r in rows))
    head = " | ".join(f"K={k}: tokenwise / hsd / bound" for k in ks)
    lines = [f"| drafter | prompts | T | drafts | {head} | hsd gain (± 1 SE) at the largest K shown |",
             "|---|---|---|---|" + "---|" * len(ks) + "---|"]
    for drafter, prompt_set, temperature in groups:
        cells, last = [], None
        for k in ks:
            r = keyed.get((drafter, prompt_set, temperature, k))
            cells.append("-" if r is None else
                         f"{r['block_eff_tokenwise']:.3f} / {r['block_eff_hsd']:.3f} / {r['block_eff_bound']:.3f}")
            last = r or last
        gain = "-" if last is None else f"{_pct(last['hsd_gain'])} ± {_pct(last['hsd_gain_se'], sign=False)}"
        drafts = "-" if last is None else last["drafts"]
        lines.append(f"| {drafter} | {prompt_set} | {temperature} | {drafts} | " + " | ".join(cells) + f" | {gain} |")
    return "\n".join(lines) + "\n"


def format_category_pivot(rows: list[dict], k: int = 8) -> str:
    """Prompt groups down (e.g. MT-Bench categories), (drafter, T) across; cells tokenwise / hsd /
    bound block efficiency at draft length ``k``."""
    keyed = {(r["prompt_set"], r["drafter"], r["temperature"]): r for r in rows if r["K"] == k}
    columns = list(dict.fromkeys((r["drafter"], r["temperature"]) for r in rows))
    groups = list(dict.fromkeys(r["prompt_set"] for r in rows))
    lines = [f"| prompts (K={k}: tokenwise / hsd / bound) | " + " | ".join(f"{d}, T={t}" for d, t in columns) + " |",
             "|---|" + "---|" * len(columns)]
    for group in groups:
        cells = []
        for drafter, temperature in columns:
            r = keyed.get((group, drafter, temperature))
            cells.append("-" if r is None else f"{r['block_eff_tokenwise']:.2f} / {r['block_eff_hsd']:.2f} / "
                         f"{r['block_eff_bound']:.2f} ({r['drafts']})")
        lines.append(f"| {group} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _pct(x: float, sign: bool = True) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{100 * x:+.1f}%" if sign else f"{100 * x:.1f}%"


def plot_verify(rows: list[dict], path: Path, methods=("tokenwise", "hsd", "hsd-paper", "bound"),
                run: dict | None = None) -> Path:
    """Block efficiency against draft length K, one panel per (drafter, temperature), prompt
    groups without a ``/`` (whole sets) only; ``run`` (the result's run record) goes into the
    PNG's text. Returns ``path``."""
    plt = _pyplot()
    panels = list(dict.fromkeys((r["drafter"], r["temperature"]) for r in rows))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False)
    styles = {"tokenwise": ":", "hsd": "-", "hsd-paper": "--", "bound": "-."}
    for ax, (drafter, temperature) in zip(axes[0], panels):
        sets = list(dict.fromkeys(r["prompt_set"] for r in rows if "/" not in r["prompt_set"]))
        for color, prompt_set in zip(_colors(len(sets)), sets):
            sel = sorted((r for r in rows if (r["drafter"], r["temperature"], r["prompt_set"]) ==
                          (drafter, temperature, prompt_set)), key=lambda r: r["K"])
            for method in methods:
                ax.plot([r["K"] for r in sel], [r[f"block_eff_{method}"] for r in sel], styles.get(method, "-"),
                        color=color, label=f"{prompt_set} {method}" if method == "hsd" else None)
        ax.set_title(f"{drafter}, T={temperature}", fontsize=9)
        ax.set_xlabel("draft length K")
        ax.set_ylabel("tokens per target call")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7, title=" ".join(f"{m} {s}" for m, s in styles.items() if m in methods),
                      title_fontsize=6)
    return _save(fig, plt, path, run)


# --------------------------------------------------------------------------- bench_e2e
def add_ratios(rows: list[dict]) -> None:
    """Speed-up against the autoregressive runtime (``target``) of the same T and batch size, and
    against HF assisted generation of the same T (batch 1 only). Sets ``vs_autoregressive`` and
    ``vs_hf_assisted`` on every row (None when the baseline is missing)."""
    for row in rows:
        same = [r for r in rows if r["temperature"] == row["temperature"]]
        base = [r for r in same if r["config"] == "target" and r["batch_size"] == row["batch_size"]]
        peer = [r for r in same if r["config"] == "hf-assisted"]
        row["vs_autoregressive"] = row["tokens_per_second"] / base[0]["tokens_per_second"] if base else None
        row["vs_hf_assisted"] = row["tokens_per_second"] / peer[0]["tokens_per_second"] if peer else None


def check_batch_outputs(rows: list[dict]) -> None:
    """Greedy (T = 0) outputs at batch size B > 1 against the same configuration at B = 1 and
    against the autoregressive runtime at B = 1. Sets ``matches_b1`` / ``matches_ar`` (True,
    False, or None when there is nothing to compare) and ``mismatched_prompts``."""
    for row in rows:
        row["matches_b1"] = row["matches_ar"] = None
        row["mismatched_prompts"] = []
        if row["temperature"] != 0 or row["outputs"] is None:
            continue
        ref = [r for r in rows if r["temperature"] == 0 and r["batch_size"] == 1]
        key = lambda r: (r["config"], r["method"], r["buffers"], r.get("draft_length", "fixed"),  # noqa: E731
                         r.get("tree", "none"), r.get("drafter_precision", "fp32"))
        same = next((r for r in ref if key(r) == key(row)), None)
        auto = next((r for r in ref if r["config"] == "target"), None)
        if same is not None and same is not row:
            row["matches_b1"] = same["outputs"] == row["outputs"]
        if auto is not None:
            row["matches_ar"] = auto["outputs"] == row["outputs"]
            row["mismatched_prompts"] = [i for i, (a, b) in enumerate(zip(auto["outputs"], row["outputs"])) if a != b]


def format_e2e_table(rows: list[dict], meta: dict) -> str:
    lines = [
        f"model {meta['model']}, assistant {meta['assistant']}, {meta['num_prompts']} {meta['prompt_set']} prompts, "
        f"{meta['max_new_tokens']} new tokens, {meta['threads']} thread(s), exit heads: {meta['exit_heads']}"
        + (", target and drafter linears oneDNN-packed (runtime rows)" if meta.get("pack_linears") else ""),
        "",
        "| T | B | config | method | buffers | tok/s (range over repeats) | vs AR | vs HF assisted "
        "| accepted/round per level "
        "| T=0 output = B=1 / = AR |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        accepted = ", ".join(
            f"{lv['name']}: {lv['mean_accepted']:.2f}" for lv in (r["levels"] or [])[1:]
        ) or "-"
        drafter = (r["levels"] or [{}])[0]
        if "mean_draft_length" in drafter:  # drafted tokens per round (varies under an adaptive rule)
            accepted = f"drafted/round {drafter['mean_draft_length']:.2f}; {accepted}"
        fmt = lambda x: "-" if x is None else f"{x:.2f}x"  # noqa: E731
        yes_no = lambda x: "-" if x is None else ("yes" if x else "NO")  # noqa: E731
        check = f"{yes_no(r.get('matches_b1'))} / {yes_no(r.get('matches_ar'))}"
        lines.append(
            f"| {r['temperature']} | {r['batch_size']} | {r['config']} | {r['method']} | {_buffers(r)} | "
            f"{_rate(r)} | {fmt(r['vs_autoregressive'])} | {fmt(r['vs_hf_assisted'])} | "
            f"{accepted} | {check} |"
        )
    return "\n".join(lines) + "\n"


def _rate(row: dict) -> str:
    """Tokens/s of a row, with the lowest and highest repeat when it has more than one: ``6.50 (5.12-6.69)``."""
    rate = f"{row['tokens_per_second']:.2f}"
    runs = row.get("tokens_per_second_per_repeat") or []
    return rate + (f" ({min(runs):.2f}-{max(runs):.2f})" if len(runs) > 1 else "")


def _buffers(row: dict) -> str:
    """The buffers of a row, with its draft-length rule unless fixed, its tree unless a chain and
    its drafter precision unless fp32: ``3,4``, ``3,4 adaptive:0.4``, ``- tree 4:2:8`` or ``15 bf16``."""
    length, tree = row.get("draft_length", "fixed"), row.get("tree", "none")
    precision = row.get("drafter_precision", "fp32")
    return ((row["buffers"] or "-") + ("" if length == "fixed" else f" {length}")
            + ("" if tree == "none" else f" tree {tree}") + ("" if precision == "fp32" else f" {precision}"))


def config_label(row: dict) -> str:
    """Short label of one e2e configuration (config, method, buffers)."""
    if row["config"] in ("target", "hf", "hf-assisted", "hf-prompt-lookup"):
        return "AR (runtime)" if row["config"] == "target" else row["config"]
    drafting = row["buffers"] or row.get("draft_length", "fixed") != "fixed" or row.get("tree", "none") != "none"
    buffers = f" [{_buffers(row)}]" if drafting else ""
    # An EAGLE-3 level names its head folder: show just the kind.
    levels = ",".join("eagle3" if part.startswith("eagle3:") else part for part in row["config"].split(","))
    return f"{levels} {row['method']}{buffers}"


def plot_e2e(rows: list[dict], out_stem: Path, run: dict | None = None) -> list[Path]:
    """Write ``<stem>_speedup.png`` (speed-up per configuration vs AR and vs HF assisted, one bar
    group per T and B) and ``<stem>_accepted.png`` (accepted draft tokens per round at each
    verifying level, per configuration); ``run`` (the result's run record) goes into their text.
    Returns the paths written."""
    plt = _pyplot()
    out_stem = Path(out_stem)
    settings = list(dict.fromkeys((r["temperature"], r["batch_size"]) for r in rows))
    labels = list(dict.fromkeys(config_label(r) for r in rows))
    colors = dict(zip(labels, _colors(len(labels))))
    paths = []

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), squeeze=False)
    for ax, key, title in ((axes[0][0], "vs_autoregressive", "speed-up vs autoregressive runtime"),
                           (axes[0][1], "vs_hf_assisted", "speed-up vs HF assisted")):
        if not _grouped_bars(ax, rows, settings, labels, colors, lambda r, key=key: r.get(key)):
            ax.text(0.5, 0.5, "no baseline in these results", ha="center", va="center", transform=ax.transAxes)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel("x")
    _legend(fig, labels, colors)
    paths.append(_save(fig, plt, out_stem.with_name(out_stem.name + "_speedup.png"), run))

    level_rows = [r for r in rows if r.get("levels") and len(r["levels"]) > 1]
    level_names = list(dict.fromkeys(lv["name"] for r in level_rows for lv in r["levels"][1:]))
    fig, axes = plt.subplots(1, max(1, len(level_names)), figsize=(max(6.0, 5.5 * len(level_names)), 4), squeeze=False)
    for ax, name in zip(axes[0], level_names or ["(no speculative configuration)"]):
        def value(r, name=name):
            hit = [lv for lv in (r.get("levels") or [])[1:] if lv["name"] == name]
            return hit[0]["mean_accepted"] if hit else None
        _grouped_bars(ax, level_rows, settings, labels, colors, value)
        ax.set_title(f"accepted draft tokens per round at level {name}", fontsize=10)
    _legend(fig, [label for label in labels if any(config_label(r) == label for r in level_rows)], colors)
    paths.append(_save(fig, plt, out_stem.with_name(out_stem.name + "_accepted.png"), run))
    return paths


def _grouped_bars(ax, rows, settings, labels, colors, value) -> bool:
    """Bars of ``value(row)`` per configuration label, grouped by (T, B); False if none drawn."""
    width = 0.8 / max(1, len(labels))
    drawn = False
    for i, label in enumerate(labels):
        xs, ys = [], []
        for j, (temperature, batch) in enumerate(settings):
            hit = [r for r in rows if config_label(r) == label and (r["temperature"], r["batch_size"]) == (temperature, batch)]
            y = value(hit[0]) if hit else None
            if y is not None and not (isinstance(y, float) and math.isnan(y)):
                xs.append(j + (i - (len(labels) - 1) / 2) * width)
                ys.append(y)
        if xs:
            ax.bar(xs, ys, width, color=colors[label], label=label)
            drawn = True
    ax.set_xticks(range(len(settings)), [f"T={t}, B={b}" for t, b in settings], fontsize=8)
    return drawn


def _legend(fig, labels, colors) -> None:
    """One legend for the whole figure, below the panels."""
    from matplotlib.patches import Patch

    if labels:
        fig.legend([Patch(color=colors[label]) for label in labels], labels, loc="upper center",
                   bbox_to_anchor=(0.5, 0.0), ncol=min(3, len(labels)), fontsize=8)


def _colors(n: int) -> list:
    plt = _pyplot()
    cmap = plt.get_cmap("tab10" if n <= 10 else "tab20")
    return [cmap(i % cmap.N) for i in range(n)]


def _save(fig, plt, path: Path, run: dict | None = None) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight", metadata=png_metadata(run))
    plt.close(fig)
    return path


def _pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend; a clear error without the extra."""
    try:
        import matplotlib
    except ImportError as err:
        raise ImportError(BENCH_EXTRA_HINT) from err
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def main(argv: list[str] | None = None) -> None:
    """Re-plot saved results: ``PYTHONPATH=. python benchmarks/bench_report.py
    benchmarks/results/<name>.json`` writes the PNGs of a ``bench_e2e`` or ``bench_verify`` result
    next to it (with the result's run record in their text)."""
    parser = benchmark_parser(main.__doc__)
    parser.add_argument("results", nargs="+", type=Path, help="JSON files written by bench_e2e.py / bench_verify.py")
    args = parser.parse_args(argv)
    for path in args.results:
        result = json.loads(path.read_text())
        rows, run = result["rows"], result.get("run")
        if rows and "config" in rows[0]:
            written = plot_e2e(rows, path.with_suffix(""), run=run)
        elif rows and "drafter" in rows[0]:
            written = [plot_verify(rows, path.with_suffix(".png"), run=run)]
        else:
            raise ValueError(f"{path}: neither a bench_e2e nor a bench_verify result (no rows with config/drafter)")
        print("\n".join(str(p) for p in written))


if __name__ == "__main__":
    main()
