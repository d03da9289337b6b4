"""``sglang-hsd plan``: measure acceptance and costs on a model, pick the latency-optimal hierarchy."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sglang_hsd.hierarchy.planner import Plan


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


def plan_levels(plan: Plan, exits: list[int]) -> tuple[str, str]:
    """``(--levels, --buffers)`` strings for ``sglang-hsd generate``."""
    names = [f"exit:{exits[i]}" if i < len(exits) else "target" for i in plan.levels]
    return ",".join(names), ",".join(str(t) for t in plan.buffers)


def load_plan(path: str | Path) -> tuple[str, list[int]]:
    """Read a ``sglang-hsd plan`` JSON: ``(levels, buffers)`` ready for ``parse_levels``."""
    data = json.loads(Path(path).read_text())
    return data["levels"], [int(t) for t in data["buffers"].split(",") if t]


def _plan_dict(plan: Plan, exits: list[int]) -> dict:
    levels, buffers = plan_levels(plan, exits)
    return {
        "levels": levels, "buffers": buffers, "predicted_speedup": plan.speedup,
        "predicted_seconds_per_token": plan.latency, "exact_model_speedup": plan.exact_speedup,
        "exact_model_seconds_per_token": plan.exact_latency,
    }


def run_plan(args: argparse.Namespace) -> int:
    import torch

    from sglang_hsd.hierarchy.measure import measure_acceptance, measure_costs
    from sglang_hsd.hierarchy.planner import plan_hierarchy
    from sglang_hsd.runtime.cli import load_exit_heads_option, encode_prompts, load_model
    from sglang_hsd.sampling import SamplingParams

    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_model(args.model)
    model = loaded.model
    num_layers = model.num_layers
    exits = [int(x) for x in args.candidates.split(",")] if args.candidates else list(range(2, num_layers, 2))
    texts = _prompt_texts(args.prompts, args.num_prompts)
    prompts = encode_prompts(loaded.tokenizer, texts)
    params = SamplingParams(args.temperature, args.top_k, args.top_p)
    heads = load_exit_heads_option(loaded, args.exit_heads)
    alpha = measure_acceptance(model, prompts, exits, params, args.continuation, heads)
    context = int(sum(len(p) for p in prompts) / len(prompts)) + args.continuation // 2
    head = heads.get(exits[0]) if heads else None
    costs, prefix = measure_costs(model, exits, context_len=context, params=params, exit_head=head)
    result = plan_hierarchy(alpha, costs, t_max=args.max_buffer, max_levels=args.max_levels)

    ar = costs.autoregressive_step()
    print(f"model {args.model}: {num_layers} layers, {len(prompts)} prompts, T={args.temperature}")
    print(f"{'exit':>5} {'alpha->target':>13} {'alpha->next':>11} {'[0,L) ms':>9} {'rel':>6}")
    for i, layer in enumerate(exits):
        nxt = alpha[i, i + 1] if i + 1 < len(exits) else float("nan")
        print(f"{layer:>5} {alpha[i, -1]:>13.3f} {nxt:>11.3f} {prefix[layer] * 1e3:>9.3f} "
              f"{prefix[layer] / prefix[num_layers]:>6.3f}")
    print(f"target [0,{num_layers}) {prefix[num_layers] * 1e3:.3f} ms; head+probs on 1 position "
          f"{costs.head(1) * 1e3:.3f} ms; autoregressive step {ar * 1e3:.3f} ms")
    best, single = _plan_dict(result.best, exits), _plan_dict(result.best_single_draft, exits)
    print(f"\nbest:      --levels {best['levels']} --buffers {best['buffers']}  "
          f"predicted {best['predicted_speedup']:.2f}x (exact model {best['exact_model_speedup']:.2f}x)")
    print(f"runner-up: --levels {single['levels']} --buffers {single['buffers']}  "
          f"predicted {single['predicted_speedup']:.2f}x (single draft)")
    report = {
        **best, "runner_up_single_draft": single, "model": args.model, "temperature": args.temperature,
        "top_k": args.top_k, "top_p": args.top_p, "candidates": exits, "alpha": alpha.tolist(),
        "costs": costs.as_dict(), "prefix_seconds": {str(k): v for k, v in prefix.items()},
        "autoregressive_seconds_per_token": ar,
    }
    if result.best.speedup < 1.0:
        # No hierarchy beats plain decoding on these numbers: the config says so.
        report.update(levels="target", buffers="", predicted_speedup=1.0, predicted_seconds_per_token=ar)
        print("no hierarchy is predicted to beat autoregressive decoding: wrote --levels target")
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")
    return 0


def _prompt_texts(prompt_set: str, limit: int) -> list[str]:
    from sglang_hsd.assets.prompts import load_prompts

    return [p.messages[0]["content"] for p in load_prompts(prompt_set, limit=limit)]
