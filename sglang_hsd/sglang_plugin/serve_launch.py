"""What ``sglang-hsd serve`` launches, decided before anything loads.

``ServeConfig`` (what the user asked for) -> ``check_config`` (names, devices and flags that are
wrong whatever the machine) -> ``resolve_models`` (registered names fetched, folders read, the
draft's kind detected and its vocabulary compared with the target's) -> ``build_launch`` (the
flags this device needs, the user's SGLang flags merged over them, conflicts refused and, on
CPU, ``--mem-fraction-static`` sized from free memory) -> ``ServeLaunch``, which the ``serve``
command runs or prints. Every refusal is a ``ServeError`` naming the option to change.

The command line itself comes from ``cpu/cpu_server.py`` (``cpu_host_flags``,
``cpu_linear_flags``, ``server_env``), the home of the CPU server's flags.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sglang_hsd.sglang_plugin.config import ALGORITHM_NAME
from sglang_hsd.sglang_plugin.cpu.memory import MemoryPlan, format_gib
from sglang_hsd.sglang_plugin.launch_flags import (
    Flag, LaunchFlagError, duplicated, flag_values, flag_words, merge_flags, parse_flags)

# Registered targets -> their default draft (``--draft`` may name any other).
SERVE_PAIRS: dict[str, str] = {"qwen2.5-coder-1.5b": "qwen2.5-coder-0.5b"}
DEFAULT_TARGET = "qwen2.5-coder-1.5b"
DEVICES = ("auto", "cpu", "cuda")
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 30000
# SGLang flags serve sets from its own options: after ``--`` they are refused with this advice.
OWNED_FLAGS: dict[str, str] = {
    "--model-path": "give serve's --target (before --) instead",
    "--speculative-draft-model-path": "give serve's --draft (before --) instead",
    "--device": "give serve's --device (before --) instead",
    "--speculative-algorithm": f"serve always launches {ALGORITHM_NAME}; use python -m sglang.launch_server "
    "for another algorithm",
}
# Serve's CPU defaults: float32 weights, so every linear layer can run oneDNN's packed kernel.
CPU_DTYPE = "float32"


class ServeError(ValueError):
    """Input ``sglang-hsd serve`` refuses before anything loads; the message names the option."""


@dataclass(frozen=True)
class ServeConfig:
    """What ``sglang-hsd serve`` was asked for.

    Fields:
        target: a registered model name (``sglang_hsd.assets.registry.MODELS``) or a folder.
        draft: a registered model name or a folder (a draft language model or an EAGLE-3 head);
            None: the target's default draft (``SERVE_PAIRS``).
        device: ``auto`` (CUDA when available, else CPU), ``cpu`` or ``cuda``.
        sglang_args: SGLang flags passed through; each replaces the filled-in flag of its name.
    """

    target: str = DEFAULT_TARGET
    draft: str | None = None
    device: str = "auto"
    sglang_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class ServeModels:
    """The model folders to serve and what the draft is (``draft_kind.EAGLE3`` or ``MODEL``)."""

    target: Path
    draft: Path
    draft_kind: str


@dataclass(frozen=True)
class ServeLaunch:
    """One server to start.

    Fields:
        command: ``python -m sglang.launch_server`` and its flags, one per name.
        env: the environment variables the server needs (``server_env_vars``), set on top of
            this process's.
        device: ``cpu`` or ``cuda``.
        url: where clients on this machine reach it, e.g. ``http://127.0.0.1:30000``.
        models: what it serves.
        memory: on CPU, the memory sizing (``cpu/memory.py``); None on GPU.
    """

    command: list[str]
    env: dict[str, str]
    device: str
    url: str
    models: ServeModels
    memory: MemoryPlan | None = None

    def shell_line(self) -> str:
        """The environment and command as one shell command, a flag per line."""
        lines = [f"{name}={shlex.quote(value)}" for name, value in self.env.items()]
        lines.append(shlex.join(self.command[:3]))
        lines += ["    " + shlex.join(flag.words()) for flag in parse_flags(self.command[3:], "command")]
        return " \\\n".join(lines)


def _model_source(value: str, option: str) -> str:
    """``value`` if it names a registered model or an existing folder, else a ``ServeError``."""
    from sglang_hsd.assets.registry import MODELS

    if value in MODELS or Path(value).expanduser().is_dir():
        return value
    raise ServeError(f"{option} {value!r} is neither a registered model nor a folder; registered "
                     f"models: {', '.join(MODELS)}")


def _draft_source(config: ServeConfig) -> str:
    if config.draft is not None:
        return _model_source(config.draft, "--draft")
    if config.target not in SERVE_PAIRS:
        pairs = ", ".join(f"{t} (draft {d})" for t, d in SERVE_PAIRS.items())
        raise ServeError(f"--target {config.target} has no default draft; pass --draft NAME|FOLDER "
                         f"(registered pairs: {pairs})")
    return SERVE_PAIRS[config.target]


def check_config(config: ServeConfig) -> list[Flag]:
    """Refuse what is wrong whatever the machine; return the user's SGLang flags, parsed."""
    if config.device not in DEVICES:
        raise ServeError(f"--device must be one of {', '.join(DEVICES)}, got {config.device!r}")
    _model_source(config.target, "--target")
    _draft_source(config)
    try:
        user = parse_flags(list(config.sglang_args), "SGLang flags after --")
    except LaunchFlagError as err:
        raise ServeError(str(err)) from None
    for flag in user:
        if flag.name in OWNED_FLAGS:
            raise ServeError(f"{flag.name} after -- is set by serve: {OWNED_FLAGS[flag.name]}")
    repeated = duplicated(user)
    if repeated:
        raise ServeError(f"SGLang flags after -- give {', '.join(repeated)} more than once")
    return user


def _local_folder(source: str, fetch: Callable[[str], Path]) -> Path:
    from sglang_hsd.assets.registry import MODELS

    return Path(fetch(source)) if source in MODELS else Path(source).expanduser().resolve()


def resolve_models(config: ServeConfig, fetch: Callable[[str], Path]) -> ServeModels:
    """Model folders for ``config`` (registered names through ``fetch``, e.g. ``fetch_model``
    with progress bars), the draft's kind detected from its config and, for a draft language
    model, its vocabulary checked against the target's (``draft_kind.check_same_vocabulary``)."""
    from sglang_hsd.sglang_plugin.draft_kind import (
        MODEL, DraftKindError, check_same_vocabulary, detect_draft_kind, read_model_config)

    target = _local_folder(_model_source(config.target, "--target"), fetch)
    draft = _local_folder(_draft_source(config), fetch)
    try:
        kind = detect_draft_kind(read_model_config(str(draft), "--draft"))
        if kind == MODEL:
            check_same_vocabulary(str(target), str(draft))
    except DraftKindError as err:  # names SGLang's flags: say which of serve's options they are
        raise ServeError(f"{err} (serve: --target {target}, --draft {draft})") from None
    return ServeModels(target, draft, kind)


def resolve_device(device: str) -> str:
    """``cpu`` or ``cuda`` for ``--device`` (``auto``: CUDA when torch sees a GPU)."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _filled_flags(models: ServeModels, device: str) -> list[Flag]:
    """Every flag serve fills in for ``device`` (``--mem-fraction-static`` comes later)."""
    from sglang_hsd.runtime.kernel_paths import PATH_PACKED
    from sglang_hsd.sglang_plugin.cpu.cpu_server import cpu_host_flags

    words = ["--model-path", str(models.target), "--speculative-algorithm", ALGORITHM_NAME,
             "--speculative-draft-model-path", str(models.draft), "--hsd-draft-kind", models.draft_kind,
             "--host", DEFAULT_HOST, "--port", str(DEFAULT_PORT)]
    if device == "cpu":
        words += [*cpu_host_flags(speculative=True), "--dtype", CPU_DTYPE, "--hsd-cpu-linear", PATH_PACKED]
    return parse_flags(words, "serve's flags")


def _refuse_conflicts(values: dict[str, tuple[str, ...]], device: str) -> None:
    """Combinations SGLang or the plugin would refuse only after loading, refused now."""
    from sglang_hsd.runtime.kernel_paths import PATH_PACKED

    packed = values.get("--hsd-cpu-linear") == (PATH_PACKED,)
    dtype = (values.get("--dtype") or ("auto",))[0]
    if packed and device != "cpu":
        raise ServeError(f"--hsd-cpu-linear {PATH_PACKED} runs on CPU only; drop it on --device {device}")
    if packed and dtype not in ("float32", "float"):
        raise ServeError(f"--dtype {dtype} cannot run with --hsd-cpu-linear {PATH_PACKED} (serve's CPU "
                         "default; oneDNN's packed kernel is float32): add --hsd-cpu-linear mkl after --, "
                         "or leave --dtype to serve")


def _int_flag(values: dict[str, tuple[str, ...]], name: str) -> int:
    try:
        return int(values[name][0])
    except (ValueError, IndexError):
        raise ServeError(f"{name} must be an integer, got {' '.join(values[name]) or 'nothing'}") from None


def _size_cpu_memory(flags: list[Flag], models: ServeModels, available: int) -> MemoryPlan:
    """The ``MemoryPlan`` of the merged CPU ``flags``; refuses a host that cannot hold it, or a
    user's ``--mem-fraction-static`` that leaves the KV cache no room."""
    from sglang_hsd.runtime.kernel_paths import PATH_PACKED
    from sglang_hsd.sglang_plugin.cpu.memory import DTYPE_BYTES, plan_memory, read_checkpoint_size

    values = flag_values(flags)
    dtype = (values.get("--dtype") or ("auto",))[0]
    if dtype not in DTYPE_BYTES:
        raise ServeError(f"--dtype {dtype}: serve sizes memory for {', '.join(DTYPE_BYTES)}")
    try:
        sizes = [read_checkpoint_size(models.target), read_checkpoint_size(models.draft)]
    except FileNotFoundError as err:
        raise ServeError(f"{err}: serve reads the models' sizes from safetensors checkpoints to size "
                         "memory on CPU") from None
    plan = plan_memory(sizes, DTYPE_BYTES[dtype], values.get("--hsd-cpu-linear") == (PATH_PACKED,),
                       _int_flag(values, "--max-total-tokens"), available)
    if "--mem-fraction-static" in values:
        fraction = values["--mem-fraction-static"][0]
        try:
            room = plan.kv_room(float(fraction))
        except ValueError:
            raise ServeError(f"--mem-fraction-static must be a number, got {fraction!r}") from None
        if room <= 0:
            raise ServeError(
                f"--mem-fraction-static {fraction} leaves the KV cache no memory: SGLang keeps that share of "
                f"the ~{format_gib(plan.available - plan.baseline)} it will find free for weights and KV, and the "
                f"weights{' and packed copies' if plan.packed_copies else ''} take "
                f"{format_gib(plan.weights + plan.packed_copies)}; drop the flag and serve sizes it from free memory")
    elif not plan.fits:
        hint = " or add --hsd-cpu-linear mkl after -- (no packed copies; slower verification)" \
            if plan.packed_copies else ""
        raise ServeError(f"the models do not fit in this machine's free memory: {plan.describe()}; "
                         f"free memory, serve a smaller pair (--target, --draft){hint}")
    return plan


def build_launch(config: ServeConfig, models: ServeModels, device: str,
                 available: Callable[[], int] | None = None) -> ServeLaunch:
    """The ``ServeLaunch`` for ``config`` on ``device`` (``resolve_device``).

    ``available``: free host memory in bytes (default ``cpu.memory.available_memory``), read on
    CPU only. Raises ``ServeError`` for conflicting flags or a host without room.
    """
    from sglang_hsd.sglang_plugin.cpu.cpu_server import server_env_vars
    from sglang_hsd.sglang_plugin.cpu.memory import available_memory

    user = check_config(config)
    flags = merge_flags(_filled_flags(models, device), user)
    values = flag_values(flags)
    _refuse_conflicts(values, device)
    memory = None
    if device == "cpu":
        memory = _size_cpu_memory(flags, models, (available or available_memory)())
        if "--mem-fraction-static" not in values:
            flags.append(Flag("--mem-fraction-static", (str(memory.mem_fraction_static()),)))
    env = server_env_vars(cpu=device == "cpu")
    host = values["--host"][0]
    local = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    url = f"http://{local}:{_int_flag(values, '--port')}"
    command = [sys.executable, "-m", "sglang.launch_server", *flag_words(flags)]
    return ServeLaunch(command, env, device, url, models, memory)
