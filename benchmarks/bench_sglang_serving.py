"""Serving benchmark on CPU: SGLang 0.5.23 with ``--speculative-algorithm HSD`` vs the alternatives.

For each configuration a CPU server is started on 127.0.0.1 with a tiny random Llama target and a
random EAGLE-3 head over half its vocabulary (as in ``tests/sglang_plugin/test_server_e2e.py``),
SGLang's own client ``sglang.benchmark.serving --backend sglang --dataset-name random`` sends a
bounded number of requests, and its result line (throughput, latencies, ``accept_length`` from
``/server_info``) is kept, with the per-request accept lengths' mean and standard error
(``benchmarks/serving_harness.py`` runs the servers and the client). The server is always killed
afterwards. Results are rewritten after every configuration; running the same command again
resumes a stopped run.

Configurations:
* ``hsd``        --speculative-algorithm HSD --hsd-verify-method hsd
* ``tokenwise``  --speculative-algorithm HSD --hsd-verify-method tokenwise
* ``eagle3``     --speculative-algorithm EAGLE3 with the same head. On SGLang 0.5.23 this runs only
                 with argmax drafts (``--speculative-use-rejection-sampling`` is refused for a
                 reduced draft vocabulary), and its CPU verify path commits the target argmax for
                 every batch, i.e. it ignores ``--temperature`` (patches/0003). So its numbers are
                 those of greedy speculative decoding, not of sampling at the given temperature.
* ``none``       no speculation (throughput reference).
* ``hsd-exit``   HSD with the early-exit verifier level: ``--hsd-exit-layer L`` (default N/2 for the
                 tiny model, 16 for SmolLM2) and ``--hsd-exit-heads`` (trained heads for SmolLM2,
                 logit lens for the tiny model): EAGLE-3 drafts -> layers [0, L) + exit head ->
                 layers [L, N) for the surviving positions only. Its per-level statistics (exit and
                 target acceptance, target layer-forwards saved) come from ``/server_info``.
* ``hsd-exit-window`` ``hsd-exit`` with ``--hsd-exit-buffer K + 1``: exit sub-rounds (EAGLE-3 drafts
                 continuing the exit's provisional chain) fill the verify window before the
                 remaining layers run once for all provisional tokens.

``--model smollm2-135m`` runs the real SmolLM2-135M-Instruct from ``~/.cache/sglang-hsd`` with the
EAGLE-3 head and exit heads trained by ``eagle_heads`` (``heads/smollm2-135m/{eagle3,exit}``), on
ShareGPT prompts (``--dataset-name sharegpt``); results go to
``sglang_serving_smollm2-135m_t<temperature>.*``.

    PYTHONPATH=. python benchmarks/bench_sglang_serving.py --model smollm2-135m \
        --configs eagle3,hsd,hsd-exit,hsd-exit-window,none --temperature 0 --num-prompts 8

Random weights: accept lengths here say nothing about real models (the head is untrained; with
near-uniform p and q on a random model a sampled draft is accepted often, an argmax one rarely).
The numbers show that the path works end to end and what it costs on this machine, nothing more.

    PYTHONPATH=. python benchmarks/bench_sglang_serving.py            # all four, ~10 min on 2 cores
    PYTHONPATH=. python benchmarks/bench_sglang_serving.py --configs hsd,none --num-prompts 8

The ``random`` dataset takes its prompt tokens from a ShareGPT-format file, written from
``sglang_hsd.assets``' ShareGPT prompts (or the tiny tokenizer's built-in text when those cannot
be fetched), so nothing is downloaded from the hub.
"""


from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import dataclass, fields
from pathlib import Path

from benchmarks.common import RESULTS_DIR, benchmark_parser, start_run
from benchmarks.serving_harness import (
    ClientSpec, ModelSetup, ResultBook, Server, ServerSpec, fmt, measure_rows, read_server_info,
    run_client, setup_models, shown_command, write_prompt_file)
from sglang_hsd.sglang_plugin.cpu.cpu_server import cpu_server_command, free_port
from sglang_hsd.sglang_plugin.exit_stats import ExitLevelStats


@dataclass(frozen=True)
class ServerConfig:
    """One server to benchmark.

    Fields:
        name: key in the results.
        algorithm: ``--speculative-algorithm`` (None: no speculation).
        verify_method: ``--hsd-verify-method`` for HSD.
        note: what the row measures, printed under the table.
        exit_level: the early-exit verifier level (``--hsd-exit-layer``, ``--hsd-exit-heads``).
        exit_window: exit sub-rounds fill the verify window (``--hsd-exit-buffer K + 1``).
    """

    name: str
    algorithm: str | None
    verify_method: str | None = None
    note: str = ""
    exit_level: bool = False
    exit_window: bool = False


CONFIGS = {c.name: c for c in (
    ServerConfig("hsd", "HSD", "hsd", "HSD, sequence-level verify_chain(method='hsd')"),
    ServerConfig("tokenwise", "HSD", "tokenwise",
                 "HSD plugin with token-wise verify_chain (SGLang's rule, our code)"),
    ServerConfig("eagle3", "EAGLE3", None,
                 "SGLang EAGLE3, argmax drafts; CPU verify is argmax for every batch (temperature "
                 "ignored, upstream bug: patches/0003), so this row is greedy speculative decoding"),
    ServerConfig("none", None, None, "no speculative decoding"),
    ServerConfig("hsd-exit", "HSD", "hsd",
                 "HSD 3-level: EAGLE-3 drafts, early exit (first L layers + exit head) verifies "
                 "with hsd, the remaining layers run only for the positions the exit accepted",
                 exit_level=True),
    ServerConfig("hsd-exit-window", "HSD", "hsd",
                 "hsd-exit with exit buffer N_i = K + 1 (--hsd-exit-buffer): exit sub-rounds "
                 "(EAGLE-3 drafts continuing the exit's chain) fill the verify window before the "
                 "full target runs", exit_level=True, exit_window=True),
)}


def server_command(config: ServerConfig, setup: ModelSetup, args) -> list[str]:
    """The CPU server command of ``config`` (argmax EAGLE-3 drafts for ``eagle3``)."""
    extra = ["--dtype", args.dtype]
    if config.verify_method:
        extra += ["--hsd-verify-method", config.verify_method]
    if config.exit_level:
        extra += ["--hsd-exit-layer", str(setup.exit_layer), "--hsd-exit-heads",
                  str(setup.exit_heads) if setup.exit_heads else "none"]
    if config.exit_window:
        extra += ["--hsd-exit-buffer", str(args.num_steps + 1)]
    return cpu_server_command(str(setup.target), free_port(), config.algorithm,
                              str(setup.head) if config.algorithm else None,
                              num_steps=args.num_steps if config.algorithm else None,
                              extra=extra, eagle3_rejection_sampling=False)


def measure(server: Server, config: str, setup: ModelSetup, dataset: Path, args,
            workdir: Path) -> dict:
    """One client run against ``server``, with the exit level's statistics of its requests."""
    levels_before = read_server_info(server.url).hsd.get("levels")
    spec = ClientSpec(setup.target, dataset, args.num_prompts, args.output_len, args.temperature,
                      args.max_concurrency, dataset_name=setup.dataset, input_len=args.input_len)
    result = run_client(server.url, spec, workdir, config, args.client_timeout)
    levels = _levels_delta(levels_before, read_server_info(server.url).hsd.get("levels"))
    return {"startup_s": server.startup_s, "hsd_levels": levels, **result.kept(),
            **result.accept_length_stats(), "client_summary": result.summary()}


def _model_description(setup: ModelSetup, config: dict) -> str:
    if setup.name == "tiny":
        return (f"tiny random Llama (vocab {config['vocab_size']}, {config['num_hidden_layers']} "
                f"layers, hidden {config['hidden_size']}) + random EAGLE-3 head over half the "
                "vocabulary")
    return (f"{setup.name} ({config['num_hidden_layers']} layers, hidden "
            f"{config['hidden_size']}) + trained EAGLE-3 head")


def _levels_delta(before: dict | None, after: dict | None) -> dict | None:
    """Statistics of the benchmark's requests only (server warm-up rounds subtracted)."""
    if not after:
        return None
    before = before or {}
    counters = {f.name: after.get(f.name, 0) - before.get(f.name, 0)
                for f in fields(ExitLevelStats) if f.name != "seconds"}
    seconds_before = before.get("seconds", {})
    seconds = {name: value - seconds_before.get(name, 0.0)
               for name, value in after.get("seconds", {}).items()}
    return ExitLevelStats(**counters, seconds=seconds).as_dict()


def markdown_table(records: list[dict], meta: dict) -> str:
    lines = [
        "| config | completed | output tok/s | req/s | mean e2e ms | median TPOT ms | "
        "accept length | exit sub-rounds per round | exit accept length | target accept rate | "
        "target layer-forwards saved |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        if "error" in r:
            lines.append(f"| {r['config']} | failed: {r['error']} | | | | | | | | | |")
            continue
        levels = r.get("hsd_levels") or {}
        lines.append(
            f"| {r['config']} | {r['completed']}/{meta['num_prompts']} | "
            f"{fmt(r['output_throughput'])} | {fmt(r['request_throughput'], 3)} | "
            f"{fmt(r['mean_e2e_latency_ms'], 0)} | {fmt(r['median_tpot_ms'], 1)} | "
            f"{fmt(r['accept_length'])} | {fmt(levels.get('exit_subrounds_per_round'))} | "
            f"{fmt(levels.get('exit_accept_length'))} | "
            f"{fmt(levels.get('target_accept_rate'))} | "
            f"{fmt(levels.get('layer_forwards_saved'))} |")
    notes = [f"- `{r['config']}`: {r['note']}" for r in records]
    return "\n".join([
        f"SGLang {meta['sglang_version']} on CPU ({meta['cpu_count']} cores), {meta['model']}; "
        f"exit level at layer {meta['exit_layer']} ({meta['exit_heads']}); "
        f"{meta['num_prompts']} prompts, {meta['input_len']} input / "
        f"{meta['output_len']} output tokens, temperature {meta['temperature']}, max concurrency "
        f"{meta['max_concurrency']}, {meta['num_steps']} draft steps. Prompts: "
        f"{meta['prompt_source']}.", "", *lines, "", *notes, "",
        meta["caveat"], ""])


def parse_args(argv=None):
    parser = benchmark_parser(__doc__.split("\n\n")[0], full_doc=False)
    parser.add_argument("--configs", default="hsd,tokenwise,eagle3,none",
                        help=f"comma-separated, from {sorted(CONFIGS)}")
    parser.add_argument("--model", default="tiny",
                        help="'tiny' (random, built here) or a cached model, e.g. smollm2-135m")
    parser.add_argument("--dtype", default="float32",
                        help="server --dtype (float32: SGLang's 'auto' picks float16, slow on CPU)")
    parser.add_argument("--exit-layer", type=int, default=None,
                        help="exit layer of hsd-exit (default 2 for tiny, 16 otherwise)")
    parser.add_argument("--exit-heads", default=None,
                        help="exit heads folder or 'none' (default: the model's trained heads)")
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--max-concurrency", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--num-steps", type=int, default=3)
    parser.add_argument("--server-timeout", type=float, default=300.0)
    parser.add_argument("--client-timeout", type=float, default=600.0)
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--workdir", type=Path, default=None,
                        help="keep models and logs here (default: a temp dir, removed)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    unknown = sorted(set(names) - set(CONFIGS))
    if unknown:
        raise SystemExit(f"unknown configs {unknown}; choose from {sorted(CONFIGS)}")
    import sglang

    run = start_run(__file__, argv)
    with tempfile.TemporaryDirectory(prefix="hsd_bench_") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        setup = setup_models(args.model, workdir, args.exit_layer, args.exit_heads)
        dataset = workdir / "sharegpt_format.json"
        model_config = json.loads((setup.target / "config.json").read_text())
        meta = {
            "sglang_version": sglang.__version__, "cpu_count": os.cpu_count(),
            "model": _model_description(setup, model_config),
            "exit_layer": setup.exit_layer,
            "exit_heads": str(setup.exit_heads).replace(str(Path.home()), "~")
            if setup.exit_heads else "logit lens",
            "caveat": ("Random weights: the accept lengths say nothing about real models."
                       if setup.name == "tiny" else
                       "Real model, heads trained briefly on prompt text (see eagle_heads/README.md): "
                       "low generation acceptance is expected."),
            "vocab_size": model_config["vocab_size"],
            "num_prompts": args.num_prompts, "input_len": args.input_len,
            "output_len": args.output_len, "temperature": args.temperature,
            "max_concurrency": args.max_concurrency, "num_steps": args.num_steps,
            "dtype": args.dtype,
            "prompt_source": write_prompt_file(dataset, "sharegpt", 200, fallback=True),
            "command": run.command,
        }
        stem = ("sglang_serving" if args.model == "tiny"
                else f"sglang_serving_{args.model}_t{args.temperature:g}")
        book = ResultBook(args.out_dir / stem, run, meta, markdown_table,
                          key=lambda row: (row["config"],))
        for name in names:
            config = CONFIGS[name]
            cmd = server_command(config, setup, args)
            spec = ServerSpec(name, cmd, {"config": name, "note": config.note,
                                          "server_command": shown_command(cmd, workdir)},
                              timeout=args.server_timeout)
            measure_rows(spec, [{}], lambda server, row, name=name: measure(
                server, name, setup, dataset, args, workdir), book, workdir)
    table = book.finish()
    print(table)
    return 1 if book.failed() else 0


if __name__ == "__main__":
    sys.exit(main())
