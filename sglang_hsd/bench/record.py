"""The record of a measured run: which code, which command, which machine, how loaded, when.

On a shared machine a timing means little without the load beside it, and machines of one name
differ in the vector units that decide which CPU kernels win (AVX2-only, or AVX-512 with bf16 dot
products), so every result file carries a :class:`RunRecord`: the git commit of the code, the
exact command line, the load average at the start and at the end, the CPU count and kind, the
torch version and the times. ``sglang-hsd bench`` writes it into ``bench.json``; the scripts of
``benchmarks/`` (through ``benchmarks/common.py``) into their JSON and Markdown results and PNG
plots (:func:`png_metadata`).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

# The checkout holding this package (``sglang_hsd/..``): where its git commit is read and what
# recorded script paths are shown relative to. An installed copy outside a checkout has no commit.
PACKAGE_ROOT = Path(__file__).resolve().parents[2]
# Environment variables that change what a benchmark measures; recorded in its command line.
RECORDED_ENV = ("PYTHONPATH", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "TRITON_INTERPRET",
                "SGLANG_HSD_CACHE", "SGLANG_HSD_OFFLINE")
# /proc/cpuinfo flags that change which CPU kernels are fastest (half-precision and int8 dot products).
CPU_FLAGS = ("avx512_bf16", "amx_bf16", "avx512_fp16", "amx_int8", "avx512_vnni", "avx_vnni")
# The vector extensions a record lists, narrowest first (x86 names of /proc/cpuinfo; Arm's
# ``asimd``, ``sve`` and ``sve2`` too).
VECTOR_EXTENSIONS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
                     "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16",
                     "amx_int8", "asimd", "sve", "sve2")


@dataclass
class RunRecord:
    """The run that produced a result file.

    Fields:
        commit: ``git rev-parse`` of the checkout, with " + uncommitted changes" when files outside
            ``benchmarks/results`` differ from it; "unknown" outside a git checkout.
        command: the command line, with the recorded environment variables in front.
        load_average_start, load_average_end: 1, 5 and 15 minute load averages ("1.02 0.87 0.80").
        cpu_count: ``os.cpu_count()``.
        cpu: :func:`cpu_description`, e.g. "AMD EPYC 9B14; torch CPU capability AVX512; avx512_bf16".
        torch_version: the installed torch distribution's version.
        started, finished: UTC times, ISO 8601.
    """

    commit: str
    command: str
    load_average_start: str
    load_average_end: str
    cpu_count: int | None
    torch_version: str
    started: str
    finished: str
    cpu: str = ""

    def finish(self) -> RunRecord:
        """Stamp the end load average and time (again on every call: a script that writes its
        results after each step keeps the last write's values)."""
        self.load_average_end = load_average()
        self.finished = _utc_now()
        return self

    def as_dict(self) -> dict:
        return asdict(self)

    def markdown(self) -> str:
        """The ``## Run`` block that ends a Markdown result file."""
        return "\n".join([
            "## Run", "",
            f"- commit: `{self.commit}`",
            f"- command: `{self.command}`",
            f"- machine load (1/5/15 min average): {self.load_average_start} at start, "
            f"{self.load_average_end} at end; {self.cpu_count} CPUs",
            f"- CPU: {self.cpu or 'not recorded'}",
            f"- torch {self.torch_version}; started {self.started}, finished {self.finished}",
            "",
        ])


def start_run(script: str, argv: list[str] | None = None, command: str | None = None) -> RunRecord:
    """Record the start of a run.

    Args:
        script: the script's ``__file__``.
        argv: the arguments its ``main`` was given; None = this process's own command line.
        command: the command as it should be recorded (``recorded_command``), instead of one
            made from ``script`` and ``argv`` (a subcommand run in-process).
    """
    started = _utc_now()
    return RunRecord(
        commit=git_commit(), command=command or command_line(script, argv),
        load_average_start=load_average(), load_average_end="", cpu_count=os.cpu_count(),
        torch_version=_torch_version(), started=started, finished="", cpu=cpu_description(),
    )


def git_commit(repo: Path = PACKAGE_ROOT) -> str:
    """Short commit hash of ``repo``'s checkout; "unknown" outside a git checkout."""
    try:
        commit = _git(repo, "rev-parse", "--short=12", "HEAD")
        dirty = _git(repo, "status", "--porcelain", "--untracked-files=no", "--", ".",
                     ":(exclude)benchmarks/results")
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired):
        return "unknown"
    return commit + (" + uncommitted changes" if dirty else "")


def recorded_command(words: list[str]) -> str:
    """``words`` as one shell line, the recorded environment variables (``RECORDED_ENV``) in front."""
    env = [f"{name}={shlex.quote(os.environ[name])}" for name in RECORDED_ENV if name in os.environ]
    return " ".join([*env, shlex.join(words)])


def command_line(script: str, argv: list[str] | None = None) -> str:
    """The command that ran ``script``: recorded environment variables, then the interpreter's own
    argument vector, or ``python <script> <argv>`` when ``main`` was called with ``argv``."""
    if argv is None:
        return recorded_command(list(getattr(sys, "orig_argv", [sys.executable, *sys.argv])))
    path = Path(script).resolve()
    shown = path.relative_to(PACKAGE_ROOT) if path.is_relative_to(PACKAGE_ROOT) else path
    return recorded_command(["python", str(shown), *argv])


def _cpuinfo_fields(cpuinfo: str | None) -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (``cpuinfo``: its text; None: read it,
    empty where it does not exist)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    fields = dict(line.split(":", 1) for line in cpuinfo.splitlines()[:40] if ":" in line)
    return {k.strip(): v.strip() for k, v in fields.items()}


def cpu_description(cpuinfo: str | None = None) -> str:
    """The CPU's model name, torch's CPU capability (the widest vector ISA its kernels use: "AVX2",
    "AVX512", ...) and which of :data:`CPU_FLAGS` it has; ``cpuinfo``: the text of /proc/cpuinfo
    (None: read it; empty where it does not exist)."""
    fields = _cpuinfo_fields(cpuinfo)
    flags = set(fields.get("flags", "").split())
    try:
        import torch

        capability = torch.backends.cpu.get_cpu_capability()
    except (ImportError, AttributeError):
        capability = "unknown"
    has = [flag for flag in CPU_FLAGS if flag in flags]
    return "; ".join([fields.get("model name", "unknown model"), f"torch CPU capability {capability}",
                      ", ".join(has) if has else "none of " + ", ".join(CPU_FLAGS)])


def vector_extensions(cpuinfo: str | None = None) -> list[str]:
    """Which of :data:`VECTOR_EXTENSIONS` the CPU has, in that order (x86 ``flags`` or Arm
    ``Features`` of /proc/cpuinfo; ``cpuinfo`` as in :func:`cpu_description`)."""
    fields = _cpuinfo_fields(cpuinfo)
    flags = set(fields.get("flags", fields.get("Features", "")).split())
    return [name for name in VECTOR_EXTENSIONS if name in flags]


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, e.g. "1.02 0.87 0.80" ("n/a" where unsupported)."""
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def distribution_version(name: str) -> str:
    """The installed version of distribution ``name``; "not installed" without it."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def png_metadata(run: dict | None) -> dict[str, str]:
    """PNG text entries for a plot of a run (``RunRecord.as_dict()`` or a result's ``"run"``)."""
    if not run:
        return {}
    # PNG text chunks are Latin-1: keep them ASCII (json.dumps escapes the rest).
    return {"Source": run.get("command", "").encode("ascii", "backslashreplace").decode(),
            "Comment": json.dumps(run)}


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          check=True, timeout=30).stdout.strip()


def _torch_version() -> str:
    return distribution_version("torch")


def _utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
