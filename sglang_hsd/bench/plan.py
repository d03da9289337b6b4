"""What ``sglang-hsd bench`` will run, decided (and refused) before any server starts.

``prepare(config, fetch)`` -> ``BenchPlan``: the two servers (started here: the HSD server exactly
as ``sglang-hsd serve`` builds it, ``serve_launch.build_launch``, and the plain server as the same
launch without its speculative flags, ``plain_launch``; or already running at ``--url-plain`` /
``--url-hsd``, probed), the tokenizer the client counts with, the prompts of every set and the
rows (prompt set x concurrency x temperature). Every input error surfaces here, before anything
starts: ``config.check_config``'s, serve's own (``ServeError``: names, flags after ``--``, the
draft's vocabulary against the target's, memory), an unreachable URL (``ServerProbeError``) and a
prompt set too short for ``--num-prompts`` (``BenchError``).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sglang_hsd.bench.client import ClientSpec
from sglang_hsd.bench.config import BenchConfig, BenchError, PromptSource, check_config
from sglang_hsd.bench.prompts import read_prompt_jsonl
from sglang_hsd.bench.server_info import probe_server
from sglang_hsd.sglang_plugin.config import ALGORITHM_NAME
from sglang_hsd.sglang_plugin.cpu.linear_path import CPU_LINEAR_FLAG, PADDING_FLAG
from sglang_hsd.sglang_plugin.launch_flags import flag_words, parse_flags
from sglang_hsd.sglang_plugin.serve_launch import (
    DEFAULT_TARGET, ServeConfig, ServeLaunch, build_launch, check_config as check_serve_config,
    resolve_device, resolve_models)

# The client's ``--sharegpt-context-len``: it silently skips prompts longer than this minus the
# output length, so it is set past any server's context: a prompt too long for the server fails as
# a request the row counts (``completed`` below ``num_prompts``) instead of vanishing unseen.
CLIENT_CONTEXT_LEN = 1 << 20
# The client's time limit: 600 s plus 2 s per token asked for (0.5 tok/s, far below any server's
# speed), so that only a hung server runs out of it.
CLIENT_BASE_TIMEOUT, CLIENT_SECONDS_PER_TOKEN = 600.0, 2.0
# HSD flags a plain server keeps: the CPU linear kernel applies to every model a server loads,
# with or without speculation, so both servers run the same kernels (``cpu/linear_path.py``).
PLAIN_HSD_FLAGS = (CPU_LINEAR_FLAG, PADDING_FLAG)


@dataclass(frozen=True)
class BenchServer:
    """One of the two servers measured.

    Fields:
        tag: ``plain`` (no speculation) or ``hsd``.
        url: its base URL.
        launch: how bench starts it; None for a server already running (``--url-*``).
    """

    tag: str
    url: str
    launch: ServeLaunch | None = None


@dataclass(frozen=True)
class PromptFile:
    """The prompts of one set as the client reads them: ``texts`` written to ``path`` (ShareGPT
    JSON, ``prompts.write_sharegpt_file``) when the run starts."""

    name: str
    path: Path
    texts: tuple[str, ...]


@dataclass(frozen=True)
class BenchRow:
    """One row of the table: a prompt set at one concurrency and temperature."""

    prompt_set: str
    concurrency: int
    temperature: float

    @property
    def label(self) -> str:
        return f"{self.prompt_set} c={self.concurrency} T={self.temperature:g}"

    @property
    def tag(self) -> str:
        """The row's part of its client files' names."""
        return f"{self.prompt_set}_c{self.concurrency}_t{self.temperature:g}"


@dataclass(frozen=True)
class BenchPlan:
    """Everything a run needs, checked.

    Fields:
        config: the options.
        servers: the plain server, then the HSD server.
        tokenizer: the folder the client counts tokens with (``--model`` / ``--tokenizer``).
        prompts: one ``PromptFile`` per prompt set, in ``--prompt-sets`` order.
        rows: prompt set x concurrency x temperature, in that nesting.
        out: the output folder, absolute.
        notes: warnings to print before the run (e.g. two URL servers of different models).
    """

    config: BenchConfig
    servers: tuple[BenchServer, BenchServer]
    tokenizer: Path
    prompts: tuple[PromptFile, ...]
    rows: tuple[BenchRow, ...]
    out: Path
    notes: tuple[str, ...] = ()

    def prompt_file(self, row: BenchRow) -> PromptFile:
        return next(p for p in self.prompts if p.name == row.prompt_set)

    def client_spec(self, row: BenchRow) -> ClientSpec:
        """The client run of ``row`` (the same against both servers, seed included, so both see
        the prompts in the same order)."""
        config = self.config
        return ClientSpec(self.tokenizer, self.prompt_file(row).path, config.num_prompts,
                          config.max_new_tokens, row.temperature, row.concurrency,
                          context_len=CLIENT_CONTEXT_LEN)

    @property
    def client_timeout(self) -> float:
        return CLIENT_BASE_TIMEOUT + CLIENT_SECONDS_PER_TOKEN * self.config.num_prompts * self.config.max_new_tokens


def plain_launch(launch: ServeLaunch) -> ServeLaunch:
    """``launch`` (the HSD server) without speculation: every ``--speculative-*`` flag and every
    ``--hsd-*`` flag but ``PLAIN_HSD_FLAGS`` dropped; the same target, host, port, dtype, memory
    share, environment and user flags otherwise, so the two servers differ only in speculating."""
    flags = parse_flags(launch.command[3:], "the HSD server's command")
    kept = [flag for flag in flags if not flag.name.startswith("--speculative-")
            and (not flag.name.startswith("--hsd-") or flag.name in PLAIN_HSD_FLAGS)]
    return dataclasses.replace(launch, command=[*launch.command[:3], *flag_words(kept)])


def serve_config(config: BenchConfig, port: int) -> ServeConfig:
    """The ``ServeConfig`` of the HSD server: serve's defaults for what bench was not given, and
    ``--port port`` unless the flags after ``--`` name one (both servers run one after the other).
    Raises serve's ``ServeError`` for flags serve refuses."""
    serve = ServeConfig(config.target or DEFAULT_TARGET, config.draft, config.device or "auto",
                        tuple(config.sglang_args))
    user = check_serve_config(serve)  # names and flags, before any fetch
    if any(flag.name == "--port" for flag in user):
        return serve
    return dataclasses.replace(serve, sglang_args=("--port", str(port), *serve.sglang_args))


def _started_servers(config: BenchConfig, fetch: Callable[[str], Path]) -> tuple[tuple[BenchServer, BenchServer], Path]:
    """The two servers bench starts, and the target folder (the client's tokenizer)."""
    from sglang_hsd.sglang_plugin.cpu.cpu_server import free_port

    serve = serve_config(config, free_port())
    models = resolve_models(serve, fetch)
    hsd = build_launch(serve, models, resolve_device(serve.device))
    plain = plain_launch(hsd)
    return (BenchServer("plain", plain.url, plain), BenchServer("hsd", hsd.url, hsd)), models.target


def _url_tokenizer(config: BenchConfig, hsd_info: dict, fetch: Callable[[str], Path]) -> Path:
    """``--tokenizer`` (a registered name, fetched, or a folder), else the HSD server's own
    ``tokenizer_path`` when that folder exists here."""
    from sglang_hsd.assets.registry import MODELS

    if config.tokenizer is not None:
        if config.tokenizer in MODELS:
            return Path(fetch(config.tokenizer))
        path = Path(config.tokenizer).expanduser()
        if not path.is_dir():
            raise BenchError(f"--tokenizer {config.tokenizer!r} is neither a registered model nor a folder")
        return path.resolve()
    reported = hsd_info.get("tokenizer_path") or hsd_info.get("model_path")
    if reported and Path(reported).is_dir():
        return Path(reported)
    raise BenchError(f"--tokenizer: the HSD server's tokenizer {reported} is not a folder on this machine "
                     "(the client counts tokens with it); pass --tokenizer FOLDER with the target's "
                     "tokenizer files, or a registered model name")


def _url_servers(config: BenchConfig, fetch: Callable[[str], Path]) -> tuple[tuple[BenchServer, BenchServer], Path, tuple[str, ...]]:
    """The two running servers, probed and checked: the plain one must not speculate, the HSD one
    must run HSD. Returns them, the client's tokenizer and the notes to print."""
    plain_info = probe_server(config.url_plain, "--url-plain")
    hsd_info = probe_server(config.url_hsd, "--url-hsd")
    algorithm = hsd_info.get("speculative_algorithm")
    if str(algorithm).upper() != ALGORITHM_NAME:
        raise BenchError(f"--url-hsd {config.url_hsd}: that server runs speculative_algorithm {algorithm}, "
                         f"not {ALGORITHM_NAME}; start it with `sglang-hsd serve`")
    if plain_info.get("speculative_algorithm"):
        raise BenchError(f"--url-plain {config.url_plain}: that server speculates "
                         f"({plain_info['speculative_algorithm']}); give one started without "
                         "--speculative-algorithm")
    notes = []
    if plain_info.get("model_path") != hsd_info.get("model_path"):
        notes.append(f"the servers report different models: --url-plain {plain_info.get('model_path')}, "
                     f"--url-hsd {hsd_info.get('model_path')}; the ratio compares them as they are")
    servers = (BenchServer("plain", config.url_plain.rstrip("/")), BenchServer("hsd", config.url_hsd.rstrip("/")))
    return servers, _url_tokenizer(config, hsd_info, fetch), tuple(notes)


def _prompt_texts(source: PromptSource, count: int) -> tuple[str, ...]:
    """The first ``count`` prompts of ``source`` (a registered set is fetched on first use)."""
    if source.path is not None:
        return tuple(read_prompt_jsonl(source.path)[:count])
    from sglang_hsd.assets.prompts import fetch_prompt_file
    from sglang_hsd.runtime.loading import prompt_set_texts

    fetch_prompt_file(source.name, progress=True)
    texts = tuple(t for t in prompt_set_texts(source.name, count) if t.strip())
    if len(texts) < count:
        raise BenchError(f"--num-prompts {count}: the prompt set {source.name} holds {len(texts)}")
    return texts


def prepare(config: BenchConfig, fetch: Callable[[str], Path]) -> BenchPlan:
    """Check ``config`` and decide the run (module docstring); ``fetch``: a registered model name
    -> its folder (``assets.fetch.fetch_model``, with progress bars). Nothing is started."""
    sources = check_config(config)
    notes: tuple[str, ...] = ()
    if config.uses_urls:
        servers, tokenizer, notes = _url_servers(config, fetch)
    else:
        servers, tokenizer = _started_servers(config, fetch)
    out = Path(config.out).expanduser().resolve()
    prompts = tuple(PromptFile(s.name, out / f"prompts_{s.name}.json", _prompt_texts(s, config.num_prompts))
                    for s in sources)
    rows = tuple(BenchRow(s.name, c, t) for s, c, t in
                 itertools.product(sources, config.concurrency, config.temperatures))
    return BenchPlan(config, servers, tokenizer, prompts, rows, out, notes)
