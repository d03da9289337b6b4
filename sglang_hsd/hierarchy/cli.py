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
    knobs = parser.add_argument_group(
        "round planning (with --drafter)",
        "Plan one drafter's rounds instead of exit levels: the draft shape (fixed length, adaptive rule or "
        "sampled tree), threads and kernel path, from acceptance replayed over the target's own "
        "continuations and call costs measured under each setting (sglang_hsd/hierarchy/round_planner.py).")
    knobs.add_argument("--drafter", help="the drafter: model:<name or folder> or exit:<layer>")
    knobs.add_argument("--new-tokens", type=int, default=64, help="tokens per generation the plan is for (default 64)")
    knobs.add_argument("--thread-options", default="auto",
                       help="comma list of thread counts to measure, or 'auto': 1 and every core (default)")
    knobs.add_argument("--kernel-paths", default="mkl,onednn-packed", help="comma list (default mkl,onednn-packed)")
    knobs.add_argument("--drafter-precisions", default="auto",
                       help="comma list of a separate drafter's single-row weight copies to measure (fp32, bf16, "
                       "fp16, int8, int4, w8a8), or 'auto': all with a model: drafter, fp32 with an exit drafter (default)")
    knobs.add_argument("--fixed", default="1-16", help="fixed draft lengths: 'a-b' or a comma list (default 1-16)")
    knobs.add_argument("--adaptive", help="comma list of adaptive:threshold:max rules ('' for none; default: "
                       "thresholds 0.2, 0.4, 0.6 x maxima 8, 16, 24, 32)")
    knobs.add_argument("--trees", help="comma list of D:k:N trees ('' for none; default: "
                       "round_planner.DEFAULT_TREES, 2:2:4 to 6:3:16)")
    knobs.add_argument("--lookups", help="comma list of prompt lookups at the bottom ('' for none): n:K (copies of up "
                       "to K tokens after the longest n-gram match, verified by the target) or n:N_d:N_1 (verified "
                       "by the drafter model first, which fills a buffer of N_1 for the target; model: drafters "
                       "only). Default: round_planner.DEFAULT_LOOKUPS (3:4 to 3:16:16; n:K only for an exit drafter)")
    knobs.add_argument("--middles", help="comma list of the target's exits between a model: drafter and the target, "
                       "L:N_d:N_1 (the drafter drafts N_d per sub-round, the exit at layer L, with its --exit-heads "
                       "head or the logit lens, fills a buffer of N_1 for the target; default: none)")
    parser.set_defaults(func=run_plan)


def _int_list(text: str, name: str) -> list[int]:
    try:
        if "-" in text:
            lo, hi = (int(x) for x in text.split("-"))
            return list(range(lo, hi + 1))
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{name} must be 'a-b' or a comma list of integers, got {text!r}") from None


def _round_plan_inputs(args: argparse.Namespace):
    """(drafter level, settings, shapes, sampling parameters) from the options, checked before any
    model loads."""
    import os

    from sglang_hsd.hierarchy.round_costs import KernelSetting
    from sglang_hsd.hierarchy.round_planner import (DEFAULT_ADAPTIVE, DEFAULT_TREES, candidate_shapes, lookup_candidates,
                                                     middle_candidates)
    from sglang_hsd.levels import LevelKind, parse_level_specs
    from sglang_hsd.tree_draft import TreeShape
    from sglang_hsd.runtime.kernel_setup import AUTO_PRECISION, DRAFTER_PRECISIONS, parse_drafter_precision
    from sglang_hsd.sampling import SamplingParams

    try:
        drafter_level = parse_level_specs(f"{args.drafter},target")[0]
    except ValueError as err:
        raise ValueError(f"--drafter must be model:<name> or exit:<layer>, got {args.drafter!r} ({err})") from None
    if drafter_level.kind not in (LevelKind.MODEL, LevelKind.EXIT):
        raise ValueError(f"--drafter must be model:<name> or exit:<layer>, got {args.drafter!r}")
    if args.new_tokens < 1:
        raise ValueError(f"--new-tokens must be >= 1, got {args.new_tokens}")
    threads = ([1, os.cpu_count() or 1] if args.thread_options == "auto"
               else _int_list(args.thread_options, "--thread-options"))
    separate = drafter_level.kind is LevelKind.MODEL
    # "auto" prices every copy a separate drafter can read; an exit drafter is the target itself.
    precisions = (tuple(DRAFTER_PRECISIONS) if separate else ("fp32",)) if args.drafter_precisions == AUTO_PRECISION \
        else tuple(p.strip() for p in args.drafter_precisions.split(",") if p.strip())
    for precision in precisions:
        parse_drafter_precision(precision, name="--drafter-precisions")
    if not separate and precisions != ("fp32",):
        raise ValueError(f"--drafter-precisions: an exit drafter runs the target's own weights (fp32 only), "
                         f"got {args.drafter_precisions!r}")
    settings = [KernelSetting(t, path, precision) for t in sorted(set(threads))
                for path in args.kernel_paths.split(",") for precision in precisions]
    trees = DEFAULT_TREES
    if args.trees is not None:
        parsed = [TreeShape.parse(t, "--trees") for t in args.trees.split(",") if t.strip()]
        trees = [(t.depth, t.topk, t.num_draft_tokens) for t in parsed if t is not None]
    adaptive = [a for a in args.adaptive.split(",") if a.strip()] if args.adaptive is not None else DEFAULT_ADAPTIVE
    shapes = candidate_shapes(_int_list(args.fixed, "--fixed"), adaptive, trees,
                              lookup_candidates(args.lookups, separate), middle_candidates(args.middles, separate))
    return drafter_level, settings, shapes, SamplingParams(args.temperature, args.top_k, args.top_p)


def run_round_plan(args: argparse.Namespace) -> int:
    """``sglang-hsd plan --drafter ...``: the round planner (module ``round_planner``)."""
    import json

    from sglang_hsd.assets.chat import encode_prompts
    from sglang_hsd.runtime.plan_file import PlanFile
    from sglang_hsd.hierarchy.round_costs import DrafterSpec
    from sglang_hsd.hierarchy.round_planner import plan_rounds
    from sglang_hsd.levels import LevelKind
    from sglang_hsd.runtime.loading import load_exit_heads_option, load_model, prompt_set_texts

    drafter_level, settings, shapes, params = _round_plan_inputs(args)
    loaded = load_model(args.model)
    heads = load_exit_heads_option(loaded, args.exit_heads) or {}
    if drafter_level.kind is LevelKind.MODEL:
        spec = DrafterSpec(model=load_model(drafter_level.model_path).model)
    else:
        spec = DrafterSpec(layer=drafter_level.layer, head=heads.get(drafter_level.layer))
    prompts = encode_prompts(loaded.tokenizer, prompt_set_texts(args.prompts, args.num_prompts))
    result = plan_rounds(loaded.model, spec, prompts, params, args.new_tokens, shapes, settings,
                         progress=lambda text: print(text, flush=True), middle_heads=heads)
    plain = result.plain
    print(f"\n{'candidate':<44} {'ms/token':>9} {'tokens/round':>12} {'vs best plain':>13}")
    shown = [p for p in result.ranked if p.shape.plain] + [p for p in result.ranked if not p.shape.plain][:12]
    for pred in sorted(shown, key=lambda p: p.seconds_per_token):
        print(f"{pred.label:<44} {pred.seconds_per_token * 1e3:>9.1f} {pred.tokens_per_round:>12.2f} "
              f"{plain.seconds_per_token / pred.seconds_per_token:>12.2f}x")
    chosen = result.planned_hierarchy(drafter_level)
    data = PlanFile(chosen).to_json()
    if any(level.kind is LevelKind.LOOKUP for level in chosen.levels):
        print("note: the SGLang server does not take a lookup level; this plan is for `sglang-hsd generate --plan`")
    data["round_planner"] = {
        "model": args.model, "drafter": args.drafter, "temperature": args.temperature, "top_k": args.top_k,
        "top_p": args.top_p, "prompts": args.prompts, "num_prompts": len(prompts), "new_tokens": args.new_tokens,
        **result.as_dict(),
    }
    args.out.write_text(json.dumps(data, indent=2))
    knobs = chosen.knobs.to_json()
    print(f"\nchosen: --levels {chosen.level_names} --buffers {chosen.buffer_text or '-'} --draft-length "
          f"{knobs.get('draft_length', 'fixed')} --tree {knobs.get('tree', 'none')} --threads {knobs['threads']} "
          f"--drafter-precision {knobs.get('drafter_precision', 'fp32')} ({knobs['kernel_path']}); "
          f"predicted {chosen.predicted_speedup:.2f}x the best plain decoding")
    print(f"wrote {args.out}")
    return 0


def run_plan(args: argparse.Namespace) -> int:
    if args.drafter:
        return run_round_plan(args)
    import torch

    from sglang_hsd.assets.chat import encode_prompts
    from sglang_hsd.hierarchy.measure import measure_acceptance, measure_costs
    from sglang_hsd.runtime.plan_file import PlanFile, PlanMeasurement, PlannedHierarchy
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
