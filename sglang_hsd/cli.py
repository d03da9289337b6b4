"""The ``sglang-hsd`` command line: one thin entry point over the library."""

from __future__ import annotations

import argparse
import importlib
import sys
import time


def _add_check_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "check",
        help="exact losslessness check of every verifier (run after changing a sampler or kernel)",
        description=(
            "Enumerate, exactly, the distribution of the first L emitted tokens of every chain "
            "verifier on random context-dependent worlds with a tiny vocabulary, over repeated "
            "rounds, and compare it with the target's. Prints the worst total-variation distance "
            "per prefix length and the exact expected accepted draft tokens per round. Exits 1 if "
            "a method that claims to be lossless is not."
        ),
    )
    parser.add_argument("--vocab-size", type=int, default=3, help="tiny vocabulary size (default 3)")
    parser.add_argument("--num-draft", type=int, default=3, help="draft length K (default 3)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[2, 3, 4], help="prefix lengths L to compare")
    parser.add_argument("--worlds", type=int, default=3, help="number of random worlds (default 3)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first world")
    parser.add_argument(
        "--sampled",
        type=int,
        default=100_000,
        metavar="N",
        help="also run the batched verify_chain on N sequences of the first world and chi-square "
        "its prefixes against the target (0 disables; default 100000)",
    )
    parser.set_defaults(func=_run_check)


def _run_check(args: argparse.Namespace) -> int:
    import warnings

    from sglang_hsd.verify.oracles.report import chain_report, format_report, report_is_consistent

    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reports = chain_report(
            args.vocab_size, args.num_draft, tuple(args.lengths), args.worlds, args.seed,
            sampled_sequences=args.sampled,
        )
    print(
        f"Exact check: V={args.vocab_size}, K={args.num_draft}, {args.worlds} random context-dependent "
        f"worlds, prefixes of {args.lengths} tokens over repeated rounds"
    )
    print(format_report(reports))
    print(
        "(greedy reproduces the target's greedy decoding, not its sampling distribution, so it is "
        "LOSSY here by design; hsd-paper is the published code's uncapped rule)"
    )
    ok = report_is_consistent(reports)
    print(f"\n{'OK' if ok else 'FAILED'}: every method claimed lossless is "
          f"{'lossless' if ok else 'NOT lossless'} ({time.perf_counter() - start:.1f}s)")
    return 0 if ok else 1


def _add_demo_parser(subparsers) -> None:
    from sglang_hsd.runtime.demo import DEFAULT_DEMO, DEMOS

    models = "; ".join(f"{name}: {spec.summary}" for name, spec in DEMOS.items())
    parser = subparsers.add_parser(
        "demo",
        help="the main job: `check`, then plain vs speculative decoding on a real model pair",
        description="Runs `sglang-hsd check` with its defaults, then fetches the demo's models (on "
        "first use, with progress bars) and decodes its prompt twice, greedy: plainly and "
        "speculatively. Prints whether the two outputs are identical token for token, the draft "
        "tokens accepted per round, tokens/s of both and their ratio, and the total time.",
    )
    parser.add_argument("--model", default=DEFAULT_DEMO, choices=list(DEMOS),
                        help=f"which demo (default {DEFAULT_DEMO}). {models}")
    parser.add_argument("--max-new-tokens", type=int, help="tokens generated per prompt (default: the demo's)")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: the demo's; for "
                        "the Qwen pair every core if the machine is idle, else 1)")
    parser.add_argument("--skip-check", action="store_true", help="skip the exact check")
    parser.set_defaults(func=_run_demo)


def _run_demo(args: argparse.Namespace) -> int:
    import dataclasses

    from sglang_hsd.runtime.demo import DEMOS, auto_threads, run_demo

    start = time.perf_counter()
    spec = DEMOS[args.model]
    overrides = {"max_new_tokens": args.max_new_tokens, "threads": args.threads}
    spec = dataclasses.replace(spec, **{k: v for k, v in overrides.items() if v is not None})  # validated
    if spec.threads == 0:  # decided before the check below loads the machine itself
        spec = dataclasses.replace(spec, threads=auto_threads())
    if not args.skip_check:
        code = _run_check(build_parser().parse_args(["check"]))
        if code:
            return code
    print(f"\n--- plain vs speculative decoding: {args.model} ---")
    code = run_demo(spec)
    print(f"\ntotal time {time.perf_counter() - start:.0f}s")
    return code


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sglang-hsd",
        description="Lossless hierarchical speculative decoding: verifiers, checks and tools.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_check_parser(subparsers)
    _add_demo_parser(subparsers)
    for module_name, adder in _LIBRARY_SUBCOMMANDS:
        module = importlib.import_module(module_name)
        getattr(module, adder)(subparsers)
    for entry_point in _installed_subcommands():
        entry_point.load()(subparsers)
    return parser


# Subcommands that live beside the code they drive: (module, function adding the subparser).
_LIBRARY_SUBCOMMANDS: list[tuple[str, str]] = [
    ("sglang_hsd.assets.cli", "add_fetch_parser"),
    ("sglang_hsd.runtime.cli", "add_generate_parser"),
    ("sglang_hsd.hierarchy.cli", "add_plan_parser"),
    ("sglang_hsd.sglang_plugin.serve", "add_serve_parser"),
    ("sglang_hsd.bench.cli", "add_bench_parser"),
]
# Entry-point group of subcommands other installed packages add (``eagle_heads`` adds
# ``train-heads``): each entry point names a function ``add_parser(subparsers)``.
COMMANDS_ENTRY_POINT_GROUP = "sglang_hsd.commands"


def _installed_subcommands() -> list:
    """The ``sglang_hsd.commands`` entry points of the installed distributions, sorted by name."""
    from importlib.metadata import entry_points

    return sorted(entry_points(group=COMMANDS_ENTRY_POINT_GROUP), key=lambda entry_point: entry_point.name)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
