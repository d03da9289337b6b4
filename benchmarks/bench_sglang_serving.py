"""Serving benchmark on CPU: SGLang 0.5.23 with ``--speculative-algorithm HSD`` vs the alternatives.

For each configuration a CPU server (``sglang_hsd.sglang_plugin.cpu.cpu_server``) is started on
127.0.0.1 with a tiny random Llama target and a random EAGLE-3 head over half its vocabulary (as
in ``tests/sglang_plugin/test_server_e2e.py``), SGLang's own client ``python -m
sglang.benchmark.serving --backend sglang --dataset-name random`` sends a bounded number of
requests, and its result line (throughput, latencies, ``accept_length`` from ``/server_info``) is
kept. The server is always killed afterwards.

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

``datasets`` (imported by SGLang's benchmark package for MMMU only) is replaced by an import stub
in the client process when it is not installed. The ``random`` dataset takes its prompt tokens
from a ShareGPT-format file; we write one from ``sglang_hsd.assets``' ShareGPT prompts (or the
tiny tokenizer's built-in text when those cannot be fetched), so no download from the hub.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

from benchmarks.common import RESULTS_DIR, benchmark_parser, start_run, write_results
from benchmarks.serving_client import DATASETS_STUB
from sglang_hsd.runtime.loading import prompt_set_texts
from sglang_hsd.sglang_plugin.cpu.cpu_server import (
    cpu_server_command, free_port, running_server, server_env)
from sglang_hsd.sglang_plugin.exit_stats import ExitLevelStats

# The client, run as ``python -c BENCH_CLIENT <args>``: stub ``datasets`` if absent, then run
# SGLang's module as __main__ (exactly ``python -m sglang.benchmark.serving <args>``).
BENCH_CLIENT = DATASETS_STUB + """
import runpy
sys.argv[0] = "sglang.benchmark.serving"
runpy.run_module("sglang.benchmark.serving", run_name="__main__", alter_sys=True)
"""
# Fields of the client's result line that go into the table and the JSON summary.
KEPT_METRICS = (
    "completed", "duration", "total_output_tokens", "request_throughput", "output_throughput",
    "mean_e2e_latency_ms", "median_tpot_ms", "median_itl_ms", "accept_length",
)


@dataclass
class ServerConfig:
    """One server to benchmark.

    Fields:
        name: key in the results.
        algorithm: ``--speculative-algorithm`` (None: no speculation).
        verify_method: ``--hsd-verify-method`` for HSD.
        note: what the row measures, printed under the table.
    """

    name: str
    algorithm: str | None
    verify_method: str | None = None
    note: str = ""
    extra: list[str] = field(default_factory=list)


CONFIGS = {
    "hsd": ServerConfig("hsd", "HSD", "hsd", "HSD, sequence-level verify_chain(method='hsd')"),
    "tokenwise": ServerConfig("tokenwise", "HSD", "tokenwise",
                              "HSD plugin with token-wise verify_chain (SGLang's rule, our code)"),
    "eagle3": ServerConfig(
        "eagle3", "EAGLE3", None,
        "SGLang EAGLE3, argmax drafts; CPU verify is argmax for every batch (temperature "
        "ignored, upstream bug: patches/0003), so this row is greedy speculative decoding"),
    "none": ServerConfig("none", None, None, "no speculative decoding"),
    "hsd-exit": ServerConfig(
        "hsd-exit", "HSD", "hsd",
        "HSD 3-level: EAGLE-3 drafts, early exit (first L layers + exit head) verifies with hsd, "
        "the remaining layers run only for the positions the exit accepted"),
    "hsd-exit-window": ServerConfig(
        "hsd-exit-window", "HSD", "hsd",
        "hsd-exit with exit buffer N_i = K + 1 (--hsd-exit-buffer): exit sub-rounds (EAGLE-3 "
        "drafts continuing the exit's chain) fill the verify window before the full target runs"),
}


@dataclass
class ModelSetup:
    """Target, EAGLE-3 head and exit heads of one benchmark run.

    Fields:
        name: ``tiny`` (built here, random) or a model from the sglang-hsd cache.
        target, head: folders. exit_heads: folder or None (logit lens). exit_layer: L.
        dataset: client ``--dataset-name`` (random token ids for the tiny model, ShareGPT text
            for a real one).
    """

    name: str
    target: Path
    head: Path
    exit_heads: Path | None
    exit_layer: int
    dataset: str


def setup_models(args, workdir: Path) -> ModelSetup:
    if args.model == "tiny":
        target, head = build_models(workdir)
        return ModelSetup("tiny", target, head, None, args.exit_layer or 2, "random")
    cache = Path(os.environ.get("SGLANG_HSD_CACHE", Path.home() / ".cache" / "sglang-hsd"))
    target = cache / "models" / args.model
    heads = cache / "heads" / args.model
    missing = [p for p in (target, heads / "eagle3") if not p.is_dir()]
    if missing:
        raise SystemExit(f"missing {missing}: run `sglang-hsd fetch {args.model}` and train its "
                         "heads with eagle_heads first")
    exit_heads = Path(args.exit_heads) if args.exit_heads else heads / "exit"
    if args.exit_heads == "none" or not exit_heads.is_dir():
        exit_heads = None
    return ModelSetup(args.model, target, heads / "eagle3", exit_heads, args.exit_layer or 16,
                      "sharegpt")


def build_models(root: Path):
    from eagle_heads.eagle3 import build_random_eagle3_head
    from sglang_hsd.sglang_plugin.cpu.tiny_models import build_tiny_llama

    config = build_tiny_llama(str(root / "target"))
    build_random_eagle3_head(str(root / "eagle3"), config, draft_vocab_size=config.vocab_size // 2)
    return root / "target", root / "eagle3"


def _model_description(setup: ModelSetup, config: dict) -> str:
    if setup.name == "tiny":
        return (f"tiny random Llama (vocab {config['vocab_size']}, {config['num_hidden_layers']} "
                f"layers, hidden {config['hidden_size']}) + random EAGLE-3 head over half the "
                "vocabulary")
    return (f"{setup.name} ({config['num_hidden_layers']} layers, hidden "
            f"{config['hidden_size']}) + trained EAGLE-3 head")


def write_sharegpt_file(path: Path, count: int = 200) -> str:
    """ShareGPT-format JSON (two turns per record) for ``--dataset-name random``; returns its
    source."""
    try:
        texts = prompt_set_texts("sharegpt", count)
        source = "sharegpt (sglang_hsd.assets)"
    except Exception as err:  # offline and not cached: any text gives random token ids
        from sglang_hsd.sglang_plugin.cpu.tiny_models import _CORPUS

        texts = [s.strip() + "." for s in _CORPUS.split(".") if s.strip()]
        source = f"tiny built-in corpus (ShareGPT unavailable: {type(err).__name__})"
    records = [{"id": str(i), "conversations": [{"from": "human", "value": t},
                                                {"from": "gpt", "value": "ok"}]}
               for i, t in enumerate(texts) if t.strip()]
    path.write_text(json.dumps(records))
    return source


def client_command(url: str, setup: ModelSetup, dataset: Path, args, output_file: Path) -> list[str]:
    if setup.dataset == "random":
        data = ["--dataset-name", "random", "--random-input-len", str(args.input_len),
                "--random-output-len", str(args.output_len), "--random-range-ratio", "1.0"]
    else:
        data = ["--dataset-name", "sharegpt", "--sharegpt-output-len", str(args.output_len),
                "--sharegpt-context-len", "2048"]
    return [
        sys.executable, "-c", BENCH_CLIENT, "--backend", "sglang", "--base-url", url,
        "--model", str(setup.target), "--tokenizer", str(setup.target), *data,
        "--dataset-path", str(dataset), "--num-prompts", str(args.num_prompts),
        "--max-concurrency", str(args.max_concurrency),
        "--temperature", str(args.temperature), "--seed", "0", "--disable-tqdm",
        "--output-file", str(output_file),
    ]


def run_config(config: ServerConfig, setup: ModelSetup, dataset: Path, args,
               workdir: Path) -> dict:
    port = free_port()
    extra = list(config.extra) + ["--dtype", args.dtype]
    if config.verify_method:
        extra += ["--hsd-verify-method", config.verify_method]
    if config.name.startswith("hsd-exit"):
        extra += ["--hsd-exit-layer", str(setup.exit_layer), "--hsd-exit-heads",
                  str(setup.exit_heads) if setup.exit_heads else "none"]
    if config.name == "hsd-exit-window":
        extra += ["--hsd-exit-buffer", str(args.num_steps + 1)]
    cmd = cpu_server_command(str(setup.target), port, config.algorithm,
                             str(setup.head) if config.algorithm else None,
                             num_steps=args.num_steps if config.algorithm else None,
                             extra=extra, eagle3_rejection_sampling=False)
    server_log = workdir / f"server_{config.name}.log"
    client_log = workdir / f"client_{config.name}.log"
    output_file = workdir / f"client_{config.name}.jsonl"
    started = time.monotonic()
    record = {"config": config.name, "note": config.note,
              "server_command": " ".join(cmd[1:]).replace(str(workdir), "$WORK")}
    try:
        with running_server(cmd, server_env(), str(server_log), timeout=args.server_timeout) as url:
            record["startup_s"] = round(time.monotonic() - started, 1)
            levels_before = _hsd_levels(url)
            client = client_command(url, setup, dataset, args, output_file)
            with open(client_log, "w") as log:
                proc = subprocess.run(client, env=server_env(), stdout=log,
                                      stderr=subprocess.STDOUT, timeout=args.client_timeout)
            if proc.returncode != 0:
                raise RuntimeError(f"client exited {proc.returncode}; see {client_log}")
            result = json.loads(output_file.read_text().strip().splitlines()[-1])
            record["hsd_levels"] = _levels_delta(levels_before, _hsd_levels(url))
    except Exception as err:
        record["error"] = f"{type(err).__name__}: {err}"
        record["server_log_tail"] = _tail(server_log)
        return record
    record.update({k: result.get(k) for k in KEPT_METRICS})
    record["client_summary"] = _summary_block(client_log)
    return record


def _hsd_levels(url: str) -> dict | None:
    """The exit level's counters from ``/server_info`` (None without an exit level)."""
    import urllib.request

    with urllib.request.urlopen(url + "/server_info", timeout=30) as resp:
        state = json.loads(resp.read())["internal_states"][0].get("hsd") or {}
    return state.get("levels")


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


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _summary_block(path: Path) -> str:
    """The client's printed result table (from '====' to the end)."""
    text = path.read_text(errors="replace")
    start = text.find("============ Serving Benchmark Result")
    return text[start:].strip() if start >= 0 else _tail(path, 40)


def _fmt(value, digits=2):
    return "n/a" if value is None else f"{value:.{digits}f}"


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
            f"{_fmt(r['output_throughput'])} | {_fmt(r['request_throughput'], 3)} | "
            f"{_fmt(r['mean_e2e_latency_ms'], 0)} | {_fmt(r['median_tpot_ms'], 1)} | "
            f"{_fmt(r['accept_length'])} | {_fmt(levels.get('exit_subrounds_per_round'))} | "
            f"{_fmt(levels.get('exit_accept_length'))} | "
            f"{_fmt(levels.get('target_accept_rate'))} | "
            f"{_fmt(levels.get('layer_forwards_saved'))} |")
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
        setup = setup_models(args, workdir)
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
            "prompt_source": write_sharegpt_file(dataset),
            "command": run.command,
        }
        records = []
        for name in names:
            print(f"[bench] {name} ...", flush=True)
            records.append(run_config(CONFIGS[name], setup, dataset, args, workdir))
            print(json.dumps({k: v for k, v in records[-1].items()
                              if k not in ("client_summary", "server_log_tail")}), flush=True)
    stem = ("sglang_serving" if args.model == "tiny"
            else f"sglang_serving_{args.model}_t{args.temperature:g}")
    table = markdown_table(records, meta)
    write_results(args.out_dir / stem, {"meta": meta, "results": records}, table, run)
    print(table)
    return 1 if any("error" in r for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
