"""``sglang-hsd bench``: how much faster is HSD than no speculation, on this machine, for a pair,
at a load.

    sglang-hsd bench                                   # the Qwen2.5-Coder pair, ~10 minutes on 2 cores
    sglang-hsd bench --prompt-sets my_prompts.jsonl --concurrency 1,2,8 --temperature 0,1
    sglang-hsd bench --target T --draft D -- --speculative-num-steps 6
    sglang-hsd bench --url-plain http://gpu:30000 --url-hsd http://gpu:30001 --tokenizer TOKENIZER_DIR
    sglang-hsd bench --dry-run                         # the commands, nothing started

``config.py`` holds the options and their refusals (and the arithmetic of the default run's
length), ``plan.py`` what runs, ``run.py`` runs it, ``report.py`` writes the table, ``bench.json``
and ``bench.png``. Exit codes: 0 measured, 1 a server or a client failed (or a fetch), 2 input
refused before anything started, 130 stopped with Ctrl-C (the rows so far stay in bench.json).
"""

from __future__ import annotations

import argparse
import sys

from sglang_hsd.bench.config import (
    DEFAULT_CONCURRENCY, DEFAULT_MAX_NEW_TOKENS, DEFAULT_NUM_PROMPTS, DEFAULT_OUT, DEFAULT_PROMPT_SETS,
    DEFAULT_STARTUP_TIMEOUT, DEFAULT_TEMPERATURES, BenchConfig, parse_float_list, parse_int_list,
    parse_name_list)
from sglang_hsd.bench.prompts import PROMPT_SETS

PROG = "sglang-hsd bench"


def _join(values) -> str:
    return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)


def _add_pair_options(parser: argparse.ArgumentParser) -> None:
    from sglang_hsd.sglang_plugin.serve_launch import DEFAULT_TARGET, DEVICES, SERVE_PAIRS

    pairs = ", ".join(f"{target} (draft {draft})" for target, draft in SERVE_PAIRS.items())
    group = parser.add_argument_group("the pair (bench starts both servers, one after the other)")
    group.add_argument("--target", default=None, help="registered model name or model folder (default "
                       f"{DEFAULT_TARGET}, fetched on first use as serve does)")
    group.add_argument("--draft", default=None, help="registered model name or folder: a draft language "
                       f"model of the target's family or an EAGLE-3 head (default: the target's pair: {pairs})")
    group.add_argument("--device", default=None, choices=DEVICES,
                       help="as serve's: auto (default) cuda when torch sees a GPU, else cpu")
    group.add_argument("--startup-timeout", type=float, default=DEFAULT_STARTUP_TIMEOUT, metavar="S",
                       help=f"seconds to wait for each server to become healthy (default {DEFAULT_STARTUP_TIMEOUT:g})")
    running = parser.add_argument_group("or servers already running (nothing is started)")
    running.add_argument("--url-plain", metavar="URL", help="base URL of an SGLang server of the target "
                         "without speculation, e.g. http://gpu-host:30000 (with --url-hsd)")
    running.add_argument("--url-hsd", metavar="URL", help="base URL of the HSD server of the same target "
                         "(`sglang-hsd serve`), e.g. http://gpu-host:30001 (with --url-plain)")
    running.add_argument("--tokenizer", metavar="DIR|NAME", help="with --url-*: the folder of the target's "
                         "tokenizer (or a registered model name) the client counts tokens with (default: "
                         "the HSD server's tokenizer_path, when that folder exists on this machine)")


def _add_load_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("the load (one row per prompt set x concurrency x temperature)")
    group.add_argument("--prompt-sets", default=_join(DEFAULT_PROMPT_SETS), metavar="SET,...",
                       help=f"comma-separated: {', '.join(PROMPT_SETS)} (fetched on first use) or paths of "
                       'JSONL files with one {"prompt": "..."} object per line (default '
                       f"{_join(DEFAULT_PROMPT_SETS)})")
    group.add_argument("--concurrency", default=_join(DEFAULT_CONCURRENCY), metavar="C,...",
                       help="comma-separated requests in flight at once, the client's --max-concurrency "
                       f"(default {_join(DEFAULT_CONCURRENCY)})")
    group.add_argument("--temperature", default=_join(DEFAULT_TEMPERATURES), metavar="T,...",
                       help=f"comma-separated sampling temperatures (default {_join(DEFAULT_TEMPERATURES)}: greedy)")
    group.add_argument("--num-prompts", type=int, default=DEFAULT_NUM_PROMPTS, metavar="N",
                       help=f"prompts per row: the first N of each set (default {DEFAULT_NUM_PROMPTS})")
    group.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS, metavar="M",
                       help=f"tokens generated per prompt, EOS ignored (default {DEFAULT_MAX_NEW_TOKENS})")
    output = parser.add_argument_group("output")
    output.add_argument("--out", default=str(DEFAULT_OUT), metavar="DIR",
                        help=f"folder of bench.json, bench.png, prompt files and logs (default ./{DEFAULT_OUT})")
    output.add_argument("--dry-run", action="store_true", help="check every option, fetch what is "
                        "missing (as serve --print-command does), print both server commands and every "
                        "client command, start nothing")


def add_bench_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the ``bench`` sub-command; its handler is ``args.func`` (returns an exit code)."""
    parser = subparsers.add_parser(
        "bench",
        usage=f"{PROG} [options] [-- SGLANG_FLAG ...]",
        help="how much faster HSD is than no speculation, on this machine, for a pair, at a load",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Start the target without speculation, then the HSD server exactly as `sglang-hsd\n"
        "serve` starts it (or use two servers already running), drive each with SGLang's own\n"
        "serving client (sglang.benchmark.serving) on the same prompts, and print one row per\n"
        "prompt set x concurrency x temperature: plain and HSD output tok/s, their ratio, HSD's\n"
        "accepted tokens per target pass, the median time per output token of each, and the mean\n"
        "draft budget HSD's adaptive controller chose. Writes bench.json (rows, options, commit,\n"
        "command, machine, load) and bench.png to --out. The defaults take about 10 minutes on\n"
        "a 2-core CPU.\n\n"
        "Flags after -- go to the HSD server as in serve; the plain server gets those that do\n"
        "not speculate (--speculative-* and --hsd-* dropped, but --hsd-cpu-linear kept: both\n"
        "servers run the same kernels).",
        epilog="examples:\n"
        "  sglang-hsd bench                                   # the Qwen2.5-Coder pair\n"
        "  sglang-hsd bench --prompt-sets mine.jsonl --concurrency 1,2,8 --temperature 0,1\n"
        "  sglang-hsd bench --target T_DIR --draft D_DIR -- --speculative-num-steps 6\n"
        "  sglang-hsd bench --url-plain http://h:30000 --url-hsd http://h:30001 --tokenizer T_DIR\n"
        "  sglang-hsd bench --dry-run",
    )
    _add_pair_options(parser)
    _add_load_options(parser)
    parser.add_argument("sglang_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    parser.set_defaults(func=run_bench)


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """The ``BenchConfig`` of parsed arguments (comma lists read; ``BenchError`` naming the option)."""
    from pathlib import Path

    passed = list(args.sglang_args)
    return BenchConfig(
        target=args.target, draft=args.draft, url_plain=args.url_plain, url_hsd=args.url_hsd,
        tokenizer=args.tokenizer, device=args.device,
        prompt_sets=parse_name_list(args.prompt_sets, "--prompt-sets"),
        concurrency=parse_int_list(args.concurrency, "--concurrency"),
        temperatures=parse_float_list(args.temperature, "--temperature"),
        num_prompts=args.num_prompts, max_new_tokens=args.max_new_tokens, out=Path(args.out),
        sglang_args=tuple(passed[1:] if passed[:1] == ["--"] else passed),
        startup_timeout=args.startup_timeout, dry_run=args.dry_run)


def command_words(config: BenchConfig) -> list[str]:
    """The command line that reruns ``config``, every option spelled out (what bench.json records)."""
    words = ["sglang-hsd", "bench"]
    for option, value in (("--target", config.target), ("--draft", config.draft),
                          ("--device", config.device), ("--url-plain", config.url_plain),
                          ("--url-hsd", config.url_hsd), ("--tokenizer", config.tokenizer)):
        words += [option, value] if value is not None else []
    words += ["--prompt-sets", _join(config.prompt_sets), "--concurrency", _join(config.concurrency),
              "--temperature", _join(config.temperatures), "--num-prompts", str(config.num_prompts),
              "--max-new-tokens", str(config.max_new_tokens), "--out", str(config.out)]
    if config.startup_timeout != DEFAULT_STARTUP_TIMEOUT:
        words += ["--startup-timeout", f"{config.startup_timeout:g}"]
    return words + (["--", *config.sglang_args] if config.sglang_args else [])


def run_bench(args: argparse.Namespace) -> int:
    """Handler of ``sglang-hsd bench``: 2 for input refused before anything starts, 1 for a failed
    fetch, server or client, 130 on Ctrl-C, else 0."""
    from sglang_hsd.assets.archives import AssetUnavailableError
    from sglang_hsd.assets.fetch import fetch_model
    from sglang_hsd.bench.plan import prepare
    from sglang_hsd.bench.record import recorded_command
    from sglang_hsd.bench.run import dry_run_text, execute

    try:
        config = config_from_args(args)
        plan = prepare(config, lambda name: fetch_model(name, progress=True))
    except ValueError as err:  # BenchError, serve's ServeError, ServerProbeError: each names its option
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    except (AssetUnavailableError, RuntimeError) as err:  # a fetch failed (download, sha256), as in serve
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 1
    if config.dry_run:
        print(dry_run_text(plan))
        return 0
    try:
        return execute(plan, recorded_command(command_words(config)))
    except KeyboardInterrupt:
        print(f"\nCtrl-C: servers stopped; the rows measured so far are in {plan.out / 'bench.json'}",
              file=sys.stderr)
        return 130
