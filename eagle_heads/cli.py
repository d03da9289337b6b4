"""``sglang-hsd train-heads``: train early-exit heads (and optionally an EAGLE-3 head) on CPU."""

from __future__ import annotations

import argparse
import json


# Defaults that reproduce the heads in eagle_heads/README.md (training minutes; the continuations
# of the training prompts took another 26 minutes with 2 workers on the shared 2-core CPU).
EXIT_BUDGET = 6.0
EAGLE3_BUDGET = 20.0


def add_train_heads_parser(subparsers) -> None:
    from eagle_heads.pipeline import FeatureSpec

    spec = FeatureSpec()
    parser = subparsers.add_parser(
        "train-heads",
        help="train early-exit heads (and an EAGLE-3 head with --eagle3) for a registered model",
        description="Lets the target continue ShareGPT + AlpacaEval prompts (MT-Bench held out), "
        "collects its hidden states over prompt + continuation, trains tuned-lens exit heads by KL(p_final || p_exit) and, with --eagle3, an EAGLE-3 "
        "head with a training-time-test objective, then reports held-out acceptance. Outputs go to "
        "<cache>/heads/<model>/ unless --out is given; reruns resume from checkpoints.",
    )
    parser.add_argument("--model", default="smollm2-135m", help="registered model name (default smollm2-135m)")
    parser.add_argument("--exit-layers", default="4,8,16", help="comma-separated exit layers (default 4,8,16)")
    parser.add_argument("--no-exit", action="store_true", help="skip the exit heads")
    parser.add_argument("--eagle3", action="store_true", help="also train an EAGLE-3 head")
    parser.add_argument("--budget-minutes", type=float, default=EXIT_BUDGET, help=f"training wall time of the exit heads in minutes, feature collection not included (default {EXIT_BUDGET:g})")
    parser.add_argument("--eagle3-budget-minutes", type=float, default=EAGLE3_BUDGET, help=f"training wall time of the EAGLE-3 head (default {EAGLE3_BUDGET:g})")
    parser.add_argument("--draft-vocab", type=int, default=8192, help="EAGLE-3 draft vocabulary size (default 8192)")
    parser.add_argument("--train-prompts", type=int, default=spec.train_prompts, help=f"training prompts per set (default {spec.train_prompts})")
    parser.add_argument("--train-new-tokens", type=int, default=spec.train_new_tokens, help=f"target continuation tokens per training prompt (default {spec.train_new_tokens}; 0 = prompt text only)")
    parser.add_argument("--workers", type=int, default=spec.workers, help=f"processes generating continuations (default {spec.workers})")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1; run exit and EAGLE-3 training as two processes instead)")
    parser.add_argument("--out", default=None, help="output folder (default <cache>/heads/<model>)")
    parser.set_defaults(func=run_train_heads)


def run_train_heads(args: argparse.Namespace) -> int:
    from pathlib import Path

    import torch

    from eagle_heads import pipeline
    from sglang_hsd.assets.heads import heads_dir

    torch.set_num_threads(args.threads)
    out = Path(args.out) if args.out else heads_dir(args.model)
    out.mkdir(parents=True, exist_ok=True)
    target, tokenizer = pipeline.load_target(args.model)
    layers = [int(x) for x in args.exit_layers.split(",") if x]
    boundaries = layers + pipeline.eagle3_capture_layers(target.num_layers)
    for name in ("train_prompts", "workers"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.train_new_tokens < 0:
        raise SystemExit(f"--train-new-tokens must be >= 0, got {args.train_new_tokens}")
    spec = pipeline.FeatureSpec(train_prompts=args.train_prompts, train_new_tokens=args.train_new_tokens, workers=args.workers)
    train, heldout = pipeline.prepare_features(target, tokenizer, out, spec, boundaries, model=args.model)
    print(f"features: {train.num_positions} training positions, {heldout.num_positions} held-out positions")
    if not args.no_exit:
        metrics = pipeline.train_and_save_exit_heads(target, args.model, train, heldout, layers, out / "exit", args.budget_minutes)
        print(f"exit heads -> {out / 'exit'}\n" + json.dumps(metrics, indent=2))
    if args.eagle3:
        metrics = pipeline.train_and_save_eagle3(target, args.model, train, heldout, out / "eagle3", args.eagle3_budget_minutes, args.draft_vocab)
        print(f"EAGLE-3 head -> {out / 'eagle3'}\n" + json.dumps(metrics, indent=2))
    return 0
