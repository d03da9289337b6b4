"""Planner predictions vs the runtime, on one model in one run.

Measures acceptance (logit-lens exits by default) and costs, runs the planner, then generates with
at least ten hierarchies (2- and 3-level, the planner's pick and runner-up included) through
``SpeculativeGenerator`` on the same prompts, greedy, batch 1, and compares predicted with
measured seconds per token (prefill subtracted: it is measured separately per prompt).

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/bench_planner.py [--num-prompts 3]

Writes ``benchmarks/results/planner.json`` and ``planner.md``. "Design formula" is the latency
formula of ``docs/hierarchy.md`` ("Latency model"), the planner's objective; "exact" is the model
with buffer overshoot that the runtime follows.
"""

from __future__ import annotations

import statistics
import time

import torch

from benchmarks.common import (RESULTS_DIR, add_standard_arguments, benchmark_parser, encoded_prompts, load_average,
                               start_run, write_results)
from sglang_hsd.hierarchy.latency import hierarchy_latency
from sglang_hsd.hierarchy.measure import measure_acceptance, measure_costs
from sglang_hsd.runtime.timing import median_seconds
from sglang_hsd.runtime.plan_file import PlannedHierarchy
from sglang_hsd.hierarchy.planner import consecutive_alphas, plan_hierarchy
from sglang_hsd.runtime.config import parse_levels
from sglang_hsd.runtime.engine import SpeculativeGenerator
from sglang_hsd.runtime.loading import load_model
from sglang_hsd.sampling import SamplingParams

# (exit layers, buffers): 2- and 3-level hierarchies spread over depth and buffer sizes.
FIXED = [
    ([28], [1]), ([28], [2]), ([26], [2]), ([24], [1]), ([20], [3]), ([14], [2]),
    ([14, 28], [1, 1]), ([20, 28], [2, 2]), ([24, 28], [1, 2]), ([8, 24], [2, 2]), ([4, 16], [3, 2]),
]


def _prefill_seconds(model, prompt: list[int]) -> float:
    def run():
        model.forward_layers(model.embed(torch.tensor([prompt])), 0, model.num_layers, model.new_cache(1, len(prompt)))

    return median_seconds(run, repeats=3, warmup=1)


def parse_args(argv: list[str] | None = None):
    parser = benchmark_parser(__doc__, full_doc=False)
    add_standard_arguments(parser, model="smollm2-135m")
    parser.add_argument("--num-prompts", type=int, default=3, help="prompts generated per hierarchy")
    parser.add_argument("--accept-prompts", type=int, default=8, help="prompts for acceptance estimation")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    run = start_run(__file__, argv)
    torch.set_num_threads(1)
    torch.inference_mode().__enter__()

    loaded = load_model(args.model)
    model = loaded.model
    prompts = encoded_prompts(loaded.tokenizer, "mtbench", max(args.accept_prompts, args.num_prompts))
    params = SamplingParams(0.0)
    exits = list(range(2, model.num_layers, 2))
    start = time.perf_counter()
    alpha = measure_acceptance(model, prompts[: args.accept_prompts], exits, params, args.max_new_tokens)
    accept_s = time.perf_counter() - start
    context = int(statistics.mean(len(p) for p in prompts[: args.num_prompts])) + args.max_new_tokens // 2
    start = time.perf_counter()
    costs, prefix = measure_costs(model, exits, context_len=context, params=params, repeats=7)
    cost_s = time.perf_counter() - start
    start = time.perf_counter()
    plan = plan_hierarchy(alpha, costs, t_max=16)
    plan_s = time.perf_counter() - start

    configs = [([exits[i] for i in p.levels[:-1]], list(p.buffers)) for p in (plan.best, plan.best_single_draft)]
    configs += [c for c in FIXED if c not in configs]
    rows = measure_hierarchies(model, prompts[: args.num_prompts], exits, configs, alpha, costs, params,
                               args.max_new_tokens)
    mdape = statistics.median(r["ape"] for r in rows)
    mdape_design = statistics.median(r["ape_design"] for r in rows)
    best, single = (PlannedHierarchy.from_plan(p, exits) for p in (plan.best, plan.best_single_draft))
    best_levels, best_buffers = best.level_names, best.buffer_text
    single_levels, single_buffers = single.level_names, single.buffer_text
    run.finish()
    report = dict(
        model=args.model, temperature=0.0, exits="logit lens (final norm + LM head)", candidates=exits,
        prompts_generated=args.num_prompts, prompts_for_acceptance=args.accept_prompts,
        max_new_tokens=args.max_new_tokens, load_average_start=run.load_average_start,
        load_average_end=run.load_average_end,
        seconds=dict(acceptance=accept_s, costs=cost_s, planner=plan_s),
        alpha_to_target={str(e): float(alpha[i, -1]) for i, e in enumerate(exits)},
        alpha_to_next_candidate={str(e): float(alpha[i, i + 1]) for i, e in enumerate(exits)},
        alpha=alpha.tolist(), prefix_seconds={str(k): v for k, v in prefix.items()}, costs=costs.as_dict(),
        plan=dict(levels=best_levels, buffers=best_buffers, predicted_speedup=plan.best.speedup,
                  exact_model_speedup=plan.best.exact_speedup),
        runner_up=dict(levels=single_levels, buffers=single_buffers, predicted_speedup=plan.best_single_draft.speedup),
        hierarchies=rows, median_ape=mdape, median_ape_design_formula=mdape_design,
    )
    write_results(RESULTS_DIR / "planner", report, _markdown(report, prefix, model.num_layers), run)
    print(f"median absolute percentage error: {mdape:.1%} (exact model), {mdape_design:.1%} (design formula)")


def measure_hierarchies(model, prompts, exits, configs, alpha, costs, params, max_new_tokens) -> list[dict]:
    """Autoregressive decoding, then every (exit layers, buffers) of ``configs``: measured seconds
    per token (prefill subtracted) against the exact model and the design formula."""
    index = {layer: i for i, layer in enumerate(exits)}
    prefill = [_prefill_seconds(model, p) for p in prompts]
    rows = []
    for layers, buffers in [([], [])] + configs:
        ids = [index[layer] for layer in layers] + [len(exits)]
        spec = ",".join([f"exit:{layer}" for layer in layers] + ["target"])
        gen = SpeculativeGenerator(model, parse_levels(spec, buffers or None))
        seconds, tokens = 0.0, 0
        for prompt, pre in zip(prompts, prefill):
            result = gen.generate([prompt], params, max_new_tokens, seed=0)
            seconds += result.seconds - pre
            tokens += len(result.tokens[0])
        measured = seconds / tokens
        if layers:
            alphas = consecutive_alphas(alpha, ids)
            exact = hierarchy_latency(ids, buffers, alphas, costs, exact=True).latency
            design = hierarchy_latency(ids, buffers, alphas, costs, exact=False).latency
        else:
            exact = design = costs.autoregressive_step()
        rows.append(dict(levels=spec, buffers=",".join(map(str, buffers)), measured=measured,
                         predicted=exact, predicted_design=design,
                         ape=abs(exact - measured) / measured, ape_design=abs(design - measured) / measured))
        print(f"{spec:28s} {rows[-1]['buffers']:6s} measured {measured * 1e3:7.1f} ms/tok  "
              f"predicted {exact * 1e3:7.1f} (design {design * 1e3:7.1f})  load {load_average()}", flush=True)
    for row in rows:
        row["measured_speedup"] = rows[0]["measured"] / row["measured"]
        row["predicted_speedup"] = costs.autoregressive_step() / row["predicted"]
    return rows


def _markdown(r: dict, prefix: dict, num_layers: int) -> str:
    lines = [
        f"# Planner: predicted vs measured ({r['model']}, greedy, {r['exits']})", "",
        f"Load average (1/5/15 min) at start: {r['load_average_start']}, at end: {r['load_average_end']} "
        "(2 shared cores).", "",
        f"Planner choice: `--levels {r['plan']['levels']} --buffers {r['plan']['buffers']}`, predicted "
        f"{r['plan']['predicted_speedup']:.2f}x; runner-up single draft `--levels {r['runner_up']['levels']} "
        f"--buffers {r['runner_up']['buffers']}` {r['runner_up']['predicted_speedup']:.2f}x. "
        f"Acceptance pass {r['seconds']['acceptance']:.0f}s, costs {r['seconds']['costs']:.0f}s, "
        f"planner {r['seconds']['planner']:.1f}s.", "",
        "| exit L | alpha(L, target) | alpha(L, L+2) | [0,L) 1 token ms | rel. to target |",
        "|---|---|---|---|---|",
    ]
    full = prefix[num_layers]
    for layer in r["candidates"]:
        lines.append(f"| {layer} | {r['alpha_to_target'][str(layer)]:.3f} | {r['alpha_to_next_candidate'][str(layer)]:.3f} "
                     f"| {prefix[layer] * 1e3:.2f} | {prefix[layer] / full:.3f} |")
    lines += [f"| {num_layers} (target) | 1 | - | {full * 1e3:.2f} | 1.000 |", "",
              "| levels | buffers | measured ms/tok | predicted (exact) | predicted (design formula) | APE | measured speed-up | predicted speed-up |",
              "|---|---|---|---|---|---|---|---|"]
    for row in r["hierarchies"]:
        lines.append(f"| {row['levels']} | {row['buffers']} | {row['measured'] * 1e3:.1f} | {row['predicted'] * 1e3:.1f} "
                     f"| {row['predicted_design'] * 1e3:.1f} | {row['ape']:.1%} | {row['measured_speedup']:.2f} "
                     f"| {row['predicted_speedup']:.2f} |")
    lines += ["", f"Median absolute percentage error: {r['median_ape']:.1%} (exact model), "
              f"{r['median_ape_design_formula']:.1%} (design formula).", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
