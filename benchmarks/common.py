"""What every benchmark script shares: the run record, result files, prompts and arguments.

Scripts run from the repository root as ``PYTHONPATH=. python benchmarks/<script>.py ...`` and
import this module as ``benchmarks.common`` (no ``sys.path`` changes).

Every result file says which run produced it (:class:`RunRecord`, from
``sglang_hsd/bench/record.py``, which ``sglang-hsd bench`` shares): the git commit of the code, the
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
import time
from pathlib import Path

# The run record lives in the package (``sglang-hsd bench`` writes it too); re-exported here for
# the scripts that import it from this module.
from sglang_hsd.bench.record import (  # noqa: F401
    CPU_FLAGS, RECORDED_ENV, RunRecord, command_line, cpu_description, git_commit, load_average,
    png_metadata, start_run)

BENCHMARKS_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCHMARKS_DIR.parent
RESULTS_DIR = BENCHMARKS_DIR / "results"

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
