"""Serving benchmark of HSD with a separate draft language model (``--hsd-draft-kind model``) on CPU.

For each server configuration a CPU server (``sglang_hsd.sglang_plugin.cpu.cpu_server``) is started
on 127.0.0.1 with the target and the draft language model, and SGLang's own serving client
(``python -m sglang.bench_serving --backend sglang --dataset-name sharegpt``) sends N prompts of
each prompt set (HumanEval, MT-Bench, from ``sglang_hsd.assets``; written in ShareGPT format) with
a fixed number of output tokens, for every temperature x max concurrency. Kept per run: output
tok/s, request/s, median TPOT and the accept length the client reads from ``/server_info``
(SGLang's average over its last decode-log interval of 40 steps: ``n/a`` for runs shorter than
that, e.g. the smoke test) and, per request, SGLang's ``spec_accept_length`` (mean ± standard
error over requests, ``benchmarks/serving_client.py``). The server is always killed afterwards.

Configurations (every server runs ``--dtype`` with ``--hsd-cpu-linear`` = ``--cpu-linear``, so
speculation and its reference run the same kernels; ``none-bf16`` excepted):
* ``none``        no speculation (throughput reference);
* ``none-bf16``   no speculation in bfloat16 with SGLang's own F.linear: plain decoding as a user
                  runs it here without this package's kernels (a second reference; its decode
                  steps are cheaper than float32's, its prefill far dearer);
* ``hsd``         ``--speculative-algorithm HSD --hsd-verify-method hsd``: drafts sampled from the
                  draft model's q, sequence-level verification;
* ``tokenwise``   the same with ``--hsd-verify-method tokenwise`` (the standard per-token rule);
* ``hsd-tree``    HSD with a sampled tree drafted by the draft model (``--speculative-eagle-topk``
                  = ``--tree-topk``, ``--speculative-num-draft-tokens`` = ``--tree-tokens``);
* ``standalone``  SGLang's own ``--speculative-algorithm STANDALONE`` (argmax drafts; on CPU its
                  verify takes the target's argmax for every batch, so at T > 0 it does not sample:
                  its T = 1 rows are greedy speculative decoding, not sampling).

    PYTHONPATH=. python benchmarks/bench_serving_standalone.py                  # Qwen2.5-Coder pair
    PYTHONPATH=. python benchmarks/bench_serving_standalone.py --num-prompts 16 \
        --temperatures 0,1 --concurrency 1,4 --configs none,hsd,none-bf16,tokenwise,standalone \
        --dtype float32 --cpu-linear onednn-packed --skip standalone@t1,none-bf16@c4
    PYTHONPATH=. python benchmarks/bench_serving_standalone.py --tiny --num-prompts 2 \
        --output-len 8 --temperatures 1 --concurrency 1     # smoke test, random tiny pair

Results: ``results/serving_standalone_<target>.{json,md}`` with the commit, the command and the
machine load (``benchmarks/common.py``), rewritten after every row (``"complete": false`` until the
last), so a stopped run keeps what it measured. Timings mean something only on an idle machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.bench_sglang_serving import KEPT_METRICS
from benchmarks.common import RESULTS_DIR, benchmark_parser, start_run, write_results
from benchmarks.serving_client import PER_REQUEST_CLIENT, PER_REQUEST_ENV, mean_se, read_per_request
from sglang_hsd.sglang_plugin.cpu.cpu_server import (
    cpu_linear_flags, cpu_server_command, draft_model_server_command, free_port, running_server,
    server_env)
from sglang_hsd.sglang_plugin.cpu.linear_path import CPU_LINEAR_PATHS

CONFIGS = {
    "none": "no speculative decoding",
    "none-bf16": ("no speculative decoding, bfloat16 weights and SGLang's own F.linear whatever "
                  "--dtype / --cpu-linear say (plain decoding without this package's kernels)"),
    "hsd": "HSD, draft LM, sampled drafts with q, verify_chain(method='hsd')",
    "tokenwise": "HSD, draft LM, sampled drafts with q, verify_chain(method='tokenwise')",
    "hsd-tree": ("HSD, draft LM, sampled tree (depth --num-steps, --tree-topk children per node, "
                 "--tree-tokens nodes), verify_tree(method='hsd'); all-greedy batches keep "
                 "SGLang's top-k tree"),
    "standalone": ("SGLang STANDALONE, argmax drafts; CPU verify is argmax for every batch, so "
                   "T > 0 rows are greedy speculative decoding"),
}
PROMPT_SETS = ("humaneval", "mtbench")


def server_command(config: str, target: Path, draft: Path, args) -> list[str]:
    """The CPU server command of ``config`` (a key of ``CONFIGS``)."""
    port = free_port()
    extra = ["--max-running-requests", str(max(args.concurrency))]
    if config == "none-bf16":
        return cpu_server_command(str(target), port, extra=extra + ["--dtype", "bfloat16"])
    extra += ["--dtype", args.dtype, *cpu_linear_flags(args.cpu_linear)]
    if config == "none":
        return cpu_server_command(str(target), port, extra=extra)
    if config in ("hsd", "tokenwise"):
        extra += ["--hsd-verify-method", config]
    algorithm = "STANDALONE" if config == "standalone" else "HSD"
    tree = config == "hsd-tree"
    return draft_model_server_command(str(target), port, str(draft), algorithm=algorithm,
                                      num_steps=args.num_steps, extra=extra,
                                      topk=args.tree_topk if tree else 1,
                                      num_draft_tokens=args.tree_tokens if tree else None)


def write_prompt_file(path: Path, prompt_set: str, count: int, tiny: bool) -> str:
    """``count`` prompts of ``prompt_set`` as ShareGPT-format JSON; returns their source."""
    if tiny:  # the random tiny pair: any text will do, no download
        from sglang_hsd.sglang_plugin.cpu.tiny_models import _CORPUS

        texts, source = [s.strip() for s in _CORPUS.split(".") if s.strip()], "tiny corpus"
    else:
        from sglang_hsd.runtime.loading import prompt_set_texts

        texts, source = prompt_set_texts(prompt_set, count), prompt_set
    records = [{"id": str(i), "conversations": [{"from": "human", "value": t},
                                                {"from": "gpt", "value": "ok"}]}
               for i, t in enumerate(texts[:count])]
    path.write_text(json.dumps(records))
    return f"{source} ({len(records)} prompts)"


def client_command(url: str, target: Path, dataset: Path, args, temperature: float,
                   concurrency: int, output_file: Path) -> list[str]:
    return [
        sys.executable, "-c", PER_REQUEST_CLIENT, "--backend", "sglang", "--base-url", url,
        "--model", str(target), "--tokenizer", str(target), "--dataset-name", "sharegpt",
        "--dataset-path", str(dataset), "--sharegpt-output-len", str(args.output_len),
        "--sharegpt-context-len", "4096", "--num-prompts", str(args.num_prompts),
        "--max-concurrency", str(concurrency), "--temperature", str(temperature),
        "--extra-request-body", json.dumps({"ignore_eos": True}), "--seed", "0",
        "--disable-tqdm", "--output-file", str(output_file),
    ]


def run_config(config: str, target: Path, draft: Path, datasets: dict, args,
               workdir: Path, on_row=lambda record: None) -> list[dict]:
    """Every (prompt set, temperature, concurrency) run against one server of ``config``;
    ``on_row(record)`` after each."""
    cmd = server_command(config, target, draft, args)
    shown = " ".join(cmd[1:]).replace(str(Path.home()), "~").replace(str(workdir), "$WORK")
    records = []
    try:
        with running_server(cmd, server_env(), str(workdir / f"server_{config}.log"),
                            timeout=args.server_timeout) as url:
            for prompt_set, dataset in datasets.items():
                for temperature in args.temperatures:
                    for concurrency in args.concurrency:
                        if skipped(args.skip, config, temperature, concurrency):
                            continue
                        records.append(run_client(url, config, shown, target, dataset, prompt_set,
                                                  temperature, concurrency, args, workdir))
                        on_row(records[-1])
    except Exception as err:  # the server did not start or died: one failed row
        records.append({"config": config, "server_command": shown,
                        "error": f"{type(err).__name__}: {err}"})
    return records


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


def run_client(url, config, shown, target, dataset, prompt_set, temperature, concurrency, args,
               workdir) -> dict:
    stem = f"{config}_{prompt_set}_t{temperature:g}_c{concurrency}"
    output_file, log_path = workdir / f"{stem}.jsonl", workdir / f"{stem}.log"
    record = {"config": config, "prompt_set": prompt_set, "temperature": temperature,
              "concurrency": concurrency, "server_command": shown}
    started = time.monotonic()
    per_request = workdir / f"{stem}.per_request.json"
    with open(log_path, "w") as log:
        proc = subprocess.run(client_command(url, target, dataset, args, temperature,
                                             concurrency, output_file),
                              env={**server_env(), PER_REQUEST_ENV: str(per_request)},
                              stdout=log, stderr=subprocess.STDOUT, timeout=args.client_timeout)
    if proc.returncode != 0 or not output_file.is_file():
        record["error"] = f"client exited {proc.returncode}; see {log_path}"
        return record
    result = json.loads(output_file.read_text().strip().splitlines()[-1])
    record.update({k: result.get(k) for k in KEPT_METRICS})
    accepted = read_per_request(per_request)
    record["accept_length_mean"], record["accept_length_se"] = mean_se(accepted)
    record["wall_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(record), flush=True)
    return record


def _fmt(value, digits=2):
    return "n/a" if value is None else f"{value:.{digits}f}"


def _ratio(record: dict, plain: dict) -> str:
    """Output tok/s over a baseline's (``plain``: (prompt set, T, concurrency) -> tok/s)."""
    base = plain.get((record["prompt_set"], record["temperature"], record["concurrency"]))
    if not base or record.get("output_throughput") is None:
        return "n/a"
    return f"{record['output_throughput'] / base:.2f}x"


def _baseline(records: list[dict], config: str) -> dict:
    return {(r["prompt_set"], r["temperature"], r["concurrency"]): r.get("output_throughput")
            for r in records if r["config"] == config and "error" not in r}


def _accept_cell(record: dict) -> str:
    mean, se = record.get("accept_length_mean"), record.get("accept_length_se")
    if mean is None or mean != mean:  # no speculation, or no request reported one
        return "n/a"
    return f"{mean:.2f} ± {se:.2f}" if se == se else f"{mean:.2f}"


def _tree_text(meta: dict) -> str:
    if "hsd-tree" not in meta["configs"] or not meta.get("tree"):
        return ""
    return f" (hsd-tree: k = {meta['tree'][0]} children per node, N = {meta['tree'][1]} nodes)"


def markdown_table(records: list[dict], meta: dict) -> str:
    lines = ["| config | prompts | T | concurrency | completed | output tok/s | vs none | "
             "vs none-bf16 | median TPOT ms | accept length (server) | accept length per request |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    plain, plain_bf16 = _baseline(records, "none"), _baseline(records, "none-bf16")
    for r in records:
        if "error" in r:
            lines.append(f"| {r['config']} | {r.get('prompt_set', '')} | "
                         f"{r.get('temperature', '')} | {r.get('concurrency', '')} | failed: "
                         f"{r['error']} | | | | | | |")
            continue
        lines.append(f"| {r['config']} | {r['prompt_set']} | {r['temperature']:g} | "
                     f"{r['concurrency']} | {r['completed']}/{meta['num_prompts']} | "
                     f"{_fmt(r['output_throughput'])} | {_ratio(r, plain)} | {_ratio(r, plain_bf16)} | "
                     f"{_fmt(r['median_tpot_ms'], 1)} | "
                     f"{_fmt(r['accept_length'])} | {_accept_cell(r)} |")
    notes = [f"- `{name}`: {CONFIGS[name]}" for name in meta["configs"]]
    if meta.get("skipped"):
        notes.append(f"- rows not run (--skip): {meta['skipped']}")
    return "\n".join([
        f"SGLang {meta['sglang_version']} on CPU ({meta['cpu_count']} cores): target "
        f"{meta['target']}, draft {meta['draft']}, {meta['num_steps']} draft steps"
        f"{_tree_text(meta)}, "
        f"{meta['num_prompts']} prompts per set x {meta['output_len']} output tokens, dtype "
        f"{meta['dtype']}, CPU linear path {meta.get('cpu_linear', 'mkl')} (none-bf16 excepted). "
        f"Prompts: {', '.join(meta['prompt_sources'])}.", "", *lines, "",
        *notes, ""])


def parse_args(argv=None):
    parser = benchmark_parser(__doc__.split("\n\n")[0], full_doc=False)
    parser.add_argument("--target", default="qwen2.5-coder-1.5b",
                        help="target: a cached model name (sglang-hsd fetch) or a folder")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b", help="draft language model")
    parser.add_argument("--tiny", action="store_true",
                        help="a random tiny target/draft pair built here (smoke test)")
    parser.add_argument("--configs", default="none,hsd,tokenwise,standalone",
                        help=f"comma-separated, from {sorted(CONFIGS)}")
    parser.add_argument("--prompt-sets", default=",".join(PROMPT_SETS))
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--temperatures", default="0,1")
    parser.add_argument("--concurrency", default="1,4")
    parser.add_argument("--num-steps", type=int, default=4)
    parser.add_argument("--tree-topk", type=int, default=2, help="hsd-tree: children per node")
    parser.add_argument("--tree-tokens", type=int, default=8,
                        help="hsd-tree: node budget N, root included")
    parser.add_argument("--dtype", default="bfloat16",
                        help="server --dtype (SGLang's 'auto' picks float16, slow on most CPUs)")
    parser.add_argument("--cpu-linear", default="mkl", choices=CPU_LINEAR_PATHS,
                        help="--hsd-cpu-linear of every server but none-bf16 (onednn-packed needs "
                             "--dtype float32)")
    parser.add_argument("--skip", default="",
                        help="rows not to run, e.g. standalone@t1,none-bf16@c4 (a config at a "
                             "temperature or a concurrency); listed in the table")
    parser.add_argument("--server-timeout", type=float, default=1200.0)
    parser.add_argument("--client-timeout", type=float, default=7200.0)
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--name", default=None,
                        help="results file stem (default serving_standalone_<target>)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="keep logs (and the tiny pair) here (default: a temp dir, removed)")
    args = parser.parse_args(argv)
    args.temperatures = [float(t) for t in args.temperatures.split(",")]
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    args.skip_text, args.skip = args.skip, parse_skip(args.skip)
    unknown = sorted(set(args.configs) - set(CONFIGS))
    if unknown:
        raise SystemExit(f"--configs: unknown {unknown}; choose from {sorted(CONFIGS)}")
    return args


def resolve_models(args, workdir: Path) -> tuple[Path, Path]:
    if args.tiny:
        from sglang_hsd.sglang_plugin.cpu.tiny_models import build_tiny_draft_pair

        return tuple(Path(p) for p in build_tiny_draft_pair(str(workdir / "tiny")))
    cache = Path(os.environ.get("SGLANG_HSD_CACHE", Path.home() / ".cache" / "sglang-hsd"))
    paths = [Path(m) if Path(m).is_dir() else cache / "models" / m for m in (args.target, args.draft)]
    missing = [str(p) for p in paths if not p.is_dir()]
    if missing:
        raise SystemExit(f"missing {missing}: run `sglang-hsd fetch {args.target}` and "
                         f"`sglang-hsd fetch {args.draft}`")
    return paths[0], paths[1]


def main(argv=None) -> int:
    args = parse_args(argv)
    import sglang

    run = start_run(__file__, argv)
    with tempfile.TemporaryDirectory(prefix="hsd_standalone_bench_") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        target, draft = resolve_models(args, workdir)
        datasets, sources = {}, []
        for prompt_set in [s for s in args.prompt_sets.split(",") if s]:
            datasets[prompt_set] = workdir / f"prompts_{prompt_set}.json"
            sources.append(write_prompt_file(datasets[prompt_set], prompt_set, args.num_prompts,
                                             args.tiny))
        meta = {"sglang_version": sglang.__version__, "cpu_count": os.cpu_count(),
                "target": "tiny random" if args.tiny else target.name,
                "draft": "tiny random" if args.tiny else draft.name,
                "num_steps": args.num_steps, "tree": [args.tree_topk, args.tree_tokens],
                "num_prompts": args.num_prompts,
                "output_len": args.output_len, "dtype": args.dtype, "cpu_linear": args.cpu_linear,
                "skipped": args.skip_text,
                "configs": args.configs,
                "prompt_sources": sources, "command": run.command}
        records = []
        stem = args.out_dir / (args.name or f"serving_standalone_{'tiny' if args.tiny else target.name}")

        def save(rows: list[dict], complete: bool) -> str:
            """(Re)write the results: after every row, so a stopped run keeps what it measured."""
            table = markdown_table(rows, meta)
            if not complete:
                table += ("\n**Partial run**: the rows above are those measured so far; the run "
                          "was stopped (or is still going) before every configuration ran.\n")
            write_results(stem, {"meta": {**meta, "complete": complete}, "results": rows}, table, run)
            return table

        measured: list[dict] = []

        def on_row(record: dict) -> None:
            measured.append(record)
            save(measured, complete=False)

        for config in args.configs:
            print(f"[bench] {config} ...", flush=True)
            records += run_config(config, target, draft, datasets, args, workdir, on_row=on_row)
    table = save(records, complete=True)
    print(table)
    return 1 if any("error" in r for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
