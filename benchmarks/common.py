"""What every benchmark script shares: the run record, result files, prompts and arguments.

Scripts run from the repository root as ``PYTHONPATH=. python benchmarks/<script>.py ...`` and
import this module as ``benchmarks.common`` (no ``sys.path`` changes).

Every result file says which run produced it (:class:`RunRecord`): the git commit of the code, the
exact command line, the machine's load average at the start and at the end (on a shared machine a
timing means little without it), the CPU count and kind (model name and the vector units that decide
which kernels win: machines of one name differ, AVX2-only or AVX-512 with bf16 dot products), the
torch version and the times. JSON results carry
it under the key ``"run"``, Markdown results end with a ``## Run`` block (:func:`write_results`),
and plots carry it as PNG text (:func:`png_metadata`).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

BENCHMARKS_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCHMARKS_DIR.parent
RESULTS_DIR = BENCHMARKS_DIR / "results"
# Environment variables that change what a benchmark measures; recorded in its command line.
RECORDED_ENV = ("PYTHONPATH", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "TRITON_INTERPRET",
                "SGLANG_HSD_CACHE", "SGLANG_HSD_OFFLINE")


@dataclass
class RunRecord:
    """The run that produced a result file.

    Fields:
        commit: ``git rev-parse`` of the checkout, with " + uncommitted changes" when files outside
            ``benchmarks/results`` differ from it.
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


def start_run(script: str, argv: list[str] | None = None) -> RunRecord:
    """Record the start of a benchmark run.

    Args:
        script: the script's ``__file__``.
        argv: the arguments its ``main`` was given; None = this process's own command line.
    """
    started = _utc_now()
    return RunRecord(
        commit=git_commit(), command=command_line(script, argv), load_average_start=load_average(),
        load_average_end="", cpu_count=os.cpu_count(), torch_version=_torch_version(),
        started=started, finished="", cpu=cpu_description(),
    )


def git_commit(repo: Path = REPO_ROOT) -> str:
    """Short commit hash of ``repo``'s checkout; "unknown" outside a git checkout."""
    try:
        commit = _git(repo, "rev-parse", "--short=12", "HEAD")
        dirty = _git(repo, "status", "--porcelain", "--untracked-files=no", "--", ".",
                     ":(exclude)benchmarks/results")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + (" + uncommitted changes" if dirty else "")


def command_line(script: str, argv: list[str] | None = None) -> str:
    """The command that ran ``script``: recorded environment variables, then the interpreter's own
    argument vector, or ``python <script> <argv>`` when ``main`` was called with ``argv``."""
    env = [f"{name}={shlex.quote(os.environ[name])}" for name in RECORDED_ENV if name in os.environ]
    if argv is None:
        words = list(getattr(sys, "orig_argv", [sys.executable, *sys.argv]))
    else:
        path = Path(script).resolve()
        shown = path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path
        words = ["python", str(shown), *argv]
    return " ".join([*env, shlex.join(words)])


# /proc/cpuinfo flags that change which CPU kernels are fastest (half-precision and int8 dot products).
CPU_FLAGS = ("avx512_bf16", "amx_bf16", "avx512_fp16", "amx_int8", "avx512_vnni", "avx_vnni")


def cpu_description(cpuinfo: str | None = None) -> str:
    """The CPU's model name, torch's CPU capability (the widest vector ISA its kernels use: "AVX2",
    "AVX512", ...) and which of :data:`CPU_FLAGS` it has; ``cpuinfo``: the text of /proc/cpuinfo
    (None: read it; empty where it does not exist)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    fields = dict(line.split(":", 1) for line in cpuinfo.splitlines()[:40] if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    flags = set(fields.get("flags", "").split())
    try:
        import torch

        capability = torch.backends.cpu.get_cpu_capability()
    except (ImportError, AttributeError):
        capability = "unknown"
    has = [flag for flag in CPU_FLAGS if flag in flags]
    return "; ".join([fields.get("model name", "unknown model"), f"torch CPU capability {capability}",
                      ", ".join(has) if has else "none of " + ", ".join(CPU_FLAGS)])


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, e.g. "1.02 0.87 0.80" ("n/a" where unsupported)."""
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


# The machine-speed probe: a float32 matrix-vector product streaming PROBE_BYTES of weights, as a
# batch-1 decode step streams its model's weights (memory-bound on these CPUs).
PROBE_BYTES, PROBE_REPEATS, PROBE_BATCHES = 128 << 20, 8, 9


def machine_probe_ms(threads: int | None = None) -> float:
    """Median milliseconds of one pass of the machine-speed probe (``PROBE_REPEATS`` products of a
    float32 [4096, PROBE_BYTES / 16 KiB] matrix with a vector, median of ``PROBE_BATCHES``).

    Why: rows of one serving run are measured one after another over hours, and on a shared host
    the machine's speed drifts between them (plain decoding of one model has run 18% apart within
    one run). Timed right before each row, with the server idle, the probe shows how fast the
    machine's memory was then: a large drift shows in it, though it has also moved 12-20% between
    rows whose speed did not (``benchmarks/README.md``, "Round cost at a forced length, again").
    ``threads``: torch threads for the probe (None: ``os.cpu_count()``, what a server uses here).
    """
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads or os.cpu_count() or 1)
    try:
        matrix = torch.ones(4096, PROBE_BYTES // (4 * 4096))
        vector = torch.ones(matrix.shape[1])
        torch.mv(matrix, vector)  # first touch of the pages, outside the timing
        times = []
        for _ in range(PROBE_BATCHES):
            start = time.perf_counter()
            for _ in range(PROBE_REPEATS):
                torch.mv(matrix, vector)
            times.append((time.perf_counter() - start) * 1000 / PROBE_REPEATS)
    finally:
        torch.set_num_threads(previous)
    times.sort()
    return round(times[len(times) // 2], 2)


def write_results(stem: Path, payload: dict, markdown: str, run: RunRecord) -> tuple[Path, Path]:
    """Write ``<stem>.json`` (``payload`` plus ``"run"``) and ``<stem>.md`` (``markdown`` plus the
    run block); stamps the run's end first. Returns the two paths."""
    run.finish()
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    json_path, md_path = stem.with_name(stem.name + ".json"), stem.with_name(stem.name + ".md")
    json_path.write_text(json.dumps({**payload, "run": run.as_dict()}, indent=1) + "\n")
    md_path.write_text(markdown.rstrip("\n") + "\n\n" + run.markdown())
    return json_path, md_path


def png_metadata(run: dict | None) -> dict[str, str]:
    """PNG text entries for a plot of a run (``RunRecord.as_dict()`` or a result's ``"run"``)."""
    if not run:
        return {}
    # PNG text chunks are Latin-1: keep them ASCII (json.dumps escapes the rest).
    return {"Source": run.get("command", "").encode("ascii", "backslashreplace").decode(),
            "Comment": json.dumps(run)}


def encoded_prompts(tokenizer, prompt_set: str, limit: int | None) -> list[list[int]]:
    """The first user message of the first ``limit`` prompts of a prompt set (``sglang-hsd fetch
    --prompts``, ``runtime.loading.prompt_set_texts``) in the tokenizer's chat template, as token
    ids (one list per prompt)."""
    from sglang_hsd.assets.chat import encode_prompts
    from sglang_hsd.runtime.loading import prompt_set_texts

    return encode_prompts(tokenizer, prompt_set_texts(prompt_set, limit))


def fresh_prompt_offset(prompt_set: str, trained: set[str], ids: list[str] | None = None) -> int:
    """Index of the first prompt of ``prompt_set`` after the last one named in ``trained`` ("set/id"
    names of the prompts a drafter was trained on): measuring from there, the drafter has seen
    none of them. 0 when none of the set trained it. ``ids``: the set's prompt ids in file order
    (loaded with ``load_prompts`` when None)."""
    trained_ids = {name.split("/", 1)[1] for name in trained if name.startswith(prompt_set + "/")}
    if not trained_ids:
        return 0
    if ids is None:
        from sglang_hsd.assets.prompts import load_prompts

        ids = [prompt.id for prompt in load_prompts(prompt_set)]
    return 1 + max((i for i, pid in enumerate(ids) if pid in trained_ids), default=-1)


def benchmark_parser(doc: str, full_doc: bool = True) -> argparse.ArgumentParser:
    """An argument parser whose ``--help`` shows the script's docstring (or its first line)."""
    if full_doc:
        return argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    return argparse.ArgumentParser(description=doc.strip().splitlines()[0])


def add_standard_arguments(parser: argparse.ArgumentParser, *, model: str | None = None,
                           name: str | None = None, threads: int | None = None,
                           exit_heads: bool = False, seed: int | None = None) -> None:
    """Add the options most scripts share, each only when its default is given.

    Args:
        model: default of ``--model`` (a model of ``sglang-hsd fetch``).
        name: default of ``--name``, the results file stem in ``benchmarks/results``.
        threads: default of ``--threads`` (torch intra-op threads).
        exit_heads: add ``--exit-heads`` ('auto', 'none' or a folder; default 'auto').
        seed: default of ``--seed``.
    """
    if model is not None:
        parser.add_argument("--model", default=model)
    if name is not None:
        parser.add_argument("--name", default=name, help="results file stem in benchmarks/results")
    if threads is not None:
        parser.add_argument("--threads", type=int, default=threads)
    if exit_heads:
        parser.add_argument("--exit-heads", default="auto", help="trained exit heads: 'auto', 'none' or a folder")
    if seed is not None:
        parser.add_argument("--seed", type=int, default=seed)


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          check=True, timeout=30).stdout.strip()


def _torch_version() -> str:
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "not installed"


def _utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
