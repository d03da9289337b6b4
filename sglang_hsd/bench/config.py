"""What ``sglang-hsd bench`` was asked for, and every refusal that needs no model, server or network.

``BenchConfig`` holds the parsed options (``parse_int_list`` / ``parse_float_list`` /
``parse_name_list`` read the comma lists of the command line, each error naming its option);
``check_config`` refuses what is wrong whatever the machine: a ``--url-*`` without its partner or
beside ``--target`` / ``--draft`` / ``--device`` / SGLang flags, non-positive sizes, an unknown
prompt set, a missing or malformed JSONL file or one with fewer prompts than ``--num-prompts``,
and no matplotlib for ``bench.png``. Checks that need the models or the servers (vocabularies,
memory, a URL that answers) are ``plan.prepare``'s. Every refusal is a ``BenchError`` whose
message names the option to change.

The defaults (prompt sets humaneval and mtbench, concurrency 1 and 4, T = 0, 4 prompts of 48 new
tokens per row) size the default run on the Qwen2.5-Coder pair to about ten minutes on a 2-core
CPU whose plain decoding runs at 2-4 tok/s; at 3 tok/s:

* server starts: ~100 s plain (the 1.5B target) + ~130 s HSD (README's "ready in 129s") = 230 s;
* decoding: 4 prompts x 48 tokens = 192 per row and server (the client ignores EOS). Plain: 3
  tok/s at c = 1, ~10.5 at c = 4 (README's concurrency-4 rows: 3.5x c = 1); HSD ~2x plain at
  c = 1 and ~1.3x at c = 4 (README: 1.5-2.9x and 1.05-1.7x). Per prompt set 192 x (1/3 + 1/10.5
  + 1/6 + 1/13.7) = 128 s, 257 s for the two;
* the client's warm-up request before each of the 8 runs (min(48, 32) tokens, alone): 4 x 32/3
  + 4 x 32/6 = 64 s; prefills (HumanEval ~150 tokens, MT-Bench ~70): ~40 s;

about 590 s in all; ~8.5 minutes at 4 tok/s, ~13 at 2 tok/s (decoding and warm-ups scale).
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass
from pathlib import Path

from sglang_hsd.bench.prompts import PROMPT_SETS, PromptFileError, read_prompt_jsonl

# The defaults: the module docstring sizes their run to about ten minutes on 2 cores.
DEFAULT_PROMPT_SETS = ("humaneval", "mtbench")
DEFAULT_CONCURRENCY = (1, 4)
DEFAULT_TEMPERATURES = (0.0,)
DEFAULT_NUM_PROMPTS = 4
DEFAULT_MAX_NEW_TOKENS = 48
DEFAULT_OUT = Path("sglang-hsd-bench")
# Seconds to wait for a started server's /health (serve's own limit: a first start on a loaded
# 2-core host takes minutes).
DEFAULT_STARTUP_TIMEOUT = 1800.0


class BenchError(ValueError):
    """Input ``sglang-hsd bench`` refuses before anything starts; the message names the option."""


@dataclass(frozen=True)
class BenchConfig:
    """What ``sglang-hsd bench`` was asked for.

    Fields:
        target: a registered model name or a folder; None: serve's default target (none may be
            given with the ``url_*`` fields).
        draft: a registered model name or a folder; None: the target's default draft.
        url_plain, url_hsd: base URLs of servers already running, without and with HSD (both or
            neither); nothing is started then.
        tokenizer: with the ``url_*`` fields, the folder (or registered model name) the client
            counts tokens with; None: the HSD server's own ``tokenizer_path`` when it is a folder
            on this machine.
        device: ``auto``, ``cpu`` or ``cuda`` as in ``sglang-hsd serve``; None: ``auto``.
        prompt_sets: registered prompt set names (``prompts.PROMPT_SETS``) or paths of JSONL
            files of prompts.
        concurrency: the client's ``--max-concurrency`` of each row.
        temperatures: the sampling temperature of each row.
        num_prompts: prompts per row (prompt set x concurrency x temperature).
        max_new_tokens: tokens generated per prompt (the client ignores EOS, so exactly these).
        out: the folder of ``bench.json``, ``bench.png`` and the logs.
        sglang_args: SGLang flags for the HSD server (after ``--``), as serve takes them; the
            plain server gets those that do not speculate.
        startup_timeout: seconds to wait for each started server to become healthy.
        dry_run: validate, print the commands, start nothing.
    """

    target: str | None = None
    draft: str | None = None
    url_plain: str | None = None
    url_hsd: str | None = None
    tokenizer: str | None = None
    device: str | None = None
    prompt_sets: tuple[str, ...] = DEFAULT_PROMPT_SETS
    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    temperatures: tuple[float, ...] = DEFAULT_TEMPERATURES
    num_prompts: int = DEFAULT_NUM_PROMPTS
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    out: Path = DEFAULT_OUT
    sglang_args: tuple[str, ...] = ()
    startup_timeout: float = DEFAULT_STARTUP_TIMEOUT
    dry_run: bool = False

    @property
    def uses_urls(self) -> bool:
        """Whether the servers are already running (``--url-plain`` / ``--url-hsd``)."""
        return self.url_plain is not None or self.url_hsd is not None


@dataclass(frozen=True)
class PromptSource:
    """One prompt set of a run.

    Fields:
        name: what the table calls it: the registered set's name, or the JSONL file's stem.
        path: the user's JSONL file; None for a registered set.
    """

    name: str
    path: Path | None = None


def _items(text: str, option: str) -> list[str]:
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or any(not item for item in items):
        raise BenchError(f"{option} expects a comma-separated list without empty items, got {text!r}")
    if len(set(items)) != len(items):
        raise BenchError(f"{option} names an item more than once: {text!r}")
    return items


def parse_int_list(text: str, option: str) -> tuple[int, ...]:
    """``"1,4"`` -> ``(1, 4)``; ``BenchError`` naming ``option`` for anything but positive integers."""
    values = []
    for item in _items(text, option):
        try:
            value = int(item)
        except ValueError:
            raise BenchError(f"{option} expects positive integers, got {item!r} in {text!r}") from None
        values.append(value)
    return tuple(values)


def parse_float_list(text: str, option: str) -> tuple[float, ...]:
    """``"0,0.7"`` -> ``(0.0, 0.7)``; ``BenchError`` naming ``option`` for an item that is not a number."""
    values = []
    for item in _items(text, option):
        try:
            values.append(float(item))
        except ValueError:
            raise BenchError(f"{option} expects numbers, got {item!r} in {text!r}") from None
    return tuple(values)


def parse_name_list(text: str, option: str) -> tuple[str, ...]:
    """``"humaneval,my.jsonl"`` -> ``("humaneval", "my.jsonl")`` (checked by ``check_config``)."""
    return tuple(_items(text, option))


def _is_jsonl_path(item: str) -> bool:
    """Whether a ``--prompt-sets`` item means a file: it exists, ends in .jsonl or has a folder."""
    return item.endswith(".jsonl") or "/" in item or Path(item).expanduser().is_file()


def prompt_sources(config: BenchConfig) -> tuple[PromptSource, ...]:
    """Each ``--prompt-sets`` item as a ``PromptSource``; a JSONL file is read and checked here
    (``prompts.read_prompt_jsonl``) and must hold at least ``--num-prompts`` prompts."""
    sources = []
    for item in config.prompt_sets:
        if item in PROMPT_SETS:
            sources.append(PromptSource(item))
            continue
        if not _is_jsonl_path(item):
            raise BenchError(f"--prompt-sets: unknown prompt set {item!r}; expected one of "
                             f"{', '.join(PROMPT_SETS)} or the path of a JSONL file of prompts")
        path = Path(item).expanduser()
        try:
            count = len(read_prompt_jsonl(path, "--prompt-sets"))
        except PromptFileError as err:
            raise BenchError(str(err)) from None
        if count < config.num_prompts:
            raise BenchError(f"--num-prompts {config.num_prompts}: the prompt file {path} holds "
                             f"{count}; lower --num-prompts or add prompts")
        sources.append(PromptSource(path.stem, path.resolve()))
    names = [source.name for source in sources]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise BenchError(f"--prompt-sets: two sets would be called {', '.join(repeated)} in the table; "
                         "rename one file")
    return tuple(sources)


def _check_servers(config: BenchConfig) -> None:
    """The pair's options: URLs both or neither, and alone."""
    if not config.uses_urls:
        if config.tokenizer is not None:
            raise BenchError("--tokenizer is for servers given by --url-plain / --url-hsd; a started "
                             "server's client counts tokens with the target's own tokenizer")
        return
    if config.url_plain is None or config.url_hsd is None:
        given, missing = ("--url-plain", "--url-hsd") if config.url_hsd is None else ("--url-hsd", "--url-plain")
        raise BenchError(f"{given} needs {missing} too: bench compares a server without speculation "
                         "with an HSD server")
    if config.url_plain.rstrip("/") == config.url_hsd.rstrip("/"):
        raise BenchError(f"--url-plain and --url-hsd are the same server ({config.url_hsd}); give the "
                         "server without speculation and the HSD server")
    clashes = [name for name, value in (("--target", config.target), ("--draft", config.draft),
                                        ("--device", config.device)) if value is not None]
    if clashes:
        raise BenchError(f"{' and '.join(clashes)} cannot go with --url-plain / --url-hsd: those servers "
                         "are already running with their own models; drop one or the other")
    if config.sglang_args:
        raise BenchError("SGLang flags after -- configure the HSD server bench starts; with --url-plain / "
                         "--url-hsd nothing is started: drop them")


def _check_sizes(config: BenchConfig) -> None:
    for option, values in (("--concurrency", config.concurrency),
                           ("--num-prompts", (config.num_prompts,)),
                           ("--max-new-tokens", (config.max_new_tokens,))):
        bad = [value for value in values if isinstance(value, bool) or not isinstance(value, int) or value <= 0]
        if bad or not values:
            raise BenchError(f"{option} must be positive integers, got {bad[0] if bad else 'nothing'}")
    bad_t = [t for t in config.temperatures if not math.isfinite(t) or t < 0]
    if bad_t or not config.temperatures:
        raise BenchError(f"--temperature must be numbers >= 0, got {bad_t[0] if bad_t else 'nothing'}")
    if not config.prompt_sets:
        raise BenchError("--prompt-sets names no prompt set")
    if not config.startup_timeout > 0:
        raise BenchError(f"--startup-timeout must be > 0 seconds, got {config.startup_timeout}")


def check_config(config: BenchConfig) -> tuple[PromptSource, ...]:
    """Refuse what is wrong whatever the machine (module docstring); return the prompt sources."""
    _check_servers(config)
    _check_sizes(config)
    sources = prompt_sources(config)
    if importlib.util.find_spec("matplotlib") is None:
        raise BenchError("bench.png needs matplotlib, which this environment lacks: "
                         "pip install 'sglang-hsd[bench]' (or matplotlib)")
    return sources
