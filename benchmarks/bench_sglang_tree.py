"""Accepted tokens per target pass of draft trees, through SGLang's serving benchmark on CPU.

For every tree shape (``--speculative-num-steps`` D, ``--speculative-eagle-topk`` k,
``--speculative-num-draft-tokens`` N) and every configuration below, one CPU server
(``sglang_hsd.sglang_plugin.cpu.cpu_server``) is started with the same target and drafter (its
EAGLE-3 head, or with ``--draft-model`` a draft language model; prompts: ``--prompt-set``);
SGLang's own client (``sglang.benchmark.serving``) then sends the same prompts at every
temperature. Per request SGLang reports ``spec_accept_length`` (completion tokens / verify passes,
bonus token included): the client here records it for every request (the client module is run
unchanged: ``benchmarks/serving_client.py``; servers and client: ``benchmarks/serving_harness.py``),
and the tables give the mean with its standard error over requests.

Configurations (same drafter, same (D, k, N) for every tree row):
* ``stock-tree``  ``--hsd-tree-draft topk --hsd-verify-method target-only``: SGLang's stock tree
                  semantics (deterministic top-k children, score pruning, target-only verify).
* ``hsd-tree``    ``--hsd-tree-draft sampled --hsd-verify-method hsd``: sampled tree, traversal
                  verification with the drafter's q.
* ``rrs-tree``    ``--hsd-tree-draft sampled --hsd-verify-method rrs``: the same tree, recursive
                  rejection sampling (the other lossless reference).
* ``hsd-tree-sharp`` ``hsd-tree`` with ``--hsd-draft-temperature-scale S`` (``--sharp-scale``,
                  default 0.5): children drawn from (and verified with) q at temperature T * S.
* ``hsd-tree-beam`` ``hsd-tree`` with ``--hsd-tree-rule beam`` (wide, shallow trees).
* ``argmax-first-tree`` ``--hsd-tree-draft argmax-first --hsd-verify-method hsd``: each node's
                  first child is q's argmax (as in the stock tree), its later siblings are drawn
                  without replacement from q without it; traversal verification tests each child
                  against the proposal it was drawn from.
* ``hsd-chain``   ``--speculative-eagle-topk 1`` with D steps (D + 1 verified tokens), hsd.

Below the table, every drawn tree (sampled or argmax-first children) is paired with
``stock-tree`` prompt by prompt (the client sends the same prompts in the same order): mean
difference ± standard error, the prompts it wins, and the means over the thirds of prompts
ranked by the stock tree's accept length at T = 0 (how often the drafter's top token is right on
that prompt; a ranking independent of the sampled rows' noise; the row's own stock values when
T = 0 was not run).

    PYTHONPATH=. python benchmarks/bench_sglang_tree.py --model smollm2-135m \\
        --shapes 5,4,8 4,2,8 --temperatures 0 0.7 1.0 --num-prompts 64 --output-len 64 \\
        --configs stock-tree,hsd-tree,hsd-tree-sharp,hsd-chain
    PYTHONPATH=. python benchmarks/bench_sglang_tree.py --model qwen2.5-coder-1.5b \\
        --draft-model qwen2.5-coder-0.5b --prompt-set humaneval --shapes 5,4,8 4,2,8 \\
        --configs stock-tree,hsd-tree,argmax-first-tree --num-prompts 32 --output-len 64 \\
        --extra-server-args '--hsd-cpu-linear onednn-packed --hsd-draft-precision int4'
    PYTHONPATH=. python benchmarks/bench_sglang_tree.py --num-prompts 4 --output-len 8   # tiny smoke

Results: ``benchmarks/results/<name>.{json,md,png}`` (default name ``sglang_tree_<model>``),
rewritten after every row (``"complete": false`` until the last); running the same command again
resumes a stopped run.

``--combine A.json B.json ... --name X`` runs no server: it joins the rows of earlier runs made
with the same model, prompts, output length and concurrency (the client's prompts, order and seed
are then the same, so the per-prompt pairing holds across runs) into one table, naming each
run's commit and command.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from benchmarks.common import RESULTS_DIR, benchmark_parser, fresh_prompt_offset, png_metadata, start_run, write_results
from benchmarks.serving_client import mean_se
from benchmarks.serving_harness import (
    ClientSpec, ModelSetup, ResultBook, Server, ServerSpec, measure_rows, resolve_models,
    run_client, setup_models, shown_command, write_prompt_file)
from sglang_hsd.sglang_plugin.cpu.cpu_server import (
    cpu_server_command, draft_model_server_command, free_port)


@dataclass(frozen=True)
class TreeConfig:
    """One server configuration. Fields: name; tree_draft / verify_method: the --hsd-* flags
    (tree_draft None = a chain, topk 1); note: what the row measures; draft_temperature_scale:
    --hsd-draft-temperature-scale; tree_rule: --hsd-tree-rule (None: the server's default)."""

    name: str
    tree_draft: str | None
    verify_method: str
    note: str
    draft_temperature_scale: float = 1.0
    tree_rule: str | None = None


CONFIGS = {c.name: c for c in (
    TreeConfig("stock-tree", "topk", "target-only",
               "SGLang's stock tree semantics: deterministic top-k children, target-only verify"),
    TreeConfig("hsd-tree", "sampled", "hsd",
               "sampled tree (children without replacement from q), traversal verification"),
    TreeConfig("rrs-tree", "sampled", "rrs",
               "the same sampled tree, recursive rejection sampling"),
    TreeConfig("hsd-tree-sharp", "sampled", "hsd",
               "hsd-tree drafting from q at temperature T * S (--hsd-draft-temperature-scale S)",
               draft_temperature_scale=0.5),
    TreeConfig("hsd-tree-beam", "sampled", "hsd",
               "sampled tree under the beam rule (--hsd-tree-rule beam: wide and shallow), hsd",
               tree_rule="beam"),
    TreeConfig("argmax-first-tree", "argmax-first", "hsd",
               "each node's first child q's argmax, the others without replacement from q without "
               "it (--hsd-tree-draft argmax-first), traversal verification"),
    TreeConfig("hsd-chain", None, "hsd", "chain (topk 1) of D drafts, verify_chain(method='hsd')"),
)}
# Tree configurations whose children are drawn from q: each is paired with ``stock-tree``.
DRAWN_TREE_DRAFTS = ("sampled", "argmax-first")


def parse_shape(text: str) -> tuple[int, int, int]:
    """'D,k,N' -> (steps, topk, draft tokens)."""
    try:
        steps, topk, tokens = (int(x) for x in text.split(","))
    except ValueError:
        raise SystemExit(f"--shapes: expected D,k,N (three integers), got {text!r}") from None
    return steps, topk, tokens


def server_flags(config: TreeConfig, shape: tuple[int, int, int]) -> list[str]:
    """The server flags of ``config`` at ``shape`` (D, k, N). Every row keeps its shape
    (``--hsd-adaptive off``): the table compares what each rule accepts per pass at that shape."""
    steps, topk, tokens = shape
    if config.tree_draft is None:
        return ["--speculative-eagle-topk", "1", "--hsd-verify-method", config.verify_method,
                "--hsd-adaptive", "off"]
    flags = ["--speculative-eagle-topk", str(topk), "--speculative-num-draft-tokens", str(tokens),
             "--hsd-tree-draft", config.tree_draft, "--hsd-verify-method", config.verify_method,
             "--hsd-adaptive", "off"]
    if config.draft_temperature_scale != 1.0:
        flags += ["--hsd-draft-temperature-scale", f"{config.draft_temperature_scale:g}"]
    if config.tree_rule is not None:
        flags += ["--hsd-tree-rule", config.tree_rule]
    return flags


def tree_row_key(row: dict) -> tuple:
    """A row's identity: (config, tree shape, temperature)."""
    return row.get("config"), tuple(row.get("shape") or ()), row.get("temperature")


def measure(server: Server, temperature: float, setup: ModelSetup, dataset: Path, args,
            workdir: Path, tag: str) -> dict:
    """One client run at ``temperature``: the client's result line plus per-request figures."""
    spec = ClientSpec(setup.target, dataset, args.num_prompts, args.output_len, temperature,
                      args.max_concurrency, dataset_name=setup.dataset, input_len=args.input_len,
                      context_len=args.context_len)
    result = run_client(server.url, spec, workdir, f"{tag}_t{temperature:g}", args.client_timeout)
    return {"temperature": temperature, "completed": result.metrics.get("completed"),
            "output_throughput": result.metrics.get("output_throughput"),
            "server_accept_length": result.metrics.get("accept_length"),
            **result.accept_length_stats(), "requests": len(result.accept_lengths),
            "per_request_accept_length": result.accept_lengths,
            "client_summary": result.summary()}


def server_spec(config: TreeConfig, shape, setup: ModelSetup, args, workdir: Path) -> ServerSpec:
    """The server of (config, shape); its records' common fields. With ``--draft-model`` the
    drafter is that language model (``--hsd-draft-kind model``) instead of the EAGLE-3 head."""
    extra = server_flags(config, shape) + ["--dtype", args.dtype, *args.extra_server_args]
    if args.draft_model is not None:
        cmd = draft_model_server_command(str(setup.target), free_port(), str(setup.head),
                                         num_steps=shape[0], extra=extra)
    else:
        cmd = cpu_server_command(str(setup.target), free_port(), "HSD", str(setup.head),
                                 num_steps=shape[0], extra=extra)
    fields = {"config": config.name, "shape": list(shape), "note": config.note,
              "draft_temperature_scale": config.draft_temperature_scale,
              "tree_rule": config.tree_rule, "server_command": shown_command(cmd, workdir)}
    return ServerSpec(f"{config.name}_{'-'.join(map(str, shape))}", cmd, fields,
                      timeout=args.server_timeout)


def _find(records: list[dict], name: str, shape, temperature: float) -> dict | None:
    """The record of ``name`` at ``shape`` and ``temperature`` (a chain matches on depth D only;
    a failed server's record matches every temperature)."""
    for r in records:
        same_shape = (r["shape"][0] == shape[0] if CONFIGS[name].tree_draft is None
                      else r["shape"] == list(shape))
        if r["config"] == name and same_shape and (r.get("temperature") == temperature
                                                   or "error" in r):
            return r
    return None


def _cell(record: dict | None) -> str:
    if record is None:
        return "n/a"
    if "error" in record:
        return "failed"
    return f"{record['accept_length_mean']:.3f} ± {record['accept_length_se']:.3f}"


def markdown_table(records: list[dict], meta: dict) -> str:
    names = meta["configs"]
    lines = ["| D,k,N | T | " + " | ".join(names) + " | hsd-tree / stock-tree |",
             "|---|---|" + "---|" * (len(names) + 1)]
    for shape in meta["shapes"]:
        for temperature in meta["temperatures"]:
            row = {name: _find(records, name, shape, temperature) for name in names}
            ratio = "n/a"
            hsd, stock = row.get("hsd-tree"), row.get("stock-tree")
            if hsd and stock and "error" not in hsd and "error" not in stock:
                ratio = f"{hsd['accept_length_mean'] / stock['accept_length_mean']:.3f}"
            lines.append(f"| {','.join(map(str, shape))} | {temperature:g} | "
                         + " | ".join(_cell(row.get(n)) for n in names) + f" | {ratio} |")
    speed = speed_lines(records, meta)
    notes = [f"- `{n}`: {meta['config_notes'][n]}" for n in names]
    notes += [f"- rows of run `{src['file']}` (commit `{src['commit']}`): `{src['command']}`"
              for src in meta.get("combined_from", [])]
    errors = [f"- {r['config']} {r['shape']}: {r['error']}" for r in records if "error" in r]
    paired = paired_lines(records, meta)
    return "\n".join([
        f"Accepted tokens per target pass (SGLang's per-request spec_accept_length, bonus token "
        f"included; mean ± standard error over requests). {meta['model']}; {meta['num_prompts']} "
        f"prompts ({meta['prompt_source']}) x {meta['output_len']} output tokens, max concurrency "
        f"{meta['max_concurrency']}, SGLang {meta['sglang_version']} on CPU. Chains use D steps.",
        "", *lines, "", *speed, *notes, *paired, *(["", "Errors:", *errors] if errors else []), ""])


def speed_lines(records: list[dict], meta: dict) -> list[str]:
    """Output tok/s of every row (SGLang's client over the whole row; the same servers and prompts),
    with each configuration's ratio to ``stock-tree``: whether acceptance survives the rule's cost."""
    names = meta["configs"]
    lines = ["Output tok/s of the same rows (SGLang's client; in parentheses: ratio to stock-tree):", "",
             "| D,k,N | T | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for shape in meta["shapes"]:
        for temperature in meta["temperatures"]:
            row = {name: _find(records, name, shape, temperature) for name in names}
            stock = (row.get("stock-tree") or {}).get("output_throughput")
            cells = []
            for name in names:
                value = (row.get(name) or {}).get("output_throughput")
                ratio = f" ({value / stock:.2f}x)" if value and stock and name != "stock-tree" else ""
                cells.append("n/a" if value is None else f"{value:.2f}{ratio}")
            lines.append(f"| {','.join(map(str, shape))} | {temperature:g} | " + " | ".join(cells) + " |")
    return lines + [""]


def paired_lines(records: list[dict], meta: dict) -> list[str]:
    """Per-prompt comparison of every drawn tree configuration with ``stock-tree`` (T > 0)."""
    names = [n for n in meta["configs"] if CONFIGS[n].tree_draft in DRAWN_TREE_DRAFTS]
    if "stock-tree" not in meta["configs"] or not names:
        return []
    lines = ["", "Per prompt against `stock-tree` (paired; thirds of prompts ranked by stock-tree's "
             "accept length at T = 0, low / middle / high: stock -> this configuration):", "",
             "| D,k,N | T | config | mean difference | prompts won | low third | middle third "
             "| high third |", "|---|---|---|---|---|---|---|---|"]
    for shape in meta["shapes"]:
        for temperature in [t for t in meta["temperatures"] if t > 0]:
            stock = _find(records, "stock-tree", shape, temperature)
            greedy = _find(records, "stock-tree", shape, 0.0)
            rank_by = (greedy or {}).get("per_request_accept_length") or (stock or {}).get(
                "per_request_accept_length")
            for name in names:
                other = _find(records, name, shape, temperature)
                a, b = ((r or {}).get("per_request_accept_length") for r in (stock, other))
                if not a or not b or len(a) != len(b) or len(a) < 3:
                    continue  # missing or failed row, unpaired (failed requests) or too few
                diff_mean, diff_se = mean_se([y - x for x, y in zip(a, b)])
                won = sum(y > x for x, y in zip(a, b))
                key = rank_by if rank_by and len(rank_by) == len(a) else a
                ranked = sorted(range(len(a)), key=lambda i: key[i])
                thirds = [ranked[i * len(a) // 3:(i + 1) * len(a) // 3] for i in range(3)]
                cells = [f"{sum(a[i] for i in t) / len(t):.3f} -> {sum(b[i] for i in t) / len(t):.3f}"
                         for t in thirds]
                se = "" if math.isnan(diff_se) else f" ± {diff_se:.3f}"
                lines.append(f"| {','.join(map(str, shape))} | {temperature:g} | {name} | "
                             f"{diff_mean:+.3f}{se} | {won}/{len(a)} | " + " | ".join(cells) + " |")
    return lines


def plot(records: list[dict], meta: dict, path: Path, run) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes, names, temps = meta["shapes"], meta["configs"], meta["temperatures"]
    fig, axes = plt.subplots(1, len(shapes), figsize=(5 * len(shapes), 4), squeeze=False)
    width = 0.8 / len(names)
    for ax, shape in zip(axes[0], shapes):
        for i, name in enumerate(names):
            rows = {t: r for t in temps
                    if (r := _find(records, name, shape, t)) is not None and "error" not in r}
            xs = [t for t in range(len(temps)) if temps[t] in rows]
            ax.bar([x + i * width for x in xs], [rows[temps[x]]["accept_length_mean"] for x in xs],
                   width, yerr=[rows[temps[x]]["accept_length_se"] for x in xs], label=name,
                   capsize=3)
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(temps))], [f"T={t:g}" for t in temps])
        ax.set_title(f"D,k,N = {','.join(map(str, shape))}")
        ax.set_ylabel("accepted tokens per target pass")
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(path, metadata=png_metadata(run.as_dict()))
    plt.close(fig)


PROMPT_FILE_SIZE = 200  # prompts written for SGLang's client, which samples --num-prompts of them


def prompt_offset(args, setup: ModelSetup) -> tuple[int, int]:
    """(prompts of --prompt-set skipped, how many of the PROMPT_FILE_SIZE written prompts trained
    the EAGLE-3 head). ``auto`` skips past the last training prompt of the set, so a trained head
    is measured on prompts it has not seen; a draft model has no training prompts here."""
    if setup.name == "tiny":
        return 0, 0
    from eagle_heads.pipeline import training_prompt_names
    from sglang_hsd.assets.prompts import load_prompts

    names = set() if args.draft_model is not None else training_prompt_names(setup.head.parent)
    trained = {name.split("/", 1)[1] for name in names if name.startswith(args.prompt_set + "/")}
    if args.prompt_offset != "auto":
        try:
            offset = int(args.prompt_offset)
        except ValueError:
            raise SystemExit(f"--prompt-offset must be 'auto' or an integer >= 0, got {args.prompt_offset!r}")
        if offset < 0:
            raise SystemExit(f"--prompt-offset must be 'auto' or an integer >= 0, got {offset}")
    try:
        ids = [p.id for p in load_prompts(args.prompt_set)]
    except Exception as err:  # write_prompt_file falls back to the tiny corpus (token ids only)
        print(f"warning: prompt set {args.prompt_set} unavailable ({type(err).__name__})", flush=True)
        return 0, 0
    if args.prompt_offset == "auto":
        offset = fresh_prompt_offset(args.prompt_set, names, ids)
    served = ids[offset: offset + PROMPT_FILE_SIZE]
    seen = sum(pid in trained for pid in served)
    if seen:
        print(f"warning: {seen} of the {len(served)} prompts written trained the EAGLE-3 head "
              f"(--prompt-offset {offset}); acceptance on them overstates the head's", flush=True)
    return offset, seen


def parse_args(argv=None):
    parser = benchmark_parser(__doc__.split("\n\n")[0], full_doc=False)
    parser.add_argument("--configs", default="stock-tree,hsd-tree,hsd-chain",
                        help=f"comma-separated, from {sorted(CONFIGS)}")
    parser.add_argument("--sharp-scale", type=float, default=0.5,
                        help="S of hsd-tree-sharp (--hsd-draft-temperature-scale)")
    parser.add_argument("--shapes", nargs="+", default=["5,4,8", "4,2,8"],
                        help="tree shapes D,k,N (steps, topk, draft tokens incl. the root)")
    parser.add_argument("--temperatures", nargs="+", type=float, default=[0.0, 0.7, 1.0])
    parser.add_argument("--model", default="tiny",
                        help="'tiny' (random, built here) or a cached model, e.g. smollm2-135m")
    parser.add_argument("--draft-model", default=None,
                        help="draft with this language model (a cached model name or a folder, "
                             "same vocabulary as --model) instead of --model's EAGLE-3 head")
    parser.add_argument("--prompt-set", default="sharegpt",
                        help="prompt set of sglang_hsd.assets (sharegpt, humaneval, mtbench, ...)")
    parser.add_argument("--prompt-offset", default="auto",
                        help="skip this many prompts of --prompt-set; 'auto' (default): past every "
                             "prompt of that set that trained the model's EAGLE-3 head (0 for a draft "
                             "model or a set the head never saw)")
    parser.add_argument("--extra-server-args", default="",
                        help="more arguments for every server, e.g. '--hsd-cpu-linear "
                             "onednn-packed --hsd-draft-precision int4'")
    parser.add_argument("--name", default=None, help="results stem (default sglang_tree_<model>)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--max-concurrency", type=int, default=8)
    parser.add_argument("--context-len", type=int, default=1024,
                        help="real models: ShareGPT prompts longer than this minus the output "
                             "length are skipped by SGLang's client (attention on CPU is slow)")
    parser.add_argument("--server-timeout", type=float, default=600.0)
    parser.add_argument("--client-timeout", type=float, default=7200.0)
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--combine", nargs="+", type=Path, default=None,
                        help="no server: join the rows of earlier results JSON files (same model, "
                             "prompts, output length, concurrency) into one table")
    args = parser.parse_args(argv)
    args.extra_server_args = shlex.split(args.extra_server_args)
    return args


COMBINE_KEYS = ("model", "num_prompts", "output_len", "max_concurrency", "prompt_source")
# Prompt sources as runs before the shared harness named them: the same 200 ShareGPT prompts.
LEGACY_PROMPT_SOURCES = {"sharegpt (sglang_hsd.assets)": "sharegpt (200 prompts)"}


def _combine_value(meta: dict, key: str):
    value = meta.get(key)
    return LEGACY_PROMPT_SOURCES.get(value, value) if key == "prompt_source" else value


def combine(paths: list[Path]) -> tuple[list[dict], dict]:
    """(records, meta) of earlier result files of this script, joined; each record keeps the
    commit of its run (``from_run``). Raises SystemExit when the runs are not comparable."""
    runs = [(Path(p), json.loads(Path(p).read_text())) for p in paths]
    first = runs[0][1]["meta"]
    for path, data in runs[1:]:
        differing = [k for k in COMBINE_KEYS
                     if _combine_value(data["meta"], k) != _combine_value(first, k)]
        if differing:
            raise SystemExit(f"--combine: {path} differs from {runs[0][0]} in {differing}")
    order = list(CONFIGS)
    names = sorted({n for _, d in runs for n in d["meta"]["configs"]}, key=order.index)
    shapes = sorted({tuple(s) for _, d in runs for s in d["meta"]["shapes"]}, reverse=True)
    temps = sorted({t for _, d in runs for t in d["meta"]["temperatures"]}, reverse=True)
    records, notes, sources = [], {}, []
    for path, data in runs:
        commit = data["run"].get("commit", "?")
        sources.append({"file": path.name, "commit": commit, "command": data["run"].get("command")})
        notes.update({n: data["meta"].get("config_notes", {}).get(n, CONFIGS[n].note)
                      for n in data["meta"]["configs"]})
        records += [{**r, "from_run": f"{path.name} @ {commit}"} for r in data["results"]]
    meta = {**{k: first[k] for k in COMBINE_KEYS}, "sglang_version": first["sglang_version"],
            "cpu_count": first.get("cpu_count"), "configs": names, "shapes": shapes,
            "temperatures": temps, "config_notes": notes, "combined_from": sources}
    return records, meta


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.combine:
        records, meta = combine(args.combine)
        run = start_run(__file__, argv)
        stem = args.out_dir / (args.name or f"sglang_tree_{args.model}")
        table = markdown_table(records, meta)
        write_results(stem, {"meta": meta, "results": records}, table, run)
        plot(records, meta, stem.with_suffix(".png"), run)
        print(table)
        return 0
    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    unknown = sorted(set(names) - set(CONFIGS))
    if unknown:
        raise SystemExit(f"--configs: unknown {unknown}; choose from {sorted(CONFIGS)}")
    shapes = [parse_shape(s) for s in args.shapes]
    if not args.sharp_scale > 0:
        raise SystemExit(f"--sharp-scale: expected a positive number, got {args.sharp_scale}")
    configs = {n: CONFIGS[n] for n in names}
    if "hsd-tree-sharp" in configs:
        configs["hsd-tree-sharp"] = replace(configs["hsd-tree-sharp"],
                                            draft_temperature_scale=args.sharp_scale,
                                            note=f"{CONFIGS['hsd-tree-sharp'].note}, S = {args.sharp_scale:g}")
    import sglang

    run = start_run(__file__, argv)
    with tempfile.TemporaryDirectory(prefix="hsd_tree_bench_") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        if args.draft_model is None:
            setup = setup_models(args.model, workdir)
        else:  # the target and its draft language model; ModelSetup.head holds the draft
            target, draft = resolve_models(args.model, args.draft_model, workdir,
                                           tiny=args.model == "tiny")
            setup = ModelSetup(args.model, target, draft, None, 0,
                               "random" if args.model == "tiny" else "sharegpt")
        dataset = workdir / "sharegpt_format.json"
        offset, seen = prompt_offset(args, setup)
        config = json.loads((setup.target / "config.json").read_text())
        drafter = (f"draft model {setup.head.name}" if args.draft_model is not None else
                   f"{'random' if setup.name == 'tiny' else 'trained'} EAGLE-3 head")
        meta = {"model": f"{setup.name} ({config['num_hidden_layers']} layers) + {drafter}",
                "sglang_version": sglang.__version__, "cpu_count": os.cpu_count(),
                "configs": names, "shapes": shapes, "temperatures": args.temperatures,
                "config_notes": {n: c.note for n, c in configs.items()},
                "num_prompts": args.num_prompts, "output_len": args.output_len,
                "max_concurrency": args.max_concurrency,
                "prompt_source": write_prompt_file(dataset, args.prompt_set, PROMPT_FILE_SIZE, fallback=True,
                                                   offset=offset),
                "prompt_offset": offset, "prompts_in_head_training": seen,
                "extra_server_args": args.extra_server_args,
                "command": run.command}
        stem = args.out_dir / (args.name or f"sglang_tree_{args.model}")
        book = ResultBook(stem, run, meta, markdown_table, key=tree_row_key, plot=plot)
        for shape in shapes:
            for name in names:
                if CONFIGS[name].tree_draft is None and any(
                        r["config"] == name and r["shape"][0] == shape[0] for r in book.rows):
                    continue  # a chain depends on D only
                spec = server_spec(configs[name], shape, setup, args, workdir)
                measure_rows(spec, [{"temperature": t} for t in args.temperatures],
                             lambda server, row, tag=spec.tag: measure(
                                 server, row["temperature"], setup, dataset, args, workdir, tag),
                             book, workdir)
    table = book.finish()
    print(table)
    return 1 if book.failed() else 0


if __name__ == "__main__":
    sys.exit(main())
