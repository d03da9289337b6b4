"""Serving benchmark of HSD with a separate draft language model (``--hsd-draft-kind model``) on CPU.

For each server configuration a CPU server is started on 127.0.0.1 with the target and the draft
language model, and SGLang's own serving client (``sglang.benchmark.serving --backend sglang
--dataset-name sharegpt``) sends N prompts of each prompt set (``sglang_hsd.assets``: ShareGPT and
HumanEval by default, MT-Bench on request) with a fixed number of output tokens, for every
temperature x max concurrency (``benchmarks/serving_harness.py`` runs the servers and the client).
Kept per row: output tok/s and its ratio to the ``none`` (and ``none-bf16``) row of the same
prompt set, temperature and concurrency in the same run; request/s; median TPOT; the accept length
the client reads from ``/server_info`` (SGLang's average over its last decode-log interval of 40
steps: ``n/a`` for shorter runs) and, per request, SGLang's ``spec_accept_length`` (mean ±
standard error over requests); the mean draft length an adaptive server chose in the row's own
decode rounds (``row_mean_length``: the change of ``/server_info`` -> ``hsd.adaptive``'s choice
counts across the row, each batch round counted once) and over its whole life so far
(``mean_chosen_budget``: ``hsd.adaptive.mean_steps`` after the row, per request-round); null in
the JSON and ``n/a`` in the table when the server does not report them. A server with the lookup
level (``--hsd-draft-lookup``) also records the row's copies proposed and accepted and its draft
forwards and rows against the chain's (``draft_lookup``: the change of ``hsd.draft_lookup``),
listed in a second table.

Configurations (``CONFIGS``; every server runs ``--dtype`` with ``--hsd-cpu-linear`` =
``--cpu-linear``, so speculation and its reference run the same kernels; ``none-bf16`` excepted):
* ``none``        no speculation (throughput reference);
* ``none-bf16``   no speculation in bfloat16 with SGLang's own F.linear: plain decoding as a user
                  runs it here without this package's kernels (a second reference);
* ``none-unpadded`` ``none`` with ``--hsd-cpu-linear-padding off`` (few-row packed calls not padded);
* ``hsd``         ``--speculative-algorithm HSD --hsd-verify-method hsd``: drafts sampled from the
                  draft model's q, sequence-level verification, fixed draft length;
* ``hsd-adaptive`` ``hsd`` with ``--hsd-adaptive on`` (the draft budget chosen per round);
* ``hsd-adaptive-k8`` the same configured with 8 draft steps (lengths 0..8 to choose from);
* ``hsd-adaptive-k8-int4`` the same with ``--hsd-draft-precision int4`` (``auto`` elsewhere
                  unless ``--extra-server-args`` says otherwise): what the drafter's copy changes;
* ``hsd-adaptive-k8-tuned`` the same, for a controller setting passed as ``--extra-server-args
                  'hsd-adaptive-k8-tuned=--hsd-adaptive-tuning draft_margin=1.05'``: two
                  settings compared in one run;
* ``hsd-adaptive-k16`` the same with 16 (lengths 0..16);
* ``hsd-adaptive-k8-lookup`` / ``hsd-adaptive-k16-lookup`` the k8 / k16 rows with a prompt-lookup
                  level below the draft model (``--hsd-draft-lookup 3``; k16: at most 8 copies);
* ``hsd-adaptive-k8-extend`` the same with ``--hsd-draft-catch-up off`` (a round that drafts
                  nothing still extends the draft cache): what the catch-up saves;
* ``hsd-adaptive-k8-window`` the same with ``--hsd-draft-extend window`` (a drafting round
                  reruns its whole verify window in the draft extend): what the tail extend saves;
* ``hsd-adaptive-k8-sglang-forward`` the same with ``--hsd-draft-forward sglang`` (the draft
                  model on SGLang's own forward instead of the lean one): what the lean forward saves;
* ``tokenwise``   the same with ``--hsd-verify-method tokenwise`` (the standard per-token rule);
* ``hsd-tree``    HSD with a sampled tree drafted by the draft model (``--speculative-eagle-topk``
                  = ``--tree-topk``, ``--speculative-num-draft-tokens`` = ``--tree-tokens``), its
                  shape fixed (``--hsd-adaptive off``);
* ``hsd-tree-adaptive`` the same tree with ``--hsd-adaptive on``: each round's depth (0 = plain
                  decoding) and node budget chosen within the configured shape;
* ``standalone``  SGLang's own ``--speculative-algorithm STANDALONE`` (argmax drafts; on CPU its
                  verify takes the target's argmax for every batch, so its T > 0 rows are greedy
                  speculative decoding, not sampling).
A configuration's own server arguments are one table entry; ``--extra-server-args
CONFIG=ARGS`` adds more to one configuration for a run (``*=ARGS``: to every one).

    PYTHONPATH=. python benchmarks/bench_serving_standalone.py                  # Qwen2.5-Coder pair
    PYTHONPATH=. python benchmarks/bench_serving_standalone.py --num-prompts 16 \
        --temperatures 0,1 --concurrency 1,4,16 --configs none,hsd,hsd-adaptive,tokenwise \
        --dtype float32 --cpu-linear onednn-packed --skip tokenwise@c16
    PYTHONPATH=. python benchmarks/bench_serving_standalone.py --tiny --num-prompts 2 \
        --output-len 8 --temperatures 1 --concurrency 1     # smoke test, random tiny pair

Results: ``results/serving_standalone_<target>.{json,md,png}`` (``--name``: another stem) with
the commit, the command and the machine load (``benchmarks/common.py``); the PNG plots the output
tok/s ratio to ``none`` against max concurrency, one line per configuration, one panel per
(prompt set, temperature). The files are rewritten after every row (``"complete": false`` until
the last), so a stopped run keeps what it measured, and running the same command again resumes it.
Timings mean something only on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import RESULTS_DIR, benchmark_parser, png_metadata, start_run
from benchmarks.goodput_goals import goal_rows, markdown_goals
from benchmarks.serving_harness import (
    ClientSpec, ResultBook, Server, ServerSpec, fmt, lookup_delta, mean_se_cell, measure_rows, read_server_info,
    resolve_models, rounds_mean_length, run_client, shown_command, throughput_ratios,
    write_prompt_file)
from sglang_hsd.sglang_plugin.cpu.cpu_server import (
    cpu_linear_flags, cpu_server_command, draft_model_server_command, free_port)
from sglang_hsd.sglang_plugin.cpu.linear_path import CPU_LINEAR_PATHS


@dataclass(frozen=True)
class DraftModelConfig:
    """One server configuration of the draft-model benchmark.

    Fields:
        name: key in the results. note: what its rows measure, listed under the table.
        algorithm: ``--speculative-algorithm`` (None: no speculation).
        server_args: its own server arguments, after the shared ones.
        tree: draft a tree of ``--tree-topk`` children per node and ``--tree-tokens`` nodes.
        plain_bf16: bfloat16 with SGLang's own F.linear, whatever ``--dtype`` / ``--cpu-linear``.
        num_steps: its own ``--speculative-num-steps`` (None: ``--num-steps``); an adaptive
            server chooses each round's length up to it.
    """

    name: str
    note: str
    algorithm: str | None = "HSD"
    server_args: tuple[str, ...] = ()
    tree: bool = False
    plain_bf16: bool = False
    num_steps: int | None = None


CONFIGS = {c.name: c for c in (
    DraftModelConfig("none", "no speculative decoding", algorithm=None),
    DraftModelConfig("none-bf16", "no speculative decoding, bfloat16 weights and SGLang's own "
                     "F.linear whatever --dtype / --cpu-linear say (plain decoding without this "
                     "package's kernels)", algorithm=None, plain_bf16=True),
    DraftModelConfig("none-unpadded", "no speculative decoding, packed linear calls never padded "
                     "(--hsd-cpu-linear-padding off): what the row padding gains",
                     algorithm=None, server_args=("--hsd-cpu-linear-padding", "off")),
    DraftModelConfig("hsd", "HSD, draft LM, sampled drafts with q, verify_chain(method='hsd'), fixed K = --num-steps (--hsd-adaptive off)",
                     server_args=("--hsd-verify-method", "hsd", "--hsd-adaptive", "off")),
    DraftModelConfig("hsd-adaptive", "hsd with the draft budget chosen per round "
                     "(--hsd-adaptive on)",
                     server_args=("--hsd-verify-method", "hsd", "--hsd-adaptive", "on")),
    DraftModelConfig("hsd-adaptive-k8", "hsd-adaptive configured with 8 draft steps (each "
                     "round's length chosen in 0..8)",
                     server_args=("--hsd-verify-method", "hsd", "--hsd-adaptive", "on"),
                     num_steps=8),
    DraftModelConfig("hsd-adaptive-k8-tuned", "hsd-adaptive-k8 for a controller setting given in "
                     "--extra-server-args 'hsd-adaptive-k8-tuned=--hsd-adaptive-tuning ...', "
                     "compared with the default in one run",
                     server_args=("--hsd-verify-method", "hsd", "--hsd-adaptive", "on"),
                     num_steps=8),
    DraftModelConfig("hsd-adaptive-k8-int4", "hsd-adaptive-k8 with the draft model on its int4 "
                     "copy (--hsd-draft-precision int4; the k8 row takes the flag's default, auto)",
                     server_args=("--hsd-verify-method", "hsd", "--hsd-adaptive", "on",
                                  "--hsd-draft-precision", "int4"),
                     num_steps=8),
    DraftModelConfig("hsd-adaptive-k16", "hsd-adaptive configured with 16 draft steps (each "
                     "round's length chosen in 0..16): room for long chains where drafts are "
                     "almost always accepted",
                     server_args=("--hsd-verify-method", "hsd", "--hsd-adaptive", "on"),
                     num_steps=16),
    DraftModelConfig("hsd-adaptive-k8-lookup", "hsd-adaptive-k8 with a prompt-lookup level below "
                     "the draft model (--hsd-draft-lookup 3): one draft forward reads the copies "
                     "too and hands up every draft its draws matched",
                     server_args=("--hsd-verify-method", "hsd", "--hsd-adaptive", "on",
                                  "--hsd-draft-lookup", "3"),
                     num_steps=8),
    DraftModelConfig("hsd-adaptive-k16-lookup", "hsd-adaptive-k16 with the lookup level "
                     "(--hsd-draft-lookup 3, at most 8 copies per lookup): the round planner's "
                     "runtime choice on code, lookup:3 8 -> drafter 16 -> target",
                     server_args=("--hsd-verify-method", "hsd", "--hsd-adaptive", "on",
                                  "--hsd-draft-lookup", "3", "--hsd-draft-lookup-copies", "8"),
                     num_steps=16),
    DraftModelConfig("hsd-adaptive-k8-extend", "hsd-adaptive-k8 with --hsd-draft-catch-up off: "
                     "rounds that draft nothing still extend the draft cache (SGLang's way)",
                     server_args=("--hsd-verify-method", "hsd", "--hsd-adaptive", "on",
                                  "--hsd-draft-catch-up", "off"),
                     num_steps=8),
    DraftModelConfig("hsd-adaptive-k8-window", "hsd-adaptive-k8 with --hsd-draft-extend window: "
                     "a drafting round's draft extend reruns its whole verify window (SGLang's "
                     "way) instead of the one or two positions its draft steps did not write",
                     server_args=("--hsd-verify-method", "hsd", "--hsd-adaptive", "on",
                                  "--hsd-draft-extend", "window"),
                     num_steps=8),
    DraftModelConfig("hsd-adaptive-k8-sglang-forward", "hsd-adaptive-k8 with --hsd-draft-forward "
                     "sglang: the draft model on SGLang's own forward (not the lean one)",
                     server_args=("--hsd-verify-method", "hsd", "--hsd-adaptive", "on",
                                  "--hsd-draft-forward", "sglang"),
                     num_steps=8),
    DraftModelConfig("tokenwise", "HSD, draft LM, sampled drafts with q, "
                     "verify_chain(method='tokenwise')",
                     server_args=("--hsd-verify-method", "tokenwise", "--hsd-adaptive", "off")),
    DraftModelConfig("hsd-tree", "HSD, draft LM, sampled tree (depth --num-steps, --tree-topk "
                     "children per node, --tree-tokens nodes), verify_tree(method='hsd'), fixed "
                     "shape (--hsd-adaptive off); all-greedy batches keep SGLang's top-k tree",
                     server_args=("--hsd-adaptive", "off"), tree=True),
    DraftModelConfig("hsd-tree-adaptive", "hsd-tree with each round's tree budget chosen per "
                     "round (--hsd-adaptive on: depth 0..--num-steps within the configured shape)",
                     server_args=("--hsd-adaptive", "on"), tree=True),
    DraftModelConfig("standalone", "SGLang STANDALONE, argmax drafts; CPU verify is argmax for "
                     "every batch, so T > 0 rows are greedy speculative decoding",
                     algorithm="STANDALONE"),
)}
PROMPT_SETS = ("sharegpt", "humaneval")
# Reference configurations: each row's output tok/s is divided by theirs (same set, T, concurrency).
BASELINES = ("none", "none-bf16")


@dataclass(frozen=True)
class ServerOptions:
    """The server settings every configuration shares (``add_server_arguments``' options)."""

    dtype: str
    cpu_linear: str
    num_steps: int
    tree_topk: int
    tree_tokens: int
    max_running_requests: int

    @classmethod
    def from_args(cls, args: argparse.Namespace, max_running_requests: int) -> ServerOptions:
        return cls(args.dtype, args.cpu_linear, args.num_steps, args.tree_topk, args.tree_tokens,
                   max_running_requests)


def server_command(config: DraftModelConfig, target: Path, draft: Path, options: ServerOptions,
                   extra: Sequence[str] = ()) -> list[str]:
    """The CPU server command of ``config``; ``extra``: more server arguments, last."""
    port = free_port()
    shared = ["--max-running-requests", str(options.max_running_requests)]
    if config.plain_bf16:
        shared += ["--dtype", "bfloat16"]
    else:
        shared += ["--dtype", options.dtype, *cpu_linear_flags(options.cpu_linear)]
    shared += [*config.server_args, *extra]
    if config.algorithm is None:
        return cpu_server_command(str(target), port, extra=shared)
    return draft_model_server_command(
        str(target), port, str(draft), algorithm=config.algorithm, num_steps=config.num_steps or options.num_steps,
        extra=shared, topk=options.tree_topk if config.tree else 1,
        num_draft_tokens=options.tree_tokens if config.tree else None)


def measure_row(server: Server, row: dict, target: Path, datasets: dict[str, Path],
                args: argparse.Namespace, workdir: Path, config: str) -> dict:
    """One client run of ``row`` (prompt set, temperature, concurrency) against ``server``."""
    started = time.monotonic()
    spec = ClientSpec(target, datasets[row["prompt_set"]], args.num_prompts, args.output_len,
                      row["temperature"], row["concurrency"], context_len=4096,
                      extra_request_body={"ignore_eos": True, **args.request_body})
    tag = f"{config}_{row['prompt_set']}_t{row['temperature']:g}_c{row['concurrency']}"
    before = read_server_info(server.url)
    result = run_client(server.url, spec, workdir, tag, args.client_timeout)
    after = read_server_info(server.url)
    return {**result.kept(), **result.accept_length_stats(),
            "row_mean_length": rounds_mean_length(before, after),
            "mean_chosen_budget": after.mean_chosen_budget,
            "draft_copy": after.draft_copy,
            # the lookup level's forwards, rows and copies in this row (None without it)
            "draft_lookup": lookup_delta(before, after),
            # the controller's state after the row (choices and measured ms per batch bucket and
            # length): where an adaptive row's rounds went
            "adaptive_state": after.hsd.get("adaptive"),
            "wall_s": round(time.monotonic() - started, 1)}


def add_ratios(rows: list[dict]) -> list[dict]:
    """Rows with ``ratio_to_<baseline>`` (output tok/s over the baseline row's; None where either
    is missing) for each of ``BASELINES``."""
    out = [dict(r) for r in rows]
    for baseline in BASELINES:
        name = "ratio_to_" + baseline.replace("-", "_")
        for row, ratio in zip(out, throughput_ratios(rows, baseline)):
            row[name] = ratio
    return out


def parse_skip(text: str) -> list[tuple[str, str, float]]:
    """``--skip``: comma-separated ``CONFIG@tT`` / ``CONFIG@cN`` -> ``(config, 't'|'c', value)``."""
    rules = []
    for item in [i.strip() for i in text.split(",") if i.strip()]:
        config, _, selector = item.partition("@")
        if config not in CONFIGS or selector[:1] not in ("t", "c"):
            raise SystemExit(f"--skip: {item!r} is not CONFIG@tT or CONFIG@cN with CONFIG in "
                             f"{sorted(CONFIGS)}")
        try:
            rules.append((config, selector[0], float(selector[1:])))
        except ValueError:
            raise SystemExit(f"--skip: {item!r}: {selector[1:]!r} is not a number") from None
    return rules


def skipped(rules, config: str, temperature: float, concurrency: int) -> bool:
    return any(c == config and value == (temperature if kind == "t" else concurrency)
               for c, kind, value in rules)


def parse_extra_server_args(items: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """``--extra-server-args CONFIG=ARGS`` (repeatable; ``*`` = every configuration) ->
    configuration -> arguments (shell words), ``*``'s first."""
    extra: dict[str, tuple[str, ...]] = {}
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep or (name != "*" and name not in CONFIGS):
            raise SystemExit(f"--extra-server-args: {item!r} is not CONFIG=ARGS with CONFIG '*' "
                             f"or one of {sorted(CONFIGS)}")
        extra[name] = extra.get(name, ()) + tuple(shlex.split(text))
    return {name: extra.get("*", ()) + extra.get(name, ()) for name in CONFIGS
            if extra.get("*") or extra.get(name)}


def _ratio_cell(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def _tree_text(meta: dict) -> str:
    if "hsd-tree" not in meta["configs"] or not meta.get("tree"):
        return ""
    return f" (hsd-tree: k = {meta['tree'][0]} children per node, N = {meta['tree'][1]} nodes)"


def markdown_table(records: list[dict], meta: dict) -> str:
    """The results table (Markdown)."""
    lines = ["| config | prompts | T | concurrency | completed | output tok/s | vs none | "
             "vs none-bf16 | median TPOT ms | accept length (server) | accept length per request "
             "| mean length (row) | mean chosen budget (server) | draft copy (server) | machine probe ms |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in add_ratios(records):
        if "error" in r:
            lines.append(f"| {r['config']} | {r.get('prompt_set', '')} | "
                         f"{r.get('temperature', '')} | {r.get('concurrency', '')} | failed: "
                         f"{r['error']} | | | | | | | | | | |")
            continue
        lines.append(f"| {r['config']} | {r['prompt_set']} | {r['temperature']:g} | "
                     f"{r['concurrency']} | {r['completed']}/{meta['num_prompts']} | "
                     f"{fmt(r['output_throughput'])} | {_ratio_cell(r.get('ratio_to_none'))} | "
                     f"{_ratio_cell(r.get('ratio_to_none_bf16'))} | "
                     f"{fmt(r['median_tpot_ms'], 1)} | {fmt(r['accept_length'])} | "
                     f"{mean_se_cell(r.get('accept_length_mean'), r.get('accept_length_se'))} | "
                     f"{fmt(r.get('row_mean_length'))} | {fmt(r.get('mean_chosen_budget'))} | "
                     f"{r.get('draft_copy') or 'n/a'} | {fmt(r.get('machine_probe_ms'))} |")
    notes = [f"- `{name}`: {CONFIGS[name].note}" for name in meta["configs"]]
    if any(r.get("machine_probe_ms") for r in records):
        notes.append("- machine probe ms: a fixed float32 matrix-vector product streaming 128 MiB, timed "
                      "with the server idle just before the row (`benchmarks/common.py`, "
                      "`machine_probe_ms`); a large difference between two rows' probes points at a machine of "
                      "another speed, but the probe has also moved 12-20% where the rows' speed did not")
    notes += [f"- `{name}` server arguments added: `{shlex.join(args)}`"
              for name, args in meta.get("extra_server_args", {}).items() if name in meta["configs"]]
    if meta.get("skipped"):
        notes.append(f"- rows not run (--skip): {meta['skipped']}")
    if meta.get("resumed"):
        notes.append(f"- resumed run: {meta['resumed']['rows']} rows measured by the same command "
                     f"started {meta['resumed']['started']} (commit `{meta['resumed']['commit']}`)")
    return "\n".join([
        f"SGLang {meta['sglang_version']} on CPU ({meta['cpu_count']} cores): target "
        f"{meta['target']}, draft {meta['draft']}, {meta['num_steps']} draft steps"
        f"{_tree_text(meta)}, "
        f"{meta['num_prompts']} prompts per set x {meta['output_len']} output tokens, dtype "
        f"{meta['dtype']}, CPU linear path {meta.get('cpu_linear', 'mkl')} (none-bf16 excepted). "
        f"Prompts: {', '.join(meta['prompt_sources'])}.", "", *lines, "",
        *notes, "", *_lookup_lines(records), markdown_goals(goal_rows(records))])


def _lookup_lines(records: list[dict]) -> list[str]:
    """A table of the lookup level's work per row (``draft_lookup``), or [] when no row ran one."""
    rows = [r for r in records if r.get("draft_lookup")]
    if not rows:
        return []
    lines = ["Lookup level (`--hsd-draft-lookup`) per row: copies the draft model's draws accepted, "
             "and its forwards / rows against what the chain's draft steps would have run.", "",
             "| config | prompts | T | concurrency | copies accepted / proposed | forwards / chain's | rows / chain's |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        d = r["draft_lookup"]
        lines.append(f"| {r['config']} | {r['prompt_set']} | {r['temperature']:g} | {r['concurrency']} | "
                     f"{d['accepted']} / {d['proposed']} | {d['forwards']} / {d['chain_forwards']} | "
                     f"{d['rows']} / {d['chain_rows']} |")
    return [*lines, ""]


def plot(records: list[dict], meta: dict, path: Path, run) -> None:
    """Output tok/s ratio to ``none`` against max concurrency: one line per configuration, one
    panel per (prompt set, temperature). Nothing is written without a ratio to plot."""
    rows = [r for r in add_ratios(records)
            if r.get("ratio_to_none") is not None and r["config"] != "none"]
    if not rows:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(dict.fromkeys((r["prompt_set"], r["temperature"]) for r in rows))
    configs = [c for c in meta["configs"] if any(r["config"] == c for r in rows)]
    concurrencies = sorted({r["concurrency"] for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.8), squeeze=False)
    for ax, (prompt_set, temperature) in zip(axes[0], panels):
        for config in configs:
            points = sorted((r["concurrency"], r["ratio_to_none"]) for r in rows if
                            (r["config"], r["prompt_set"], r["temperature"])
                            == (config, prompt_set, temperature))
            if points:
                ax.plot(*zip(*points), marker="o", label=config)
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_xticks(concurrencies, [str(c) for c in concurrencies])
        ax.set_title(f"{prompt_set}, T = {temperature:g}")
        ax.set_xlabel("max concurrency")
        ax.set_ylabel("output tok/s / no speculation")
    axes[0][0].legend(fontsize="small")
    fig.suptitle(f"{meta['target']} with draft {meta['draft']}", fontsize="medium")
    fig.tight_layout()
    fig.savefig(path, metadata=png_metadata(run.as_dict()))
    plt.close(fig)


def add_server_arguments(parser: argparse.ArgumentParser, dtype: str, cpu_linear: str) -> None:
    """The model and server options of this benchmark's configurations (shared with
    ``profile_server.py``); ``dtype`` / ``cpu_linear``: the defaults of ``--dtype`` /
    ``--cpu-linear``."""
    parser.add_argument("--target", default="qwen2.5-coder-1.5b",
                        help="target: a cached model name (sglang-hsd fetch) or a folder")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b", help="draft language model")
    parser.add_argument("--tiny", action="store_true",
                        help="a random tiny target/draft pair built here (smoke test)")
    parser.add_argument("--num-steps", type=int, default=4)
    parser.add_argument("--tree-topk", type=int, default=2, help="hsd-tree: children per node")
    parser.add_argument("--tree-tokens", type=int, default=8,
                        help="hsd-tree: node budget N, root included")
    parser.add_argument("--dtype", default=dtype,
                        help="server --dtype (SGLang's 'auto' picks float16, slow on most CPUs)")
    parser.add_argument("--cpu-linear", default=cpu_linear, choices=CPU_LINEAR_PATHS,
                        help="--hsd-cpu-linear of every server but none-bf16 (onednn-packed needs "
                             "--dtype float32)")
    parser.add_argument("--server-timeout", type=float, default=1200.0)
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)


def _json_object(text: str) -> dict:
    """``--request-body``: a JSON object."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"--request-body must be a JSON object, got {text!r}: {err}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"--request-body must be a JSON object, got {text!r}")
    return value


def parse_args(argv=None):
    parser = benchmark_parser(__doc__.split("\n\n")[0], full_doc=False)
    add_server_arguments(parser, dtype="bfloat16", cpu_linear="mkl")
    parser.add_argument("--configs", default="none,hsd,tokenwise,standalone",
                        help=f"comma-separated, from {sorted(CONFIGS)}")
    parser.add_argument("--prompt-sets", default=",".join(PROMPT_SETS),
                        help="comma-separated prompt sets of sglang_hsd.assets (sharegpt, "
                             "humaneval, mtbench, ...)")
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--temperatures", default="0,1")
    parser.add_argument("--concurrency", default="1,4", help="max concurrencies, e.g. 1,4,16")
    parser.add_argument("--extra-server-args", action="append", default=[], metavar="CONFIG=ARGS",
                        help="more server arguments for one configuration ('*': every one), "
                             "e.g. 'hsd=--hsd-foo 1'; repeatable")
    parser.add_argument("--skip", default="",
                        help="rows not to run, e.g. standalone@t1,none-bf16@c4 (a config at a "
                             "temperature or a concurrency); listed in the table")
    parser.add_argument("--request-body", type=_json_object, default={}, metavar="JSON",
                        help="more sampling parameters of every request, e.g. "
                             "'{\"repetition_penalty\": 1.1}' (Qwen's own default)")
    parser.add_argument("--client-timeout", type=float, default=7200.0)
    parser.add_argument("--name", default=None,
                        help="results file stem (default serving_standalone_<target>)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="keep logs (and the tiny pair) here (default: a temp dir, removed)")
    args = parser.parse_args(argv)
    args.temperatures = [float(t) for t in args.temperatures.split(",")]
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    args.prompt_sets = [s.strip() for s in args.prompt_sets.split(",") if s.strip()]
    args.skip_text, args.skip = args.skip, parse_skip(args.skip)
    args.extra_server_args = parse_extra_server_args(args.extra_server_args)
    unknown = sorted(set(args.configs) - set(CONFIGS))
    if unknown:
        raise SystemExit(f"--configs: unknown {unknown}; choose from {sorted(CONFIGS)}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import sglang

    run = start_run(__file__, argv)
    with tempfile.TemporaryDirectory(prefix="hsd_standalone_bench_") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        target, draft = resolve_models(args.target, args.draft, workdir, args.tiny)
        datasets = {s: workdir / f"prompts_{s}.json" for s in args.prompt_sets}
        sources = [write_prompt_file(path, prompt_set, args.num_prompts, args.tiny)
                   for prompt_set, path in datasets.items()]
        meta = {"sglang_version": sglang.__version__, "cpu_count": os.cpu_count(),
                "target": "tiny random" if args.tiny else target.name,
                "draft": "tiny random" if args.tiny else draft.name,
                "num_steps": args.num_steps, "tree": [args.tree_topk, args.tree_tokens],
                "num_prompts": args.num_prompts, "output_len": args.output_len,
                "dtype": args.dtype, "cpu_linear": args.cpu_linear, "skipped": args.skip_text,
                "configs": args.configs, "concurrency": args.concurrency,
                "temperatures": args.temperatures, "request_body": args.request_body,
                "extra_server_args": {k: list(v) for k, v in args.extra_server_args.items()},
                "prompt_sources": sources, "command": run.command}
        stem = args.out_dir / (args.name or f"serving_standalone_{'tiny' if args.tiny else target.name}")
        book = ResultBook(stem, run, meta, markdown_table, annotate=add_ratios, plot=plot)
        options = ServerOptions.from_args(args, max(args.concurrency))
        for name in args.configs:
            cmd = server_command(CONFIGS[name], target, draft, options,
                                 args.extra_server_args.get(name, ()))
            rows = [{"prompt_set": s, "temperature": t, "concurrency": c}
                    for s in args.prompt_sets for t in args.temperatures for c in args.concurrency
                    if not skipped(args.skip, name, t, c)]
            spec = ServerSpec(name, cmd, {"config": name, "server_command": shown_command(cmd, workdir)},
                              timeout=args.server_timeout)
            measure_rows(spec, rows, lambda server, row, name=name: measure_row(
                server, row, target, datasets, args, workdir, name), book, workdir)
    table = book.finish()
    print(table)
    return 1 if book.failed() else 0


if __name__ == "__main__":
    sys.exit(main())
