"""``sglang-hsd serve``: start SGLang with ``--speculative-algorithm HSD`` for a model pair.

    sglang-hsd serve                                  # the Qwen2.5-Coder pair on this machine
    sglang-hsd serve -- --port 30001 --speculative-num-steps 3
    sglang-hsd serve --device cuda --print-command    # the launch line for a GPU host

Flags after ``--`` go to SGLang unchanged and replace the ones serve fills in
(``serve_launch.py`` decides the command and refuses bad input before anything loads). The server
runs in its own process group; serve waits for ``/health``, prints the URL, a chat request and a
benchmark command, and stops the whole group on Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import subprocess

    from sglang_hsd.sglang_plugin.serve_launch import ServeLaunch

# The request printed as an example and sent by the server test: greedy, short.
CHAT_EXAMPLE = {
    "model": "default",
    "messages": [{"role": "user", "content": "Write a Python function that checks whether a number is prime."}],
    "max_tokens": 64,
    "temperature": 0,
}
# SGLang's serving client against the server: random token prompts (no dataset download); on CPU
# few and short, so the run takes minutes, not hours.
BENCH_SIZES = {"cpu": {"--num-prompts": 8, "--random-input-len": 128, "--random-output-len": 64,
                       "--max-concurrency": 1},
               "cuda": {"--num-prompts": 200, "--random-input-len": 1024, "--random-output-len": 256,
                        "--max-concurrency": 16}}
STARTUP_TIMEOUT = 1800.0


def add_serve_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the ``serve`` sub-command; its handler is ``args.func`` (returns an exit code)."""
    from sglang_hsd.sglang_plugin.serve_launch import DEFAULT_TARGET, DEVICES, SERVE_PAIRS

    pairs = ", ".join(f"{target} (draft {draft})" for target, draft in SERVE_PAIRS.items())
    parser = subparsers.add_parser(
        "serve",
        usage="sglang-hsd serve [--target T] [--draft D] [--device DEV] [--print-command] [-- SGLANG_FLAG ...]",
        help="start an SGLang server with HSD speculative decoding for a model pair",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Start `python -m sglang.launch_server --speculative-algorithm HSD` for a target\n"
        "and a draft (registered models are fetched on first use, with progress bars). On CPU it\n"
        "fills in every flag the machine needs, --mem-fraction-static sized from free memory\n"
        "included; on CUDA none of them. Waits until the server is healthy, prints its URL, an\n"
        "example chat request and a benchmark command, and serves until Ctrl-C.\n\n"
        "Flags after -- go to SGLang unchanged and replace the ones serve fills in.",
        epilog="examples:\n"
        "  sglang-hsd serve                                   # the Qwen2.5-Coder pair\n"
        "  sglang-hsd serve -- --port 30001 --speculative-num-steps 3\n"
        "  sglang-hsd serve --device cuda --print-command     # the launch line for a GPU host\n"
        "  sglang-hsd serve --target TARGET_FOLDER --draft DRAFT_FOLDER",
    )
    parser.add_argument("--target", default=DEFAULT_TARGET,
                        help=f"registered model name or model folder (default {DEFAULT_TARGET})")
    parser.add_argument("--draft", default=None,
                        help="registered model name or folder: a draft language model of the target's "
                        f"family or an EAGLE-3 head (default: the target's pair: {pairs})")
    parser.add_argument("--device", default="auto", choices=DEVICES,
                        help="auto (default): cuda when torch sees a GPU, else cpu")
    parser.add_argument("--print-command", action="store_true",
                        help="print the environment and launch command instead of running it, then exit")
    parser.add_argument("--log", default=None, help="server log file (default: sglang-hsd-serve-PORT.log "
                        "in the temporary folder)")
    parser.add_argument("--startup-timeout", type=float, default=STARTUP_TIMEOUT,
                        help=f"seconds to wait for the server to become healthy (default {STARTUP_TIMEOUT:g})")
    parser.add_argument("sglang_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    parser.set_defaults(func=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    """Handler of ``sglang-hsd serve``: 0 after Ctrl-C or ``--print-command``, 1 when the server
    fails, 2 for input refused before anything loads."""
    from sglang_hsd.assets.archives import AssetUnavailableError
    from sglang_hsd.assets.fetch import fetch_model
    from sglang_hsd.sglang_plugin.serve_launch import (
        ServeConfig, ServeError, build_launch, check_config, resolve_device, resolve_models)

    passed = list(args.sglang_args)
    config = ServeConfig(args.target, args.draft, args.device,
                         tuple(passed[1:] if passed[:1] == ["--"] else passed))
    try:
        check_config(config)  # before any fetch
        models = resolve_models(config, lambda name: fetch_model(name, progress=True))
        launch = build_launch(config, models, resolve_device(config.device))
    except ServeError as err:
        print(f"sglang-hsd serve: error: {err}", file=sys.stderr)
        return 2
    except (AssetUnavailableError, RuntimeError) as err:  # a fetch failed (download, sha256), as in fetch
        print(f"sglang-hsd serve: error: {err}", file=sys.stderr)
        return 1
    if args.print_command:
        print(launch.shell_line())
        return 0
    port = launch.url.rsplit(":", 1)[1]
    log_path = Path(args.log or Path(tempfile.gettempdir()) / f"sglang-hsd-serve-{port}.log")
    return serve_until_interrupted(launch, log_path, args.startup_timeout)


def _wait_with_progress(launch: ServeLaunch, proc: subprocess.Popen, log_path: Path, timeout: float) -> None:
    """``wait_healthy`` with a bar showing the time waited and the server log's last line."""
    from tqdm.auto import tqdm

    from sglang_hsd.sglang_plugin.cpu.cpu_server import log_tail, wait_healthy

    with tqdm(desc="starting the server", bar_format="{desc}: {elapsed} {postfix}", file=sys.stderr) as bar:
        def on_poll(waited: float) -> None:
            bar.set_postfix_str(log_tail(log_path, 1)[-70:], refresh=False)
            bar.update(int(waited) - bar.n)

        wait_healthy(launch.url, proc, timeout, on_poll)


def serve_until_interrupted(launch: ServeLaunch, log_path: Path, timeout: float) -> int:
    """Start ``launch``, wait until healthy, print how to use it, serve until
    Ctrl-C; the server's process group is stopped on every way out."""
    import os

    from sglang_hsd.sglang_plugin.cpu.cpu_server import log_tail, server_process

    print(f"starting SGLang on {launch.device}, log {log_path}", flush=True)
    start = time.monotonic()
    with server_process(launch.command, {**os.environ, **launch.env}, str(log_path)) as proc:
        try:
            _wait_with_progress(launch, proc, log_path, timeout)
            print(ready_message(launch, time.monotonic() - start, proc.pid, log_path), flush=True)
            code = proc.wait()
        except (RuntimeError, TimeoutError) as err:
            print(f"sglang-hsd serve: error: {err}; the log ends with:\n{log_tail(log_path, 30)}",
                  file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("\nCtrl-C: stopping the server", flush=True)
        else:
            print(f"sglang-hsd serve: error: the server exited with code {code}; the log ends with:\n"
                  f"{log_tail(log_path, 30)}", file=sys.stderr)
            return 1
    print("server stopped", flush=True)
    return 0


def chat_curl(url: str) -> str:
    """A ``curl`` of the OpenAI-compatible chat endpoint with ``CHAT_EXAMPLE``."""
    return (f"curl {url}/v1/chat/completions -H 'Content-Type: application/json' \\\n"
            f"    -d {shlex.quote(json.dumps(CHAT_EXAMPLE))}")


def bench_command(url: str, device: str) -> str:
    """SGLang's serving benchmark client against ``url`` (``BENCH_SIZES`` for ``device``)."""
    sizes = " ".join(f"{flag} {value}" for flag, value in BENCH_SIZES[device].items())
    return (f"{shlex.quote(sys.executable)} -m sglang.benchmark.serving --backend sglang --base-url {url} \\\n"
            f"    --dataset-name random-ids --random-range-ratio 1.0 {sizes}")


def ready_message(launch: ServeLaunch, seconds: float, pid: int, log_path: Path) -> str:
    """What serve prints once the server answers ``/health``."""
    import importlib.util

    models = launch.models
    lines = [
        f"HSD server ready in {seconds:.0f}s: {launch.url}",
        f"  target {models.target}, draft {models.draft} ({models.draft_kind}), {launch.device}; "
        f"server pid {pid}, log {log_path}",
        "", "Chat (OpenAI-compatible API):", "  " + chat_curl(launch.url),
        "", "Benchmark it with SGLang's serving client (in another shell):",
        "  " + bench_command(launch.url, launch.device),
    ]
    if importlib.util.find_spec("datasets") is None:
        lines.append("  (SGLang's benchmark package imports `datasets`, which this environment lacks: "
                     "pip install datasets first)")
    return "\n".join(lines + ["", "Ctrl-C stops the server."])
