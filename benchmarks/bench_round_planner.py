"""The round planner's choice against plain decoding and the other candidates, measured in one run.

    PYTHONPATH=. python benchmarks/bench_round_planner.py --model qwen2.5-coder-1.5b \
        --drafter model:qwen2.5-coder-0.5b --exit-heads none --prompt-set humaneval \
        --plan-prompts 2 --num-prompts 4 --max-new-tokens 64 --name round_planner_qwen_pair

Plans (``sglang_hsd/hierarchy/round_planner.py``: acceptance replayed over the target's own
continuations, call costs timed under 1 thread / every core x ``mkl`` / ``onednn-packed``) on the
first ``--plan-prompts`` prompts of the set, then measures on the next ``--num-prompts`` (no
overlap), batch 1, ``--repeats`` times: plain decoding with the runtime's defaults (1 thread,
``mkl``), on every core and in the best predicted plain setting, the planner's choice, and the best
predicted candidate of every other kind (fixed length, adaptive, tree, a lookup verified by the
target, a lookup verified by the drafter model first, the target's exit between the drafter and the
target: the last two are three levels). Each runs in its own setting. ``--kinds`` and
``--plain-rows fastest`` measure fewer rows (a long run's budget).
The table gives predicted and measured ms per token (both with the prefill: each row is predicted
again at the measured prompts' lengths, ``round_planner.predict``), the absolute percentage error,
measured speed-ups over the default plain row and over the fastest measured plain row, and whether
greedy outputs equal plain decoding's. Writes ``benchmarks/results/<name>.json`` and ``.md``.
"""

from __future__ import annotations

import os
import statistics

import torch

from benchmarks.bench_e2e import WARMUP_TOKENS, run_runtime
from benchmarks.common import RESULTS_DIR, add_standard_arguments, benchmark_parser, encoded_prompts, start_run, write_results
from sglang_hsd.draft_length import DraftLengthRule
from sglang_hsd.hierarchy.round_costs import DrafterSpec, KernelSetting
from sglang_hsd.hierarchy.round_planner import (
    RoundPlan, RoundPrediction, RoundShape, candidate_shapes, lookup_candidates, middle_candidates, plan_rounds,
    predict,
)
from sglang_hsd.levels import LevelKind, LevelSpec, parse_level_specs
from sglang_hsd.runtime.config import HierarchyConfig
from sglang_hsd.runtime.engine import SpeculativeGenerator
from sglang_hsd.runtime.kernel_paths import PATH_MKL, PATH_PACKED
from sglang_hsd.runtime.loading import load_exit_heads_option, load_model
from sglang_hsd.sampling import SamplingParams

DEFAULT_SETTING = KernelSetting(1, PATH_MKL)
# Kinds of candidates whose best predicted one is measured beside the planner's choice.
KINDS = {"fixed": lambda s: s.fixed is not None, "adaptive": lambda s: s.adaptive is not None,
         "tree": lambda s: s.tree is not None,
         "lookup-target": lambda s: s.lookup is not None and not s.lookup.uses_model,
         "lookup-drafter-target": lambda s: s.lookup is not None and s.lookup.uses_model,
         "drafter-exit-target": lambda s: s.middle is not None}


def parse_args(argv: list[str] | None = None):
    parser = benchmark_parser(__doc__)
    add_standard_arguments(parser, model="qwen2.5-coder-1.5b", name="round_planner", exit_heads=True)
    parser.add_argument("--drafter", default="model:qwen2.5-coder-0.5b", help="model:<name> or exit:<layer>")
    parser.add_argument("--prompt-set", default="humaneval")
    parser.add_argument("--plan-prompts", type=int, default=2, help="prompts the planner records (default 2)")
    parser.add_argument("--num-prompts", type=int, default=4, help="prompts measured, after those (default 4)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", default="auto", help="thread counts the planner may choose: 'auto' = 1 and every core")
    parser.add_argument("--drafter-precisions", default="fp32",
                        help="comma list of a separate drafter's weight copies the planner may choose (default fp32)")
    parser.add_argument("--lookups", help="comma list of lookup candidates n:K or n:N_d:N_1 ('' for none; default: "
                        "round_planner.DEFAULT_LOOKUPS, n:K only for an exit drafter)")
    parser.add_argument("--middles", help="comma list of the target's exits between a model: drafter and the "
                        "target, L:N_d:N_1 (with --exit-heads' head at L, or the logit lens; default: none)")
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help=f"comma list of the kinds whose best predicted candidate is measured besides the "
                        f"planner's choice (default all: {','.join(KINDS)})")
    parser.add_argument("--plain-rows", choices=("all", "fastest"), default="all",
                        help="plain decoding rows: the runtime defaults, every core and the best predicted setting "
                        "(all, default), or only the best predicted setting (fastest)")
    args = parser.parse_args(argv)
    unknown = sorted(set(k.strip() for k in args.kinds.split(",") if k.strip()) - set(KINDS))
    if unknown:
        parser.error(f"--kinds: unknown {unknown}; expected a comma list of {','.join(KINDS)}")
    return args


def _generator(target, drafter, level: LevelSpec | None, shape: RoundShape, setting: KernelSetting,
               heads) -> SpeculativeGenerator:
    """The engine for ``shape`` over the drafter ``level`` (None where the shape runs no drafter)."""
    config = HierarchyConfig(shape.levels(level), draft_length=shape.adaptive or DraftLengthRule(), tree=shape.tree)
    # A setting's drafter copy matters only where the drafter runs (plain rows are priced under any).
    return SpeculativeGenerator(target, config, drafter=drafter, exit_heads=heads, pack_linears=setting.packed,
                                drafter_precision=setting.drafter_precision if shape.uses_drafter else "fp32")


def _measure(target, drafter, level, shape, setting, heads, prompts, params, max_new, eos, repeats):
    """Tokens/s of every repeat, the tokens, tokens per target round, (each model's shapes whose
    single rows ran packed, each model's row padding), and the last repeat's per-level statistics (``LevelStats.as_dict``:
    rounds, proposed, accepted, seconds), in ``setting`` (after ``WARMUP_TOKENS`` untimed tokens:
    first calls on fresh packed copies page-fault)."""
    torch.set_num_threads(setting.threads)
    generator = _generator(target, drafter, level, shape, setting, heads)
    rates, tokens, per_round, levels = [], None, 1.0, []
    try:
        run_runtime(generator, prompts[:1], params, WARMUP_TOKENS, eos, 0, 1)
        models = [(role, model) for role, model in (("target", target), ("drafter", drafter)) if model is not None]
        packed_single_rows = {role: [list(shape) for shape in model.packed_single_row_shapes()] for role, model in models}
        padding = {role: model.row_padding.describe() for role, model in models}
        for _ in range(repeats):
            tokens, seconds, levels = run_runtime(generator, prompts, params, max_new, eos, 0, 1)
            rates.append(sum(len(t) for t in tokens) / seconds)
            top = levels[-1]
            if top["rounds"]:
                per_round = (top["accepted"] + top["rounds"]) / top["rounds"]
    finally:
        for model in (target, drafter):
            if model is not None:
                model.unpack_linears()
    return rates, tokens, per_round, (packed_single_rows, padding), levels


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    run = start_run(__file__, argv)
    torch.inference_mode().__enter__()
    level = parse_level_specs(f"{args.drafter},target")[0]
    threads = [1, os.cpu_count() or 1] if args.threads == "auto" else [int(t) for t in args.threads.split(",")]
    precisions = [p.strip() for p in args.drafter_precisions.split(",") if p.strip()]
    settings = [KernelSetting(t, path, precision) for t in sorted(set(threads)) for path in (PATH_MKL, PATH_PACKED)
                for precision in precisions]
    loaded = load_model(args.model)
    target = loaded.model
    drafter = None
    # Exit heads serve an exit drafter or a middle exit (--middles); a model drafter alone needs none.
    heads = ((load_exit_heads_option(loaded, args.exit_heads) or {})
             if level.kind is not LevelKind.MODEL or args.middles else {})
    if level.kind is LevelKind.MODEL:
        drafter = load_model(level.model_path).model
        spec = DrafterSpec(model=drafter)
    else:
        spec = DrafterSpec(layer=level.layer, head=heads.get(level.layer))
    prompts = encoded_prompts(loaded.tokenizer, args.prompt_set, args.plan_prompts + args.num_prompts)
    plan_prompts, eval_prompts = prompts[: args.plan_prompts], prompts[args.plan_prompts :]
    params = SamplingParams(args.temperature)
    lookups = lookup_candidates(args.lookups, drafter is not None)
    middles = middle_candidates(args.middles, drafter is not None)
    plan = plan_rounds(target, spec, plan_prompts, params, args.max_new_tokens,
                       candidate_shapes(lookups=lookups, middles=middles), settings,
                       progress=lambda text: print(text, flush=True), middle_heads=heads)

    chosen, plain = plan.best, plan.plain
    every_core = KernelSetting(os.cpu_count() or 1, PATH_MKL)
    rows: list[tuple[str, RoundPrediction | None, RoundShape, KernelSetting]] = []
    if args.plain_rows == "all":
        rows.append(("plain, runtime defaults", _plain_prediction(plan, DEFAULT_SETTING), RoundShape(),
                     DEFAULT_SETTING))
        if every_core != DEFAULT_SETTING:
            rows.append(("plain, every core", _plain_prediction(plan, every_core), RoundShape(), every_core))
    if args.plain_rows == "fastest" or plain.costs.setting not in (DEFAULT_SETTING, every_core):
        rows.append(("plain, best setting", plain, plain.shape, plain.costs.setting))
    rows.append(("planner's choice", chosen, chosen.shape, chosen.costs.setting))
    for kind in (k.strip() for k in args.kinds.split(",") if k.strip()):
        best = next((p for p in plan.ranked if KINDS[kind](p.shape)), None)
        if best is not None and best is not chosen:
            rows.append((f"best {kind}", best, best.shape, best.costs.setting))

    eos = loaded.tokenizer.eos_token_id
    results, reference = [], None
    measured_lengths = [len(p) for p in eval_prompts]
    for role, pred, shape, setting in rows:
        if pred is not None:  # again, with the prefill of the prompts measured here
            pred = predict(pred.shape, pred.costs, plan.records[pred.costs.setting.drafter_precision],
                           args.max_new_tokens, measured_lengths)
        print(f"measuring {role}: {shape.label} ({setting.label})", flush=True)
        rates, tokens, per_round, (packed_single_rows, padding), levels = _measure(
            target, drafter, level, shape, setting, heads, eval_prompts, params,
            args.max_new_tokens, eos, args.repeats)
        if reference is None:
            reference = tokens
        rate = statistics.median(rates)
        results.append({
            "role": role, "shape": shape.label, "threads": setting.threads, "kernel_path": setting.kernel_path,
            "drafter_precision": setting.drafter_precision,
            "predicted_ms_per_token": None if pred is None else pred.seconds_per_token * 1e3,
            "predicted_tokens_per_round": None if pred is None else pred.tokens_per_round,
            "predicted_prefill_seconds": None if pred is None else pred.prefill_seconds,
            "measured_tokens_per_second": rate, "measured_ms_per_token": 1e3 / rate,
            "measured_ms_per_token_per_repeat": [1e3 / r for r in rates],
            "measured_tokens_per_round": per_round,
            "levels": levels,  # per level of the last repeat: rounds, proposed, accepted, seconds
            "output_equals_plain": tokens == reference if args.temperature == 0.0 else None,
            # [in, out] shapes whose single rows ran packed (the row's own single_row_split)
            "packed_single_row_shapes": packed_single_rows,
            "row_padding": padding,  # packed few-row calls padded per model (CausalLM.pack_linears)
        })
    defaults = next((r for r in results if r["role"] == "plain, runtime defaults"), None)
    base = None if defaults is None else defaults["measured_tokens_per_second"]
    best_plain_rate = max(r["measured_tokens_per_second"] for r in results if r["role"].startswith("plain"))
    for row in results:
        row["vs_plain_defaults"] = None if base is None else row["measured_tokens_per_second"] / base
        row["vs_plain_best"] = row["measured_tokens_per_second"] / best_plain_rate
        predicted = row["predicted_ms_per_token"]
        row["abs_percentage_error"] = (None if predicted is None else
                                       abs(predicted - row["measured_ms_per_token"]) / row["measured_ms_per_token"] * 100)

    agreement = _record_agreement(plan)
    payload = {"agreement": agreement, "model": args.model, "drafter": args.drafter, "prompt_set": args.prompt_set,
               "plan_prompts": args.plan_prompts, "num_prompts": args.num_prompts,
               "max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "repeats": args.repeats,
               "rows": results, **plan.as_dict()}
    text = _markdown(args, results, plan, agreement)
    write_results(RESULTS_DIR / args.name, payload, text, run)
    print(text)


def _record_agreement(plan: RoundPlan) -> dict:
    """Mean acceptance per level pair over the planning records, per drafter precision: drafter ->
    target (alpha), and for each recorded middle exit, drafter -> exit and exit -> target (greedy:
    argmax agreement; sampled: 1 - TV)."""
    out = {}
    for precision, records in plan.records.items():
        entry = {"drafter_target": statistics.mean(float(r.alpha.mean()) for r in records)}
        for middle in records[0].middles:
            layer = middle.layer
            entry[f"drafter_exit{layer}"] = statistics.mean(float(r.middle(layer).draft_pass.mean()) for r in records)
            entry[f"exit{layer}_target"] = statistics.mean(float(r.middle(layer).target_pass.mean()) for r in records)
        out[precision] = entry
    return out


def _plain_prediction(plan: RoundPlan, setting: KernelSetting) -> RoundPrediction | None:
    """The plan's plain-decoding prediction under ``setting``'s threads and kernel path (None if
    the planner timed no such setting)."""
    return next((p for p in plan.ranked if p.shape.plain and p.costs.setting.threads == setting.threads
                 and p.costs.setting.kernel_path == setting.kernel_path), None)


def _range(values: list[float]) -> str:
    return f"{min(values):.1f}-{max(values):.1f}"


def _markdown(args, results, plan, agreement) -> str:
    def num(value, fmt):
        return "-" if value is None else format(value, fmt)

    lines = [
        f"# Round planner: {args.model} with {args.drafter}, {args.prompt_set}, T = {args.temperature}",
        "",
        f"Planned on prompts 0-{args.plan_prompts - 1}, measured on the next {args.num_prompts}, "
        f"{args.max_new_tokens} new tokens, batch 1, median of {args.repeats}. Predicted and measured ms/token "
        "both include each prompt's prefill (predicted at the measured prompts' lengths).",
        "",
        "| row | shape | setting | predicted ms/tok | measured ms/tok (range) | abs. error | "
        "tokens/round pred. / meas. | vs plain (defaults) | vs fastest plain | greedy = plain |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in results:
        same = {None: "-", True: "yes", False: "NO"}[row["output_equals_plain"]]
        predicted, measured = row["predicted_ms_per_token"], row["measured_ms_per_token"]
        error = row["abs_percentage_error"]
        drafter = "" if row.get("drafter_precision", "fp32") == "fp32" else f", drafter {row['drafter_precision']}"
        lines.append(
            f"| {row['role']} | {row['shape']} | {row['threads']} thr, {row['kernel_path']}{drafter} | "
            f"{num(predicted, '.1f')} | {measured:.1f} "
            f"({_range(row['measured_ms_per_token_per_repeat'])}) | {num(error, '.0f')}{'' if error is None else '%'} | "
            f"{num(row['predicted_tokens_per_round'], '.2f')} / {row['measured_tokens_per_round']:.2f} | "
            f"{num(row['vs_plain_defaults'], '.2f')}{'' if row['vs_plain_defaults'] is None else 'x'} | "
            f"{row['vs_plain_best']:.2f}x | {same} |")
    errors = [row["abs_percentage_error"] for row in results if row["abs_percentage_error"] is not None]
    if errors:
        lines += ["", f"Latency model: mean absolute percentage error {statistics.mean(errors):.0f}%, "
                  f"largest {max(errors):.0f}%."]
    fastest = max(results, key=lambda row: row["measured_tokens_per_second"])
    chosen = next(row for row in results if row["role"] == "planner's choice")
    lines += ["", f"The planner's choice served {chosen['measured_tokens_per_second'] / fastest['measured_tokens_per_second']:.3f} "
              f"of the fastest measured row ({fastest['role']})."]
    lines += ["", "Shapes (in x out) whose single rows ran on the packed kernel, per row (each packed row measures "
              "its own split; the rest ran `F.linear`):", ""]
    for row in results:
        packed = "; ".join(f"{role}: " + (", ".join(f"{i}x{o}" for i, o in shapes) or "none")
                           for role, shapes in row.get("packed_single_row_shapes", {}).items())
        padding = "; ".join(f"{role}: {text}" for role, text in row.get("row_padding", {}).items())
        lines.append(f"- {row['role']}: {packed or '-'}" + (f" ({padding})" if padding else ""))
    lines += ["", "Per level, last repeat (verification rounds; accepted of the drafts it verified; seconds in its "
              "forwards and verification; the drafter: drafted tokens, seconds):", ""]
    for row in results:
        if len(row.get("levels") or []) < 2:
            continue
        parts = [f"{lv['name']}: {lv['proposed']} drafted, {lv['seconds']:.1f} s" if i == 0 else
                 f"{lv['name']}: {lv['rounds']} rounds, {lv['accepted']}/{lv['proposed']} accepted, {lv['seconds']:.1f} s"
                 for i, lv in enumerate(row["levels"])]
        lines.append(f"- {row['role']} ({row['shape']}): " + "; ".join(parts))
    lines += ["", "Acceptance between levels on the planning records (greedy: argmax agreement; sampled: "
              "mean 1 - TV), per drafter precision: " + "; ".join(
                  f"{precision}: " + ", ".join(f"{pair.replace('_', ' -> ')} {value:.3f}" for pair, value in entry.items())
                  for precision, entry in agreement.items())]
    lines += ["", "Top predicted candidates:", "", "| shape | setting | predicted ms/tok | tokens/round |",
              "|---|---|---|---|"]
    for pred in plan.ranked[:10]:
        lines.append(f"| {pred.shape.label} | {pred.costs.setting.label} | {pred.seconds_per_token * 1e3:.1f} | "
                     f"{pred.tokens_per_round:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
