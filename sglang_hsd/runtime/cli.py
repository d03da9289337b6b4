"""``sglang-hsd generate``: run the speculative runtime on a real model from the command line."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the imports run inside the functions, so that --help does not import torch
    from sglang_hsd.draft_length import DraftLengthRule
    from sglang_hsd.runtime.plan_file import PlannedHierarchy
    from sglang_hsd.tree_draft import TreeShape

DEFAULT_MODEL = "smollm2-135m"
DEFAULT_LEVELS = "exit:8,exit:16,target"
# kernel_setup.DRAFTER_PRECISION_OPTIONS, spelled out so that --help does not import torch
# (tests/test_cli.py holds the two equal).
DRAFTER_PRECISION_CHOICES = ("fp32", "bf16", "fp16", "int8", "int4", "w8a8", "int4+w8a8", "auto")
DEFAULT_PROMPT = "Write a Python function that checks whether a number is prime, and explain it briefly."


def add_generate_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "generate",
        help="generate text with a speculative hierarchy (drafter -> early exits -> target)",
        description=(
            "Generate with the plain-PyTorch speculative runtime. Each level verifies the level "
            "below losslessly and passes its own probabilities up. Prints the text, tokens/s, "
            "acceptance per level and target layer-forwards per token. The model is fetched and "
            "converted on first use."
        ),
    )
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"model name or folder (default {DEFAULT_MODEL})")
    parser.add_argument("--prompt", action="append", help="a user message (repeat for a batch)")
    parser.add_argument("--prompt-set", help="take prompts from a set instead: mtbench, humaneval, sharegpt, alpacaeval")
    parser.add_argument("--num-prompts", type=int, default=4, help="prompts taken from --prompt-set (default 4)")
    parser.add_argument(
        "--levels",
        default=DEFAULT_LEVELS,
        help="comma list, cheapest first: exit:<layer>, model:<name or folder> (the drafter, or right "
        "above a lookup drafter), lookup[:<longest n-gram>] (copies continuations of earlier text; drafter "
        f"only), target (last); 'target' alone is autoregressive (default {DEFAULT_LEVELS})",
    )
    parser.add_argument("--buffers", help="comma list, one per level below the target: draft length N_d, then N_i")
    parser.add_argument("--plan", type=Path, help="take --levels and --buffers (and, when the plan has them, "
                        "--draft-length, --tree, --threads, --drafter-precision and the kernel path) from a `sglang-hsd plan` "
                        "JSON file; what the plan sets wins over the options")
    parser.add_argument(
        "--draft-length", default="fixed",
        help="drafter's tokens per round: 'fixed' (the drafter's buffer N_d) or "
        "'adaptive[:threshold[:max]]': stop after a drafted token whose draft probability is below the "
        "threshold (default 0.4) or at a per-request cap adapted from past rounds (at most max, default 16)",
    )
    parser.add_argument(
        "--drafter-precision", choices=DRAFTER_PRECISION_CHOICES,
        help="weights a separate draft model's batch-1 drafting steps read: bf16 / fp16 / int8 / int4 / w8a8 "
        "copies stream less (int4+w8a8: 1-3 rows on int4, more on w8a8); the output law is unchanged. 'auto' "
        "times them on this CPU and takes the fastest. Default: auto with a model: drafter, else fp32",
    )
    parser.add_argument(
        "--tree", default="none",
        help="'none' (chains) or D:k:N: draft a sampled tree per round, depth D, k children per node, N nodes "
        "with the root (two levels: a model:, exit: or eagle3: drafter and the target; e.g. 4:2:8)",
    )
    parser.add_argument("--methods", default="hsd", help="verify rule(s): hsd, tokenwise, greedy; one or one per level")
    parser.add_argument("--exit-heads", default="auto", help="folder of trained exit heads, 'auto' (use the "
                        "trained defaults if present) or 'none' (final norm + LM head: logit lens)")
    parser.add_argument("--no-kv-reuse", action="store_true", help="give every level its own KV cache (baseline)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compare", action="store_true", help="also run plain autoregressive decoding and print the ratio")
    parser.add_argument("--json", type=Path, help="write the results (tokens, per-level statistics) to this file")
    parser.add_argument(
        "--threads", type=int, default=1,
        help="torch intra-op threads (default 1: on 2 shared cores, intra-op threading of small "
        "matmuls lost 4x to contention in our measurements; 0 = torch default)",
    )
    parser.set_defaults(func=run_generate)


def _drafter_precision(levels: str, chosen: str | None) -> str:
    """``--drafter-precision`` for ``--levels`` (checked before any model loads): auto (measured)
    by default with a separate draft model, and only fp32 for an exit or EAGLE-3 drafter (the
    target's numbers; ``auto`` means fp32 there)."""
    from sglang_hsd.levels import parse_level_specs, separate_model

    if separate_model(parse_level_specs(levels)) is not None:
        return chosen or "auto"
    if chosen not in (None, "fp32", "auto"):
        raise ValueError(f"--drafter-precision {chosen} needs a model:<name> level in --levels, "
                         f"got {levels!r}")
    return "fp32"


@dataclass(frozen=True)
class GenerateOptions:
    """What ``generate`` runs, resolved from the options and a plan, before any model loads.

    Fields:
        levels: the level grammar (``--levels``); buffers: one per level below the target, or
            None for the defaults (``--buffers``).
        draft_length: a ``DraftLengthRule``; tree: a ``TreeShape`` or None for chains.
        threads: torch intra-op threads (0: torch's default).
        drafter_precision: a ``DRAFTER_PRECISION_OPTIONS`` name for ``build_generator``.
        pack_linears: run the linear layers on the oneDNN packed path (a plan's ``kernel_path``).
    """

    levels: str
    buffers: list[int] | None
    draft_length: DraftLengthRule
    tree: TreeShape | None
    threads: int
    drafter_precision: str
    pack_linears: bool


def generate_options(args: argparse.Namespace, plan: PlannedHierarchy | None) -> GenerateOptions:
    """Resolve ``generate``'s options against a plan's hierarchy (``PlanFile.best``; None: no
    ``--plan``). Bad input raises ``ValueError`` naming the option.

    The plan's levels and buffers replace ``--levels`` and ``--buffers``; each knob the plan has
    (``RunKnobs``, already parsed) replaces its option, whether given or left at its default;
    options the plan leaves out are parsed here.
    """
    from sglang_hsd.draft_length import parse_draft_length
    from sglang_hsd.levels import parse_buffers
    from sglang_hsd.runtime.kernel_paths import PATH_PACKED
    from sglang_hsd.runtime.plan_file import CHAINS, RunKnobs
    from sglang_hsd.tree_draft import TreeShape

    levels, buffers = args.levels, parse_buffers(args.buffers) if args.buffers else None
    knobs = RunKnobs()
    if plan is not None:
        levels, buffers, knobs = plan.level_names, plan.buffers or None, plan.knobs
    draft_length = knobs.draft_length if knobs.draft_length is not None else parse_draft_length(args.draft_length)
    if knobs.tree is None:
        tree = TreeShape.parse(args.tree)
    else:
        tree = None if knobs.tree is CHAINS else knobs.tree
    return GenerateOptions(
        levels, buffers, draft_length, tree,
        threads=knobs.threads if knobs.threads is not None else args.threads,
        drafter_precision=_drafter_precision(levels, knobs.drafter_precision or args.drafter_precision),
        pack_linears=knobs.kernel_path == PATH_PACKED)


def run_generate(args: argparse.Namespace) -> int:
    import torch

    from sglang_hsd.assets.chat import encode_prompts
    from sglang_hsd.runtime.loading import build_generator, load_model, prompt_set_texts
    from sglang_hsd.runtime.plan_file import PlanFile
    from sglang_hsd.sampling import SamplingParams

    # Bad input (options or plan) fails here, before a model loads.
    options = generate_options(args, PlanFile.read(args.plan).best if args.plan else None)
    if options.threads:
        torch.set_num_threads(options.threads)
    methods = args.methods.split(",")
    target = load_model(args.model)
    gen = build_generator(target, options.levels, options.buffers, methods, args.exit_heads,
                          reuse_kv=not args.no_kv_reuse, draft_length=options.draft_length, tree=options.tree,
                          pack_linears=options.pack_linears, drafter_precision=options.drafter_precision)
    if options.drafter_precision == "auto":
        print(f"drafter steps on {gen.drafter_precision} weights (measured fastest here)")
    texts = prompt_set_texts(args.prompt_set, args.num_prompts) if args.prompt_set else args.prompt or [DEFAULT_PROMPT]
    prompts = encode_prompts(target.tokenizer, texts)
    params = SamplingParams(args.temperature, args.top_k, args.top_p)
    eos = target.tokenizer.eos_token_id
    runs = {options.levels: gen}
    if args.compare and options.levels != "target":
        runs = {"target": build_generator(target, "target", None, None, "none"), **runs}
    report = {}
    for name, generator in runs.items():
        result = generator.generate(prompts, params, args.max_new_tokens, eos, seed=args.seed)
        report[name] = result
        print(f"\n=== {name} ===")
        for text, tokens in zip(texts, result.tokens):
            print(f"> {text}\n{target.tokenizer.decode(tokens, skip_special_tokens=True)}\n")
        print(result.summary())
    if len(report) > 1:
        base, spec = report["target"], report[options.levels]
        print(f"\nspeed-up over autoregressive: {spec.tokens_per_second / base.tokens_per_second:.2f}x "
              f"(same prompts, same run)")
    if args.json:
        args.json.write_text(json.dumps({k: v.as_dict() for k, v in report.items()}, indent=2))
    return 0

