"""Where a loaded server's time goes: its decode rounds, draft catch-ups and scheduler, under load.

Starts one server of ``bench_serving_standalone.py``'s configurations (its flags; more server
arguments with ``--extra-server-args``, e.g. ``--hsd-draft-lengths-cycle 2`` to force every round's
draft length), runs SGLang's serving client once to warm it (``--warm-prompts``), then once more
at ``--concurrency`` while py-spy (when installed: ``pip install py-spy``) samples the scheduler
process for ``--sample-seconds``. It reports:

* the client's output tok/s, median TPOT and accept length;
* from ``/server_info`` (HSD servers): every decode round's count and total milliseconds per batch
  bucket and draft length beside the median the adaptive controller decides on, the accepted
  drafts per length, the draft catch-up's milliseconds and the draft weight copy's rows;
* from py-spy: the share of the scheduler's main thread in each phase (verify, draft steps, draft
  extend, catch-up, prefill, result processing), a sampling profiler in its own process, so the
  server runs at its own speed (cProfile, ``profile_server.py``, slows the Python-heavy parts);
* with ``--torch-profile-steps N`` instead of py-spy: torch.profiler over N scheduler steps
  (SGLang's ``/start_profile``), and per step kind (``step[DRAFT bs=1]``, ``step[VERIFY bs=1]``,
  ``draft_extend`` ...) its median wall time, what its median one spent in torch ops (the
  largest by name) and between them (``torch_trace.step_summary``).

    PYTHONPATH=. python benchmarks/loaded_rounds.py --config hsd-adaptive-k8 --concurrency 4 \\
        --dtype float32 --cpu-linear onednn-packed \\
        --extra-server-args='--hsd-draft-precision int4 --hsd-draft-lengths-cycle 2'

Results: ``results/<name>.{json,md}`` with the commit, the command and the machine load. The
counters cover the warm-up too. Run it on an idle machine, one at a time.
"""

from __future__ import annotations

import collections
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.bench_serving_standalone import CONFIGS, ServerOptions, add_server_arguments, server_command
from benchmarks.common import benchmark_parser, start_run, write_results
from benchmarks.serving_harness import (ClientSpec, ServerSpec, cpu_server, read_server_info, resolve_models,
                                        run_client, start_torch_profile, write_prompt_file)
from benchmarks.torch_trace import read_trace, step_summary
from sglang_hsd.sglang_plugin.cpu.cpu_server import server_env

# Scheduler phases: a sample counts for a phase when this function is on its main-thread stack.
PHASES = {
    "decode round (HSD)": "HSDVerify.forward_batch_generation",
    "verify": "run_eagle_verify",
    "draft steps": "EagleDraftWorker.draft",
    "draft extend": "EagleDraftWorker._draft_extend_for_decode",
    "draft tail extend": "DraftCatchUp.extend_tail",
    "draft catch-up": "DraftCatchUp.run",
    "prefill (speculative server)": "EAGLEWorkerV2._forward_prefill_batch",
    "model forward (plain server)": "TpModelWorker.forward_batch_generation",
    "result processing": "Scheduler.process_batch_result",
}
MAIN_LOOP = "Scheduler.run_event_loop"


def phase_shares(raw: str, top: int = 8) -> dict:
    """py-spy's ``raw`` output (``frame;frame;... count`` per line) -> main-thread samples, each
    phase's share of them and, per phase, the ``top`` innermost calls of its samples (``caller >
    function``, where the time itself goes) by their share of the phase."""
    total, counts = 0, collections.Counter()
    inside = {phase: collections.Counter() for phase in PHASES}
    for line in raw.splitlines():
        stack, _, n = line.rpartition(" ")
        if MAIN_LOOP not in stack or not n.isdigit():
            continue
        total += int(n)
        frames = [frame.split(" (")[0] for frame in stack.split(";")]
        for phase, function in PHASES.items():
            if function in frames:
                counts[phase] += int(n)
                leaf = " > ".join(frames[-2:]) if len(frames) > frames.index(function) + 1 else function
                inside[phase][leaf] += int(n)
    return {"samples": total,
            "shares": {p: round(counts[p] / total, 4) for p in PHASES if total},
            "inside": {p: {f: round(c / counts[p], 3) for f, c in inside[p].most_common(top)}
                       for p in PHASES if counts[p]}}


def scheduler_pid() -> int | None:
    """The scheduler process of the running server (SGLang names it ``sglang::scheduler``; one
    server runs at a time)."""
    out = subprocess.run(["pgrep", "-f", "sglang::scheduler"], capture_output=True, text=True).stdout.split()
    return int(out[0]) if out else None


def sample(pid: int, seconds: float, out: Path) -> str | None:
    """py-spy's raw samples of ``pid`` for ``seconds`` at 40 Hz; None without py-spy."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        return None
    subprocess.run([spy, "record", "-p", str(pid), "-r", "40", "-d", str(int(seconds)), "-f", "raw",
                    "-o", str(out)], capture_output=True, check=False)
    return out.read_text() if out.is_file() else None


def round_table(adaptive: dict) -> list[dict]:
    """Per (bucket, length): rounds, mean ms over all of them and the median the controller uses."""
    medians = adaptive.get("round_ms_by_batch_bucket", {})
    rows = []
    for bucket, lengths in adaptive.get("rounds_and_total_ms_by_batch_bucket", {}).items():
        for length, (n, total_ms) in lengths.items():
            rows.append({"bucket": int(bucket), "length": int(length), "rounds": n,
                         "mean_ms": round(total_ms / n, 1) if n else None,
                         "median_ms": medians.get(bucket, {}).get(length)})
    return sorted(rows, key=lambda r: (r["bucket"], r["length"]))


def markdown(payload: dict) -> str:
    m, hsd = payload["client"], payload["server_info"]
    lines = [f"# Loaded rounds: `{payload['config']}` at concurrency {payload['concurrency']}", "",
             f"Server: `{payload['server_command']}`", "",
             f"Client ({payload['prompt_set']}, {payload['num_prompts']} prompts x {payload['output_len']} "
             f"tokens, T = {payload['temperature']}): {m.get('output_throughput', 0):.2f} tok/s, median TPOT "
             f"{m.get('median_tpot_ms', 0):.0f} ms, accept length {m.get('accept_length')}", ""]
    rounds = round_table(hsd.get("adaptive") or {})
    if rounds:
        lines += ["| batch bucket | draft length | rounds | mean ms | median ms (controller) |",
                  "|---|---|---|---|---|"]
        lines += [f"| {r['bucket']} | {r['length']} | {r['rounds']} | {r['mean_ms']} | {r['median_ms']} |"
                  for r in rounds]
        lines += ["", f"Accepted drafts per length (count of 0, 1, ...): "
                  f"{(hsd.get('adaptive') or {}).get('accepted_drafts_by_length')}"]
    if hsd.get("draft_catch_up"):
        lines += ["", f"Draft catch-up: {json.dumps(hsd['draft_catch_up'])}"]
    if hsd.get("draft_copies"):
        lines += ["", f"Draft copies: {json.dumps(hsd['draft_copies'])}"]
    profile = payload.get("torch_profile")
    if profile:
        lines += ["", "torch.profiler, per step kind (the median step's torch ops and the time between "
                  "them; small-op totals include the profiler's own cost):", "",
                  "| step | count | median ms | in ops ms | between ops ms | largest ops (calls, ms) |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {name} | {s['count']} | {s['median_ms']} | {s['ops_ms']} | {s['gaps_ms']} | "
                  + ", ".join(f"{op} {c}x {ms}" for op, (c, ms) in s["top_ops"].items()) + " |"
                  for name, s in profile.items()]
    spy = payload.get("py_spy")
    if spy:
        lines += ["", f"Scheduler main thread, {spy['samples']} py-spy samples (phases nest: verify and "
                  "the draft work lie inside the decode round):", "", "| phase | share |", "|---|---|"]
        lines += [f"| {p} | {s:.1%} |" for p, s in spy["shares"].items()]
        for phase, below in spy.get("inside", {}).items():
            lines += ["", f"Inside {phase}: " + ", ".join(f"{f} {s:.0%}" for f, s in below.items())]
    return "\n".join(lines)


def parse_args(argv=None):
    parser = benchmark_parser(__doc__)
    add_server_arguments(parser, dtype="float32", cpu_linear="onednn-packed")
    parser.add_argument("--config", default="hsd-adaptive-k8", choices=sorted(CONFIGS))
    parser.add_argument("--extra-server-args", default="", help="more server arguments (one string)")
    parser.add_argument("--prompt-set", default="sharegpt")
    parser.add_argument("--num-prompts", type=int, default=48)
    parser.add_argument("--warm-prompts", type=int, default=8)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--sample-seconds", type=float, default=45.0)
    parser.add_argument("--torch-profile-steps", type=int, default=0,
                        help="N > 0: torch.profiler over N scheduler steps instead of py-spy")
    parser.add_argument("--name", default=None, help="results file stem (default loaded_rounds_<config>_c<N>)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    run = start_run(__file__, argv)
    with tempfile.TemporaryDirectory(prefix="hsd_loaded_rounds_") as tmp:
        work = Path(tmp)
        target, draft = resolve_models(args.target, args.draft, work, args.tiny)
        prompts = work / "prompts.json"
        write_prompt_file(prompts, args.prompt_set, args.num_prompts, args.tiny)
        options = ServerOptions.from_args(args, args.concurrency)
        cmd = server_command(CONFIGS[args.config], target, draft, options, shlex.split(args.extra_server_args))
        trace_dir = work / "trace"
        env = ({**server_env(), "SGLANG_TORCH_PROFILER_DIR": str(trace_dir), "SGLANG_PROFILE_WITH_STACK": "false",
                "SGLANG_PROFILE_RECORD_SHAPES": "false"} if args.torch_profile_steps > 0 else None)
        with cpu_server(ServerSpec(args.config, cmd, {}, env=env), work) as server:
            run_client(server.url, ClientSpec(target, prompts, args.warm_prompts, args.output_len,
                                              args.temperature, args.concurrency), work, "warm", 3600)
            spec = ClientSpec(target, prompts, args.num_prompts, args.output_len, args.temperature,
                              args.concurrency)
            result: dict = {}
            client = threading.Thread(target=lambda: result.update(
                r=run_client(server.url, spec, work, "main", 7200)))
            client.start()
            time.sleep(min(15.0, args.sample_seconds))  # past the first prefills
            raw, profile = None, None
            if args.torch_profile_steps > 0:
                start_torch_profile(server.url, args.torch_profile_steps)
            else:
                pid = scheduler_pid()
                raw = sample(pid, args.sample_seconds, work / "spy.txt") if pid else None
            client.join()
            info = read_server_info(server.url)
            traces = sorted(trace_dir.glob("*.trace.json*")) if args.torch_profile_steps > 0 else []
            if traces:
                events = read_trace(traces[-1])
                kinds = sorted({e["name"] for e in events if e.get("cat") == "user_annotation"
                                and (e["name"].startswith("step[") or e["name"] in ("draft", "draft_extend"))})
                profile = {kind: step_summary(events, kind) for kind in kinds}
        payload = {"config": args.config, "concurrency": args.concurrency, "prompt_set": args.prompt_set,
                   "num_prompts": args.num_prompts, "output_len": args.output_len,
                   "temperature": args.temperature, "server_command": " ".join(cmd[1:]),
                   "client": {k: result["r"].metrics.get(k) for k in
                              ("output_throughput", "median_tpot_ms", "mean_tpot_ms", "accept_length",
                               "duration", "completed")},
                   "server_info": {k: info.hsd.get(k) for k in ("adaptive", "draft_catch_up", "draft_copies")},
                   "rounds": round_table(info.hsd.get("adaptive") or {}),
                   "py_spy": phase_shares(raw) if raw else None, "torch_profile": profile}
    name = args.name or f"loaded_rounds_{args.config}_c{args.concurrency}"
    _, md = write_results(args.out_dir / name, payload, markdown(payload), run)
    print(md.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
