"""Where a CPU server's decoding time goes: cProfile of SGLang's scheduler, summed per round phase.

Starts one server of ``bench_serving_standalone.py``'s configurations (same flags: ``--dtype``,
``--cpu-linear``, ``--num-steps``, tree shape) with cProfile running in every process it spawns
(a ``sitecustomize`` put before the CPU shims' one on ``PYTHONPATH``), sends ``--num-prompts``
prompts of a prompt set one at a time (``--output-len`` tokens, ``--temperature``), and reads the
scheduler process's profile:

* ``verify``: SGLang's verify step (target forward over the drafts plus our verifier), and inside
  it ``verifier`` (``verify_chain`` / ``verify_tree``) and ``target forward``;
* ``draft``: the draft loop (K draft forwards, or the sampled tree loop);
* ``draft extend``: the draft model re-running the accepted tokens after each verify;
* ``target forward``: every target forward (prefill, decode step, verify forward);
* ``linear``: every linear call (``F.linear``, oneDNN's packed kernel, the lm head's matmul),
  wherever it runs;
* ``attention``: the torch stand-ins of SGLang's CPU attention ops.

Times are cProfile's cumulative seconds (the profiler itself slows Python-heavy parts more than
kernels, so shares are indicative) and per decoding round (per verify call; without speculation
per target forward, prefills included).

    PYTHONPATH=. python benchmarks/profile_server.py --config hsd --prompt-set mtbench \\
        --dtype float32 --cpu-linear onednn-packed

Results: ``results/profile_server_<config>_<prompt set>.{json,md}`` with the commit, the command
and the machine load. Run it on an idle machine.
"""

from __future__ import annotations

import json
import os
import pstats
import shlex
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.bench_serving_standalone import (
    CONFIGS, ServerOptions, add_server_arguments, server_command)
from benchmarks.common import benchmark_parser, start_run, write_results
from benchmarks.serving_harness import (
    ServerSpec, cpu_server, prompt_file_texts, resolve_models, write_prompt_file)
from sglang_hsd.sglang_plugin import BOOTSTRAP_DIR
from sglang_hsd.sglang_plugin.cpu.cpu_server import server_env

# Runs first in every process the server spawns: the CPU shims, then a profiler dumped every few
# seconds (the server is killed, so nothing runs at exit).
PROFILING_SITECUSTOMIZE = '''
import os, threading, time, cProfile
exec(open({bootstrap!r}).read())
_profile = cProfile.Profile()
_profile.enable()

def _dump():
    while True:
        time.sleep({every})
        tmp = os.path.join({out!r}, f"tmp_{{os.getpid()}}")
        try:
            _profile.dump_stats(tmp)
            os.replace(tmp, os.path.join({out!r}, f"prof_{{os.getpid()}}.out"))
        except Exception:
            pass

threading.Thread(target=_dump, daemon=True).start()
'''
DUMP_EVERY_S = 5

# (row, file suffix, function name, "cum" or "self"): cProfile entries summed per row.
PHASES = (
    ("scheduler: run_batch", "managers/scheduler.py", "run_batch", "cum"),
    ("verify (target forward + verifier)", "speculative/eagle_worker_v2.py", "verify", "cum"),
    ("  verifier: verify_chain", "sglang_hsd/verify/chain/api.py", "verify_chain", "cum"),
    ("  verifier: verify_tree", "sglang_hsd/verify/tree/api.py", "verify_tree", "cum"),
    ("draft (draft forwards or sampled tree loop)", "speculative/eagle_worker_v2.py", "draft", "cum"),
    ("draft extend after verify", "speculative/eagle_worker_v2.py", "_draft_extend_for_decode", "cum"),
    ("draft tail extend after verify", "sglang_plugin/draft_catch_up.py", "extend_tail", "cum"),
    ("target forward (TpModelWorker)", "managers/tp_worker.py", "forward_batch_generation", "cum"),
    ("linear: F.linear", "", "<built-in method torch._C._nn.linear>", "self"),
    ("linear: oneDNN packed", "sglang_hsd/runtime/layers.py", "packed_linear", "cum"),
    ("lm head matmul", "", "<built-in method matmul of type object at", "self"),
    ("attention stand-in: extend", "sglang_plugin/cpu/kernel_ops.py", "extend_attention_cpu", "cum"),
    ("attention stand-in: decode", "sglang_plugin/cpu/kernel_ops.py", "decode_attention_cpu", "cum"),
)
WARMUP_TOKENS = 8


def phase_seconds(stats: dict) -> dict[str, tuple[float, int]]:
    """``stats``: ``pstats.Stats.stats``. Row -> (seconds, calls)."""
    out = {}
    for row, suffix, name, kind in PHASES:
        seconds, calls = 0.0, 0
        for (path, _, func), (_, ncalls, self_s, cum_s, _) in stats.items():
            if suffix in path and (func == name or (name.endswith(" at") and func.startswith(name))):
                seconds += cum_s if kind == "cum" else self_s
                calls += ncalls
        out[row] = (seconds, calls)
    return out


def scheduler_profile(folder: Path) -> pstats.Stats:
    """The profile of the process that ran the scheduler (the most time in ``run_batch``)."""
    best, best_s = None, -1.0
    for path in sorted(folder.glob("prof_*.out")):
        stats = pstats.Stats(str(path))
        seconds = phase_seconds(stats.stats)["scheduler: run_batch"][0]
        if seconds > best_s:
            best, best_s = stats, seconds
    if best is None or best_s <= 0:
        raise SystemExit(f"no scheduler profile in {folder}: the server did not run a batch")
    return best


def send_prompts(url: str, texts: list[str], output_len: int, temperature: float,
                 concurrency: int = 1) -> list[dict]:
    """Up to ``concurrency`` requests at a time (each prompt once, in order of submission); per
    request: seconds, completion tokens, accept length."""
    if concurrency > 1:
        with ThreadPoolExecutor(concurrency) as pool:
            return list(pool.map(lambda text: send_prompts(url, [text], output_len, temperature)[0],
                                 texts))
    out = []
    for text in texts:
        body = {"text": text, "sampling_params": {"temperature": temperature, "ignore_eos": True,
                                                  "max_new_tokens": output_len}}
        req = urllib.request.Request(url + "/generate", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        started = time.monotonic()
        with urllib.request.urlopen(req, timeout=3600) as resp:
            meta = json.loads(resp.read())["meta_info"]
        out.append({"seconds": round(time.monotonic() - started, 2),
                    "completion_tokens": meta["completion_tokens"],
                    "accept_length": meta.get("spec_accept_length"),
                    "verify_calls": meta.get("spec_verify_ct")})
    return out


def markdown(result: dict) -> str:
    meta = result["meta"]
    lines = [f"# Server profile: `{meta['config']}` on {meta['prompt_set']}", "",
             f"{meta['target']} (draft {meta['draft']}), dtype {meta['dtype']}, CPU linear path "
             f"{meta['cpu_linear']}, {meta['num_prompts']} prompts x {meta['output_len']} tokens, "
             f"{meta.get('concurrency', 1)} at a time, T = {meta['temperature']:g}"
             f"{' (server args: ' + meta['extra_server_args'] + ')' if meta.get('extra_server_args') else ''}; {result['rounds']} rounds "
             f"({result['tokens']} tokens, {result['tokens'] / max(result['rounds'], 1):.2f} per "
             "round). cProfile seconds in the scheduler process (cumulative, or the call's own "
             "time for kernels).", "",
             "| phase | seconds | share of run_batch | ms per round | calls |", "|---|---|---|---|---|"]
    total = result["phases"]["scheduler: run_batch"]["seconds"] or float("nan")
    for row, cell in result["phases"].items():
        if cell["calls"] == 0:
            continue
        lines.append(f"| {row} | {cell['seconds']:.2f} | {cell['seconds'] / total:.0%} | "
                     f"{1e3 * cell['seconds'] / max(result['rounds'], 1):.0f} | {cell['calls']} |")
    if result.get("hottest"):
        lines += ["", "Functions with the most own time (ms per round, calls):", ""]
        lines += [f"- `{h['function']}`: {h['ms_per_round']:.1f} ms, {h['calls']}" for h in result["hottest"]]
    lines += ["", "Requests: " + ", ".join(
        f"{r['completion_tokens']} tokens in {r['seconds']} s (accept length "
        f"{r['accept_length'] if r['accept_length'] is not None else 'n/a'})"
        for r in result["requests"]), ""]
    return "\n".join(lines)


def parse_args(argv=None):
    parser = benchmark_parser(__doc__.split("\n\n")[0], full_doc=False)
    add_server_arguments(parser, dtype="float32", cpu_linear="onednn-packed")
    parser.add_argument("--config", default="hsd", choices=sorted(CONFIGS))
    parser.add_argument("--prompt-set", default="mtbench")
    parser.add_argument("--num-prompts", type=int, default=3)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--concurrency", type=int, default=1,
                        help="requests in flight at once (the server's batch)")
    parser.add_argument("--extra-server-args", default="",
                        help="more server arguments, e.g. '--hsd-draft-lengths-cycle 0'")
    parser.add_argument("--name", default=None,
                        help="results file stem (default profile_server_<config>_<prompt set>)")
    args = parser.parse_args(argv)
    if args.concurrency < 1:
        parser.error(f"--concurrency must be >= 1, got {args.concurrency}")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    run = start_run(__file__, argv)
    with tempfile.TemporaryDirectory(prefix="hsd_profile_server_") as tmp:
        work = Path(tmp)
        target, draft = resolve_models(args.target, args.draft, work, args.tiny)
        prompts = work / "prompts.json"
        write_prompt_file(prompts, args.prompt_set, args.num_prompts, args.tiny)
        texts = prompt_file_texts(prompts)
        hook, profiles = work / "hook", work / "profiles"
        hook.mkdir()
        profiles.mkdir()
        (hook / "sitecustomize.py").write_text(PROFILING_SITECUSTOMIZE.format(
            bootstrap=os.path.join(BOOTSTRAP_DIR, "sitecustomize.py"), out=str(profiles),
            every=DUMP_EVERY_S))
        env = server_env()
        env["PYTHONPATH"] = os.pathsep.join([str(hook), env["PYTHONPATH"]])
        cmd = server_command(CONFIGS[args.config], target, draft,
                             ServerOptions.from_args(args, args.concurrency),
                             shlex.split(args.extra_server_args))
        with cpu_server(ServerSpec(args.config, cmd, {}, args.server_timeout, env), work) as server:
            send_prompts(server.url, texts[:1], WARMUP_TOKENS, args.temperature)  # profiled too
            started = time.monotonic()
            requests = send_prompts(server.url, texts, args.output_len, args.temperature,
                                    args.concurrency)
            wall = time.monotonic() - started
            time.sleep(3 * DUMP_EVERY_S)  # let every process dump after the last request
        stats = scheduler_profile(profiles).stats
    phases = phase_seconds(stats)
    rounds = (phase_seconds_calls(stats, "speculative/eagle_worker_v2.py", "verify")
              or phase_seconds_calls(stats, "managers/tp_worker.py", "forward_batch_generation"))
    result = {
        "meta": {"config": args.config, "prompt_set": args.prompt_set,
                 "target": "tiny random" if args.tiny else Path(target).name,
                 "draft": "tiny random" if args.tiny else Path(draft).name, "dtype": args.dtype,
                 "cpu_linear": args.cpu_linear, "num_prompts": len(texts),
                 "output_len": args.output_len, "temperature": args.temperature,
                 "num_steps": args.num_steps, "concurrency": args.concurrency,
                 "extra_server_args": args.extra_server_args},
        "wall_s": round(wall, 1), "rounds": rounds,
        "tokens": sum(r["completion_tokens"] for r in requests) + WARMUP_TOKENS,
        "requests": requests,
        "phases": {row: {"seconds": s, "calls": c} for row, (s, c) in phases.items()},
        "hottest": hottest(stats, rounds),
    }
    table = markdown(result)
    name = args.name or f"profile_server_{args.config}_{args.prompt_set}"
    write_results(args.out_dir / name, result, table, run)
    print(table)
    return result


def phase_seconds_calls(stats: dict, suffix: str, name: str) -> int:
    """Calls of ``name`` in a file ending with ``suffix``."""
    return sum(ncalls for (path, _, func), (_, ncalls, _, _, _) in stats.items()
               if suffix in path and func == name)


def hottest(stats: dict, rounds: int, top: int = 25) -> list[dict]:
    """The ``top`` functions by own (not cumulative) time: where a round's milliseconds go when no
    phase above explains them."""
    rows = sorted(stats.items(), key=lambda item: item[1][2], reverse=True)[:top]
    return [{"function": f"{Path(path).name}:{line}({func})", "calls": ncalls,
             "ms_per_round": round(1e3 * tottime / max(rounds, 1), 2)}
            for (path, line, func), (_, ncalls, tottime, _, _) in rows]


if __name__ == "__main__":
    main()

