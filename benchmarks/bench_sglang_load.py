"""Load test of the HSD server with the early-exit level on CPU (loopback only).

One server (``--speculative-algorithm HSD --hsd-exit-layer L``, radix cache off so that every
finished request returns its KV slots) gets, at the same time:

* SGLang's own serving benchmark client (``python -m sglang.benchmark.serving``) with
  ``--max-concurrency 32``, temperature 1, top-p 0.9 (``--extra-request-body``);
* 32 concurrent ``/generate`` requests of our own with mixed temperatures (0, 0.7, 1, 1.3),
  top-k / top-p and lengths (8-64 new tokens), a quarter of them streamed and dropped by the
  client after a few chunks (SGLang aborts those requests).

Checks (the script exits non-zero when one fails): the server stays healthy and logs no
traceback; every completed response has exactly its requested number of tokens (ignore_eos) and
only valid token ids; the KV pool's free-slot count (``/server_info`` -> ``hsd``) is back at its
starting value after the load; per-level statistics. Results: ``results/sglang_load*.{md,json}``.

    PYTHONPATH=. python benchmarks/bench_sglang_load.py                          # tiny random model
    PYTHONPATH=. python benchmarks/bench_sglang_load.py --model smollm2-135m --output-len 24
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.common import RESULTS_DIR, benchmark_parser, start_run, write_results
from benchmarks.serving_harness import (
    ClientError, ClientSpec, ModelSetup, ServerSpec, cpu_server, read_server_info, run_client,
    setup_models, write_prompt_file)
from sglang_hsd.sglang_plugin.cpu.cpu_server import cpu_server_command, free_port

TEMPERATURES = (0.0, 0.7, 1.0, 1.3)


def _request(url: str, path: str, payload: dict | None = None, timeout: float = 900):
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url + path, data=data,
                                 headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=timeout)


def make_jobs(count: int, seed: int, vocab: int) -> list[dict]:
    """Mixed requests: token-id prompts, temperatures, top-k / top-p, lengths, aborts."""
    rng = random.Random(seed)
    jobs = []
    for index in range(count):
        sampling = {"temperature": TEMPERATURES[index % len(TEMPERATURES)],
                    "max_new_tokens": rng.choice((8, 16, 32, 64)), "ignore_eos": True}
        if index % 3 == 1:
            sampling["top_p"] = 0.9
        if index % 5 == 2:
            sampling["top_k"] = 20
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randrange(4, 40))]
        jobs.append({"input_ids": prompt, "sampling_params": sampling, "rid": f"load-{index}",
                     "abort_after_chunks": 3 if index % 4 == 3 else None})
    return jobs


def run_job(url: str, job: dict, vocab: int) -> dict:
    payload = {"input_ids": job["input_ids"], "sampling_params": job["sampling_params"]}
    want = job["sampling_params"]["max_new_tokens"]
    started = time.monotonic()
    if job["abort_after_chunks"] is None:
        with _request(url, "/generate", payload) as resp:
            out = json.loads(resp.read())
        ids = out["output_ids"]
        valid = len(ids) == want and all(0 <= t < vocab for t in ids)
        return {"kind": "complete", "valid": valid, "tokens": len(ids),
                "seconds": time.monotonic() - started,
                "exit_rounds": len(out["meta_info"].get("hsd_exit_accepted", []))}
    payload["stream"] = True
    payload["rid"] = job["rid"]
    chunks, finish = 0, None
    with _request(url, "/generate", payload) as resp:
        for line in resp:
            if not line.startswith(b"data:") or b"[DONE]" in line:
                continue
            chunks += 1
            if chunks == job["abort_after_chunks"]:  # abort midway, keep reading to the end
                _request(url, "/abort_request", {"rid": job["rid"]}).close()
            finish = json.loads(line[5:])["meta_info"].get("finish_reason") or finish
    aborted = isinstance(finish, dict) and finish.get("type") == "abort"
    return {"kind": "aborted" if aborted else "complete", "valid": True, "chunks": chunks,
            "finish_reason": finish, "seconds": time.monotonic() - started}


def run_serving_client(url: str, setup: ModelSetup, dataset: Path, args, workdir: Path) -> dict:
    """SGLang's client at concurrency ``--num-requests``, T = 1, top-p 0.9: its result line."""
    spec = ClientSpec(setup.target, dataset, args.num_requests, args.output_len, 1.0,
                      args.num_requests, dataset_name="random", input_len=24,
                      random_range_ratio=0.5, extra_request_body={"top_p": 0.9, "ignore_eos": True},
                      seed=1)
    try:
        return run_client(url, spec, workdir, "serving", args.client_timeout).metrics
    except ClientError as err:
        return {"error": str(err)}


def load(url: str, setup, dataset: Path, args, workdir: Path) -> dict:
    vocab = json.loads((setup.target / "config.json").read_text())["vocab_size"]
    jobs = make_jobs(args.num_requests, args.seed, vocab)
    serving: dict = {}
    client = threading.Thread(target=lambda: serving.update(run_serving_client(
        url, setup, dataset, args, workdir)))
    started = time.monotonic()
    client.start()
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        results = list(pool.map(lambda job: _safe(run_job, url, job, vocab), jobs))
    client.join()
    return {"seconds": time.monotonic() - started, "jobs": jobs, "results": results,
            "serving": {k: serving.get(k) for k in (
                "completed", "total_output_tokens", "output_throughput", "accept_length",
                "error")}}


def _safe(fn, *args):
    try:
        return fn(*args)
    except Exception as err:  # a failed request is a result, not a crash of the script
        return {"kind": "error", "valid": False, "error": f"{type(err).__name__}: {err}"}


def wait_idle(url: str, free_at_start: int, timeout: float = 120.0) -> int:
    """Poll until the KV pool's free slots are back (aborted requests finish asynchronously)."""
    deadline = time.monotonic() + timeout
    free = read_server_info(url).hsd["kv_available_size"]
    while free != free_at_start and time.monotonic() < deadline:
        time.sleep(2.0)
        free = read_server_info(url).hsd["kv_available_size"]
    return free


def summarize(run: dict, before: dict, after: dict, free_after: int, log_text: str, meta: dict):
    results = run["results"]
    completed = [r for r in results if r["kind"] == "complete"]
    summary = {
        **meta,
        "our_requests": len(results),
        "completed": len(completed),
        "aborted_by_client": sum(r["kind"] == "aborted" for r in results),
        "errors": [r["error"] for r in results if r["kind"] == "error"],
        "all_completed_valid": all(r["valid"] for r in completed),
        "serving_client": run["serving"],
        "wall_seconds": round(run["seconds"], 1),
        "kv_free_before": before["kv_available_size"],
        "kv_free_after": free_after,
        "server_tracebacks": log_text.count("Traceback"),
        "levels": after.get("levels"),
    }
    summary["passed"] = (not summary["errors"] and summary["all_completed_valid"]
                         and summary["aborted_by_client"] > 0
                         and summary["kv_free_after"] == summary["kv_free_before"]
                         and summary["server_tracebacks"] == 0
                         and (run["serving"].get("completed") == meta["num_requests"]))
    return summary


def markdown(summary: dict) -> str:
    s = summary
    levels = s.get("levels") or {}
    serving = s["serving_client"]
    return "\n".join([
        f"Load test, SGLang HSD server with the exit level at layer {s['exit_layer']} "
        f"({s['exit_heads']}, exit buffer N_i = {s.get('exit_buffer', 1)}), {s['model']}, CPU "
        f"({s['cpu_count']} cores), loopback.", "",
        "| check | result |", "|---|---|",
        f"| our mixed requests (T in {list(TEMPERATURES)}, top-k/top-p, 8-64 tokens) | "
        f"{s['completed']} completed, {s['aborted_by_client']} aborted midway (finish reason "
        f"abort), "
        f"{len(s['errors'])} errors |",
        f"| every completed response valid (length, token ids) | {s['all_completed_valid']} |",
        f"| sglang.benchmark.serving, {s['num_requests']} prompts at concurrency "
        f"{s['num_requests']} (T=1, top-p 0.9) | {serving.get('completed')} completed, "
        f"{serving.get('output_throughput') or 0:.2f} output tok/s, accept length "
        f"{serving.get('accept_length')} |",
        f"| KV free slots before / after | {s['kv_free_before']} / {s['kv_free_after']} |",
        f"| tracebacks in the server log | {s['server_tracebacks']} |",
        f"| exit accept length / target accept rate / target layer-forwards saved | "
        f"{levels.get('exit_accept_length', 0):.2f} / {levels.get('target_accept_rate', 0):.2f} / "
        f"{levels.get('layer_forwards_saved', 0):.2f} |",
        f"| wall time | {s['wall_seconds']} s |", "",
        f"Passed: **{s['passed']}**", ""])


def parse_args(argv=None):
    parser = benchmark_parser(__doc__.split("\n\n")[0], full_doc=False)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--exit-layer", type=int, default=None)
    parser.add_argument("--exit-heads", default=None)
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--num-steps", type=int, default=3)
    parser.add_argument("--exit-buffer", type=int, default=1,
                        help="--hsd-exit-buffer N_i (exit sub-rounds per verify window)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--client-timeout", type=float, default=1800.0)
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--workdir", type=Path, default=None)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    run = start_run(__file__, argv)
    with tempfile.TemporaryDirectory(prefix="hsd_load_") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        setup = setup_models(args.model, workdir, args.exit_layer, args.exit_heads)
        dataset = workdir / "sharegpt_format.json"
        write_prompt_file(dataset, "sharegpt", 200, fallback=True)
        cmd = cpu_server_command(str(setup.target), free_port(), "HSD", str(setup.head),
                                 num_steps=args.num_steps, extra=[
            "--hsd-exit-layer", str(setup.exit_layer), "--hsd-exit-heads",
            str(setup.exit_heads) if setup.exit_heads else "none", "--dtype", args.dtype,
            "--disable-radix-cache", "--max-running-requests", "32",
            "--hsd-exit-buffer", str(args.exit_buffer)])
        meta = {"model": setup.name, "exit_layer": setup.exit_layer, "cpu_count": run.cpu_count,
                "exit_buffer": args.exit_buffer,
                "exit_heads": "trained heads" if setup.exit_heads else "logit lens",
                "num_requests": args.num_requests,
                "command": run.command}
        with cpu_server(ServerSpec("load", cmd, {}, timeout=900), workdir) as server:
            before = read_server_info(server.url).hsd
            measured = load(server.url, setup, dataset, args, workdir)
            free_after = wait_idle(server.url, before["kv_available_size"])
            after = read_server_info(server.url).hsd
            with _request(server.url, "/health") as resp:
                assert resp.status == 200
        log_text = (workdir / "server_load.log").read_text(errors="replace")
        summary = summarize(measured, before, after, free_after, log_text, meta)
    stem = "sglang_load" if args.model == "tiny" else f"sglang_load_{args.model}"
    if args.exit_buffer != 1:
        stem += f"_buffer{args.exit_buffer}"
    write_results(args.out_dir / stem, summary, markdown(summary), run)
    print(markdown(summary))
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
