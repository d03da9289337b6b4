"""``sglang-hsd train-heads``: train early-exit heads (and optionally an EAGLE-3 head) on CPU."""

from __future__ import annotations

import argparse
import json


def add_train_heads_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "train-heads",
        help="train early-exit heads (and an EAGLE-3 head with --eagle3) for a registered model",
        description="Collects target hidden states on ShareGPT + AlpacaEval prompts (MT-Bench held "
        "out), trains tuned-lens exit heads by KL(p_final || p_exit) and, with --eagle3, an EAGLE-3 "
        "head with a training-time-test objective, then reports held-out acceptance. Outputs go to "
        "<cache>/heads/<model>/ unless --out is given; reruns resume from checkpoints.",
    )
    parser.add_argument("--model", default="smollm2-135m", help="registered model name (default smollm2-135m)")
    parser.add_argument("--exit-layers", default="4,8,16", help="comma-separated exit layers (default 4,8,16)")
    parser.add_argument("--no-exit", action="store_true", help="skip the exit heads")
    parser.add_argument("--eagle3", action="store_true", help="also train an EAGLE-3 head")
    parser.add_argument("--budget-minutes", type=float, default=10.0, help="wall-time budget of the exit heads in minutes (default 10)")
    parser.add_argument("--eagle3-budget-minutes", type=float, default=30.0, help="wall-time budget of the EAGLE-3 head (default 30)")
    parser.add_argument("--draft-vocab", type=int, default=8192, help="EAGLE-3 draft vocabulary size (default 8192)")
    parser.add_argument("--train-prompts", type=int, default=64, help="training prompts per set (default 64)")
    parser.add_argument("--out", default=None, help="output folder (default <cache>/heads/<model>)")
    parser.set_defaults(func=run_train_heads)


def run_train_heads(args: argparse.Namespace) -> int:
    from pathlib import Path

    import torch

    from eagle_heads import pipeline

    torch.set_num_threads(min(2, torch.get_num_threads()))
    out = Path(args.out) if args.out else pipeline.heads_dir(args.model)
    out.mkdir(parents=True, exist_ok=True)
    target, tokenizer = pipeline.load_target(args.model)
    layers = [int(x) for x in args.exit_layers.split(",") if x]
    boundaries = layers + pipeline.eagle3_capture_layers(target.num_layers)
    spec = pipeline.FeatureSpec(train_prompts=args.train_prompts)
    train, heldout = pipeline.prepare_features(target, tokenizer, out, spec, boundaries)
    print(f"features: {train.num_positions} training positions, {heldout.num_positions} held-out positions")
    if not args.no_exit:
        metrics = pipeline.train_and_save_exit_heads(target, args.model, train, heldout, layers, out / "exit", args.budget_minutes)
        print(f"exit heads -> {out / 'exit'}\n" + json.dumps(metrics, indent=2))
    if args.eagle3:
        metrics = pipeline.train_and_save_eagle3(target, args.model, train, heldout, out / "eagle3", args.eagle3_budget_minutes, args.draft_vocab)
        print(f"EAGLE-3 head -> {out / 'eagle3'}\n" + json.dumps(metrics, indent=2))
    return 0
