"""Start SGLang on CPU with the HSD plugin (tests, benchmarks, ``sglang-hsd serve``), always
cleaned up. The one home of the CPU server's command line.

The flags are the ones SGLang 0.5.23 needs on a CPU host without sgl_kernel / AMX
(``cpu_host_flags``): ``--device cpu`` with ``SGLANG_USE_CPU_ENGINE=1``; prefill on
``torch_native``; decode (plain servers too), target verify (``--speculative-attention-mode
decode``) and draft on ``intel_amx`` (the only CPU backend SGLang's EAGLE draft path accepts;
``cpu_shims`` supplies its ops in torch, batched over requests); ``--max-total-tokens 8192``
(the CPU memory probe otherwise sizes the KV pool from host RAM); ``--sleep-on-idle``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable

import sglang_hsd
from sglang_hsd.runtime.kernel_paths import PATH_PACKED
from sglang_hsd.sglang_plugin import BOOTSTRAP_DIR
from sglang_hsd.sglang_plugin.cpu.memory import (
    DTYPE_BYTES, available_memory, format_gib, plan_memory, read_checkpoint_size)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# KV pool capacity of every CPU server: SGLang's CPU memory probe would otherwise size the pool
# from host RAM; 8192 tokens hold a few concurrent requests of a CPU server's speed.
CPU_MAX_TOTAL_TOKENS = 8192
# Decoding on the backend the shims serve (``kernel_ops``: one batched attention call per layer,
# ``batched_attention``), plain servers included, so that a plain round and a speculative round
# that drafts nothing pay the same attention.
_CPU_DECODE_ATTENTION = ["--decode-attention-backend", "intel_amx"]
# The CPU draft path's attention: target verify runs as decode steps, on the same backend.
_SPECULATIVE_CPU_ATTENTION = ["--speculative-attention-mode", "decode",
                              "--speculative-draft-attention-backend", "intel_amx"]


def cpu_host_flags(speculative: bool) -> list[str]:
    """The flags every CPU server needs on a host without sgl_kernel / AMX (module docstring);
    ``speculative`` adds the draft path's attention backends."""
    flags = ["--device", "cpu", "--max-total-tokens", str(CPU_MAX_TOTAL_TOKENS),
             "--attention-backend", "torch_native",
             # An idle scheduler otherwise polls at 100% of a core: with several servers up (tests)
             # or a client beside one (benchmarks) that takes the 2 cores' time from the busy one.
             "--sleep-on-idle"]
    return flags + _CPU_DECODE_ATTENTION + (_SPECULATIVE_CPU_ATTENTION if speculative else [])


def cpu_linear_flags(path: str, mem_fraction_static: float = 0.9) -> list[str]:
    """The flags of ``--hsd-cpu-linear path`` (``cpu/linear_path.py``). The packed copies count as
    weights in SGLang's memory probe, which then leaves no room for the KV pool under its default
    ``--mem-fraction-static``; ``mem_fraction_static`` raises it (0.9 suits small models on a host
    with room; ``cpu/memory.py`` sizes it for real ones)."""
    flags = ["--hsd-cpu-linear", path]
    return flags + (["--mem-fraction-static", str(mem_fraction_static)] if path == PATH_PACKED else [])


def sized_memory_flags(model_paths: list[str], dtype: str = "float32", packed: bool = False) -> list[str]:
    """``--mem-fraction-static`` for a server of the checkpoints ``model_paths`` (target first) in
    ``dtype`` on this host now (``cpu/memory.py``: weights, ``packed`` copies and the KV of
    ``CPU_MAX_TOTAL_TOKENS`` from what is free, not SGLang's fixed default share). Raises
    ``RuntimeError`` with what they need against what is free when they do not fit."""
    plan = plan_memory([read_checkpoint_size(p) for p in model_paths], DTYPE_BYTES[dtype], packed,
                       CPU_MAX_TOTAL_TOKENS, available_memory())
    if not plan.fits:
        raise RuntimeError(f"the models do not fit in this host's free memory: {plan.describe()}")
    return ["--mem-fraction-static", str(plan.mem_fraction_static())]


def cpu_server_command(model_path: str, port: int, algorithm: str | None = None,
                       draft_path: str | None = None, num_steps: int | None = None,
                       extra: list[str] | None = None,
                       eagle3_rejection_sampling: bool = True, topk: int | None = None,
                       num_draft_tokens: int | None = None) -> list[str]:
    """The CPU launch command of tests and benchmarks: ``cpu_host_flags`` plus a fixed random seed
    and at most 8 running requests.

    ``eagle3_rejection_sampling``: for ``EAGLE3`` chains, sample drafts and carry q (SGLang
    refuses this for a reduced draft vocabulary); False gives SGLang's argmax drafts.
    ``topk`` / ``num_draft_tokens``: the tree shape (``--speculative-eagle-topk`` /
    ``--speculative-num-draft-tokens``; defaults: a chain of ``num_steps`` + 1 tokens). Tree
    flags of HSD (``--hsd-tree-draft``, ``--hsd-verify-method``) go in ``extra``."""
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", model_path,
           "--host", "127.0.0.1", "--port", str(port), *cpu_host_flags(bool(algorithm)),
           "--max-running-requests", "8", "--random-seed", "0"]
    if algorithm:
        cmd += ["--speculative-algorithm", algorithm, "--speculative-draft-model-path", draft_path]
        is_eagle3 = algorithm.upper() == "EAGLE3"
        if is_eagle3 or topk:
            cmd += ["--speculative-eagle-topk", str(topk or 1)]
        if is_eagle3 and (topk or 1) == 1 and eagle3_rejection_sampling:
            cmd += ["--speculative-use-rejection-sampling"]  # sampled chain drafts with q
        if num_steps:
            cmd += ["--speculative-num-steps", str(num_steps)]
        if num_draft_tokens or (is_eagle3 and num_steps):
            cmd += ["--speculative-num-draft-tokens", str(num_draft_tokens or num_steps + 1)]
    return cmd + list(extra or [])


def draft_model_server_command(model_path: str, port: int, draft_path: str,
                               algorithm: str = "HSD", num_steps: int = 4,
                               extra: list[str] | None = None,
                               draft_kind: str | None = "model", topk: int = 1,
                               num_draft_tokens: int | None = None) -> list[str]:
    """A CPU server drafting with a separate language model ``draft_path`` (same vocabulary as
    ``model_path``, its own KV cache).

    ``algorithm``: ``HSD`` (``--hsd-draft-kind model``: sampled drafts with their q, verified by
    ``verify_chain``, or sampled trees verified by ``verify_tree``) or SGLang's own
    ``STANDALONE`` (argmax drafts; SGLang refuses rejection sampling for it, and on CPU its verify
    takes the target's argmax for every batch, so it serves greedy output only). ``draft_kind``:
    the ``--hsd-draft-kind`` given to HSD (None: detected from the draft's config). ``topk`` /
    ``num_draft_tokens``: a tree of ``num_steps`` levels, k children per node and N nodes (root
    included); the default is a chain of ``num_steps`` + 1 tokens.
    """
    cmd = cpu_server_command(model_path, port, algorithm, draft_path, extra=None)
    tokens = num_draft_tokens or num_steps + 1
    cmd += ["--speculative-num-steps", str(num_steps)]
    if algorithm.upper() == "HSD":
        cmd += ["--hsd-draft-kind", draft_kind] if draft_kind else []
    if topk != 1 or algorithm.upper() != "HSD":
        cmd += ["--speculative-eagle-topk", str(topk), "--speculative-num-draft-tokens", str(tokens)]
    return cmd + list(extra or [])


def server_env_vars(verify_method: str | None = None, cpu: bool = True) -> dict[str, str]:
    """The variables a server needs: this checkout of sglang_hsd first on ``PYTHONPATH`` (then
    the current entries) and, on CPU (``cpu``), the CPU shims' start-up hook (``BOOTSTRAP_DIR``)
    after it and ``SGLANG_USE_CPU_ENGINE=1``; ``verify_method`` as ``SGLANG_HSD_VERIFY_METHOD``."""
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(sglang_hsd.__file__)))
    ordered = [package_root, *([BOOTSTRAP_DIR] if cpu else []), *paths]
    env = {"PYTHONPATH": os.pathsep.join(dict.fromkeys(ordered))}  # first place of each path kept
    if cpu:
        env["SGLANG_USE_CPU_ENGINE"] = "1"
    if verify_method:
        env["SGLANG_HSD_VERIFY_METHOD"] = verify_method
    return env


def server_env(verify_method: str | None = None, cpu: bool = True) -> dict:
    """This process's environment plus ``server_env_vars``."""
    return {**os.environ, **server_env_vars(verify_method, cpu)}


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float,
                 on_poll: Callable[[float], None] | None = None) -> None:
    """Poll ``url/health`` once a second until it answers 200.

    ``on_poll``: called with the seconds waited so far after each failed poll (a progress bar).
    Raises ``RuntimeError`` when the server exits first, ``TimeoutError`` after ``timeout`` s."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode} before becoming healthy")
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as resp:
                if resp.status == 200:
                    return
        except Exception:
            pass
        if on_poll is not None:
            on_poll(time.monotonic() - start)
        time.sleep(1.0)
    raise TimeoutError(f"server at {url} not healthy after {timeout:.0f}s")


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def stop_process_group(proc: subprocess.Popen, grace: float = 20.0) -> None:
    """SIGTERM ``proc``'s process group, wait for ``proc`` and then for the rest of the group
    (SGLang's scheduler and detokenizer outlive the launcher by a moment), SIGKILL whatever is
    left after ``grace`` seconds. Returns once no process of the group remains."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    while _group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _group_alive(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    while _group_alive(proc.pid) and time.monotonic() < deadline + 10:
        time.sleep(0.2)  # killed children are reaped by init


@contextlib.contextmanager
def server_process(cmd: list[str], env: dict, log_path: str):
    """Run ``cmd`` in its own process group with its output in ``log_path``; yield the
    ``Popen``; on exit stop the whole group (``stop_process_group``)."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        yield proc
    finally:
        stop_process_group(proc)


@contextlib.contextmanager
def running_server(cmd: list[str], env: dict, log_path: str, timeout: float = 600.0):
    """Run ``cmd`` in its own process group; yield its base URL; kill the group on exit.

    ``timeout``: seconds to wait for ``/health`` (start-up takes ~1 minute on 2 idle cores and
    several under load)."""
    port = cmd[cmd.index("--port") + 1]
    url = f"http://127.0.0.1:{port}"
    with server_process(cmd, env, log_path) as proc:
        try:
            wait_healthy(url, proc, timeout)
        except (RuntimeError, TimeoutError) as err:
            # The log is often a temporary file gone with the run: its end is the only cause shown.
            # Code -9 is SGLang stopping its process tree after a failed start (the log says why)
            # or the kernel's OOM killer (the log just stops): hence the free memory.
            raise type(err)(f"{err} ({format_gib(available_memory())} free now); the end of its log "
                            f"{log_path}:\n{log_tail(log_path)}") from None
        yield url


def log_tail(log_path, lines: int = 30) -> str:
    """The last ``lines`` lines of the log ``log_path`` (read from its last 16 KiB, so it is cheap
    to poll), each line's progress-bar redraws dropped (only the text after its last carriage
    return kept); "" when it cannot be read."""
    try:
        with open(log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    # Split on newlines only: str.splitlines also splits at the carriage returns of a redraw.
    kept = [line.rsplit("\r", 1)[-1] for line in text.replace("\r\n", "\n").rstrip("\n").split("\n")]
    return "\n".join(kept[-lines:])
