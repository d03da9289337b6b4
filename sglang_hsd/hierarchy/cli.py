"""``sglang-hsd plan``: measure acceptance and costs on a model, pick the latency-optimal hierarchy."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_plan_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="choose early-exit levels and buffers for a model from measured acceptance and costs",
        description=(
            "Runs the target once over prompts (teacher forcing on prompt + a short greedy "
            "continuation) to estimate alpha = 1 - TV between every pair of candidate exits, times "
            "each level's forward on this machine, and solves for the hierarchy (levels and "
            "buffers) with the least expected latency per token. Writes a JSON config whose "
            "'levels' and 'buffers' strings go straight to `sglang-hsd generate`."
        ),
    )
    parser.add_argument("--model", default="smollm2-135m", help="model name or folder (default smollm2-135m)")
    parser.add_argument("--prompts", default="mtbench", help="prompt set (default mtbench)")
    parser.add_argument("--num-prompts", type=int, default=8, help="prompts used for acceptance (default 8)")
    parser.add_argument("--continuation", type=int, default=32, help="greedy tokens per prompt (default 32)")
    parser.add_argument("--candidates", help="comma list of exit layers (default: every second layer)")
    parser.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0 = greedy)")
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--exit-heads", default="none", help="folder of trained exit heads, 'auto' or 'none' (logit lens)")
    parser.add_argument("--max-buffer", type=int, default=16, help="largest buffer T considered (default 16)")
    parser.add_argument("--max-levels", type=int, help="cap on levels including the target (default: none)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--out", type=Path, default=Path("plan.json"), help="JSON config to write (default plan.json)")
    parser.set_defaults(func=run_plan)


def run_plan(args: argparse.Namespace) -> int:
    import torch

    from sglang_hsd.assets.chat import encode_prompts
    from sglang_hsd.hierarchy.measure import measure_acceptance, measure_costs
    from sglang_hsd.hierarchy.plan_file import PlanFile, PlanMeasurement, PlannedHierarchy
    from sglang_hsd.hierarchy.planner import plan_hierarchy
    from sglang_hsd.runtime.loading import load_exit_heads_option, load_model, prompt_set_texts
    from sglang_hsd.sampling import SamplingParams

    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_model(args.model)
    model = loaded.model
    num_layers = model.num_layers
    exits = [int(x) for x in args.candidates.split(",")] if args.candidates else list(range(2, num_layers, 2))
    texts = prompt_set_texts(args.prompts, args.num_prompts)
    prompts = encode_prompts(loaded.tokenizer, texts)
    params = SamplingParams(args.temperature, args.top_k, args.top_p)
    heads = load_exit_heads_option(loaded, args.exit_heads)
    alpha = measure_acceptance(model, prompts, exits, params, args.continuation, heads)
    context = int(sum(len(p) for p in prompts) / len(prompts)) + args.continuation // 2
    head = heads.get(exits[0]) if heads else None
    costs, prefix = measure_costs(model, exits, context_len=context, params=params, exit_head=head)
    result = plan_hierarchy(alpha, costs, t_max=args.max_buffer, max_levels=args.max_levels)

    print(f"model {args.model}: {num_layers} layers, {len(prompts)} prompts, T={args.temperature}")
    _print_measurements(exits, alpha, costs, prefix, num_layers)
    best, single = (PlannedHierarchy.from_plan(p, exits) for p in (result.best, result.best_single_draft))
    print(f"\nbest:      --levels {best.level_names} --buffers {best.buffer_text}  "
          f"predicted {best.predicted_speedup:.2f}x (exact model {best.exact_model_speedup:.2f}x)")
    print(f"runner-up: --levels {single.level_names} --buffers {single.buffer_text}  "
          f"predicted {single.predicted_speedup:.2f}x (single draft)")
    measurement = PlanMeasurement(
        model=args.model, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, candidates=exits,
        alpha=alpha.tolist(), costs=costs.as_dict(), prefix_seconds={str(k): v for k, v in prefix.items()},
        autoregressive_seconds_per_token=costs.autoregressive_step(),
    )
    plan = PlanFile.from_planner(result, exits, measurement)
    if plan.best.autoregressive:
        print("no hierarchy is predicted to beat autoregressive decoding: wrote --levels target")
    plan.write(args.out)
    print(f"wrote {args.out}")
    return 0


def _print_measurements(exits: list[int], alpha, costs, prefix: dict[int, float], num_layers: int) -> None:
    """Acceptance and prefix cost per candidate exit, then the target's and one step's cost."""
    print(f"{'exit':>5} {'alpha->target':>13} {'alpha->next':>11} {'[0,L) ms':>9} {'rel':>6}")
    for i, layer in enumerate(exits):
        nxt = alpha[i, i + 1] if i + 1 < len(exits) else float("nan")
        print(f"{layer:>5} {alpha[i, -1]:>13.3f} {nxt:>11.3f} {prefix[layer] * 1e3:>9.3f} "
              f"{prefix[layer] / prefix[num_layers]:>6.3f}")
    print(f"target [0,{num_layers}) {prefix[num_layers] * 1e3:.3f} ms; head+probs on 1 position "
          f"{costs.head(1) * 1e3:.3f} ms; autoregressive step {costs.autoregressive_step() * 1e3:.3f} ms")
