"""``sglang-hsd generate``: run the speculative runtime on a real model from the command line."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MODEL = "smollm2-135m"
DEFAULT_LEVELS = "exit:8,exit:16,target"
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
        help="comma list, cheapest first: exit:<layer>, model:<name or folder> (drafter only), "
        f"target (last); 'target' alone is autoregressive (default {DEFAULT_LEVELS})",
    )
    parser.add_argument("--buffers", help="comma list, one per level below the target: draft length N_d, then N_i")
    parser.add_argument("--plan", type=Path, help="take --levels and --buffers from a `sglang-hsd plan` JSON file")
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


@dataclass
class LoadedModel:
    """A target (or drafter): our ``CausalLM``, the transformers model it shares weights with, the tokenizer."""

    model: object
    hf: object
    tokenizer: object
    path: Path


def load_model(name_or_path: str) -> LoadedModel:
    """Load a registry model (fetching it on first use) or a local folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sglang_hsd.runtime.model import CausalLM

    path = Path(name_or_path)
    if not path.is_dir():
        from sglang_hsd.assets.fetch import fetch_model

        path = fetch_model(name_or_path)  # raises ValueError listing known names
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, attn_implementation="eager").eval()
    return LoadedModel(CausalLM.from_hf(hf), hf, AutoTokenizer.from_pretrained(str(path)), path)


def check_same_tokenizer(target_tok, drafter_tok, drafter_name: str) -> None:
    if target_tok.get_vocab() != drafter_tok.get_vocab():
        raise ValueError(
            f"drafter {drafter_name!r} has a different tokenizer from the target: speculative "
            "decoding needs one shared vocabulary"
        )


def encode_prompts(tokenizer, texts: list[str]) -> list[list[int]]:
    """Apply the chat template (if any) and tokenize each user message."""
    ids = []
    for text in texts:
        if getattr(tokenizer, "chat_template", None):
            templated = tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
            )
            ids.append(tokenizer(templated, add_special_tokens=False)["input_ids"])
        else:
            ids.append(tokenizer(text)["input_ids"])
    return ids


def _prompt_texts(args) -> list[str]:
    if args.prompt_set:
        from sglang_hsd.assets.prompts import load_prompts

        return [p.messages[0]["content"] for p in load_prompts(args.prompt_set, limit=args.num_prompts)]
    return args.prompt or [DEFAULT_PROMPT]


def build_generator(target: LoadedModel, levels: str, buffers, methods, exit_heads: str, reuse_kv: bool = True):
    """A ``SpeculativeGenerator`` for a ``--levels`` spec (loads a separate drafter if named)."""
    from sglang_hsd.runtime.config import HierarchyConfig, parse_levels
    from sglang_hsd.runtime.engine import SpeculativeGenerator

    config = parse_levels(levels, buffers, methods)
    config = HierarchyConfig(config.levels, reuse_kv=reuse_kv)
    drafter = None
    if config.levels[0].kind == "model":
        loaded = load_model(config.levels[0].model_path)
        check_same_tokenizer(target.tokenizer, loaded.tokenizer, config.levels[0].model_path)
        drafter = loaded.model
    heads = load_exit_heads_option(target, exit_heads)
    return SpeculativeGenerator(target.model, config, drafter=drafter, exit_heads=heads)


def load_exit_heads_option(target: LoadedModel, exit_heads: str) -> dict:
    """``--exit-heads``: ``none`` (logit lens), ``auto`` (the trained heads of ``sglang-hsd
    train-heads`` for this model, if present) or a folder of saved exit heads."""
    if exit_heads == "none":
        return {}
    from eagle_heads.exit_heads import load_exit_heads
    from eagle_heads.pipeline import heads_dir

    folder = heads_dir(target.path.name) / "exit" if exit_heads == "auto" else Path(exit_heads)
    if not (folder / "manifest.json").is_file():
        if exit_heads != "auto":
            raise ValueError(f"--exit-heads folder {exit_heads} holds no saved exit heads (manifest.json)")
        return {}
    return load_exit_heads(str(folder), target.model)


def run_generate(args: argparse.Namespace) -> int:
    import torch

    from sglang_hsd.sampling import SamplingParams

    if args.threads:
        torch.set_num_threads(args.threads)
    buffers = [int(x) for x in args.buffers.split(",")] if args.buffers else None
    if args.plan:
        from sglang_hsd.hierarchy.cli import load_plan

        args.levels, buffers = load_plan(args.plan)
        buffers = buffers or None
    methods = args.methods.split(",")
    target = load_model(args.model)
    gen = build_generator(target, args.levels, buffers, methods, args.exit_heads, reuse_kv=not args.no_kv_reuse)
    texts = _prompt_texts(args)
    prompts = encode_prompts(target.tokenizer, texts)
    params = SamplingParams(args.temperature, args.top_k, args.top_p)
    eos = target.tokenizer.eos_token_id
    runs = {args.levels: gen}
    if args.compare and args.levels != "target":
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
        base, spec = report["target"], report[args.levels]
        print(f"\nspeed-up over autoregressive: {spec.tokens_per_second / base.tokens_per_second:.2f}x "
              f"(same prompts, same run)")
    if args.json:
        args.json.write_text(json.dumps({k: v.as_dict() for k, v in report.items()}, indent=2))
    return 0

