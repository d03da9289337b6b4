"""Which CPU kernel runs a linear layer, per weight shape and row count: measured, then looked up.

On a CPU whose BLAS treats a few-row matrix product as that many matrix-vector products, the
kernel that is fastest for one row (``F.linear`` through MKL) is not the fastest for the K + 1
rows of a verification forward (``docs/cpu.md``). This module

* names the kernel paths the runtime can run (:data:`RUNTIME_PATHS`, one registry: ``mkl`` =
  ``F.linear``, ``onednn-packed`` = :class:`~sglang_hsd.runtime.layers.PackedLinear`);
* times them on given shapes (:func:`measure`; ``benchmarks/bench_linear.py`` adds paths the
  runtime cannot run, such as an inductor-compiled GEMM, and writes the result as JSON);
* turns measurements into a :class:`KernelTable` of :class:`KernelChoice` entries, per
  ``(in_features, out_features)`` and row range the fastest *selectable* path, and gives
  :class:`PackedLinear` its packed row ranges (``CausalLM.pack_linears(table.packed_rows)``);
* decides, when packing is asked for without a table, whether single rows run packed too
  (:func:`single_row_split`): which kernel is fastest for one row differs between machines
  (on an AVX2-only EPYC, MKL's matrix-vector product about ties oneDNN at 2 threads; on an AVX-512
  EPYC, MKL's single row is 2-3x slower than oneDNN's), so it is measured, not assumed.

``kernel_setup`` applies these choices (and a separate drafter's weight copy) to a model pair.

Every path computes the same fp32 product (no quantization); :func:`measure` records each path's
largest absolute difference from ``F.linear`` on the same weights and input.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from sglang_hsd.runtime.layers import PackedLinear, PackedRows

__all__ = [
    "PATH_MKL",
    "PATH_PACKED",
    "RUNTIME_PATHS",
    "KernelChoice",
    "KernelTable",
    "LinearPath",
    "MeasureConfig",
    "Measurement",
    "linear_shapes",
    "measure",
    "measure_table",
    "median_ms",
    "single_row_split",
]

PATH_MKL = "mkl"
PATH_PACKED = "onednn-packed"
# Largest |path - F.linear| accepted as the same fp32 product: outputs of O(1) with inputs of up
# to ~10^4 features; summation order changes them by ~1e-6.
SAME_PRODUCT_ATOL = 1e-4

@dataclass(frozen=True)
class LinearPath:
    """One way of computing ``x @ weight.T`` on CPU.

    Fields:
        name: the path's name in tables and result files.
        prepare: ``nn.Linear -> state``, once per weight (e.g. reorder the weight; not timed).
        bind: ``(state, rows, threads) -> fn`` with ``fn(x [rows, in] fp32) -> [rows, out]``, once
            per row count and thread count (e.g. compile for that shape; not timed).
        selectable: whether the runtime's linear layers can run it (only those enter a
            :class:`KernelTable` built for the runtime).
    """

    name: str
    prepare: Callable[[nn.Linear], object]
    bind: Callable[[object, int, int], Callable[[torch.Tensor], torch.Tensor]]
    selectable: bool = True


RUNTIME_PATHS: Mapping[str, LinearPath] = {
    PATH_MKL: LinearPath(PATH_MKL, lambda linear: linear, lambda linear, rows, threads: linear),
    PATH_PACKED: LinearPath(
        PATH_PACKED,
        # Packed for every row count, so the table measures the kernel itself.
        lambda linear: PackedLinear(linear, PackedRows(((1, None),))),
        lambda packed, rows, threads: packed,
    ),
}


@dataclass(frozen=True)
class Measurement:
    """The median cost of one linear call.

    Fields:
        in_features, out_features: the weight's shape is ``[out_features, in_features]``.
        rows, path, threads: ``x`` is ``[rows, in_features]``; torch intra-op threads.
        ms: median milliseconds per call (NaN when ``error`` is set).
        max_abs_diff: largest ``|path(x) - F.linear(x)|`` on the same weights and input.
        setup_s: seconds spent preparing and binding (packing, compiling), not in ``ms``.
        error: why the path could not run (its exception's type and message), else None.
    """

    in_features: int
    out_features: int
    rows: int
    path: str
    threads: int
    ms: float
    max_abs_diff: float = float("nan")
    setup_s: float = 0.0
    error: str | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return self.in_features, self.out_features


@dataclass(frozen=True)
class KernelChoice:
    """The path to run for one weight shape and an inclusive row range (``max_rows`` None: and above)."""

    in_features: int
    out_features: int
    min_rows: int
    max_rows: int | None
    path: str
    threads: int

    def holds(self, rows: int) -> bool:
        return self.min_rows <= rows and (self.max_rows is None or rows <= self.max_rows)


@dataclass(frozen=True)
class KernelTable:
    """Per ``(in_features, out_features)``, consecutive row ranges and the path chosen for each.

    Built by :meth:`from_measurements` (the fastest measured path per shape and row count, then
    equal neighbours merged); the last range of a shape is open-ended, so row counts beyond the
    measured ones take the choice of the largest measured count.
    """

    choices: tuple[KernelChoice, ...] = field(default_factory=tuple)

    @classmethod
    def from_measurements(cls, measurements: Iterable[Measurement], paths: Iterable[str] | None = None,
                          threads: int | None = None) -> KernelTable:
        """The fastest measurement per (shape, rows) among ``paths`` (default: the selectable paths
        of :data:`RUNTIME_PATHS`) at ``threads`` (None: any thread count), failed ones skipped."""
        allowed = set(paths) if paths is not None else {n for n, p in RUNTIME_PATHS.items() if p.selectable}
        best: dict[tuple[int, int, int], Measurement] = {}
        for m in measurements:
            if m.path not in allowed or m.error is not None or math.isnan(m.ms):
                continue
            if threads is not None and m.threads != threads:
                continue
            key = (m.in_features, m.out_features, m.rows)
            if key not in best or m.ms < best[key].ms:
                best[key] = m
        choices: list[KernelChoice] = []
        for (in_f, out_f, rows), m in sorted(best.items()):
            last = choices[-1] if choices else None
            if (last is not None and (last.in_features, last.out_features) == (in_f, out_f)
                    and (last.path, last.threads) == (m.path, m.threads)):
                choices[-1] = KernelChoice(in_f, out_f, last.min_rows, rows, m.path, m.threads)
            else:
                choices.append(KernelChoice(in_f, out_f, rows, rows, m.path, m.threads))
        return cls(tuple(_open_last_ranges(choices)))

    @classmethod
    def from_json(cls, path: str | Path, paths: Iterable[str] | None = None, threads: int | None = None) -> KernelTable:
        """A table from a ``benchmarks/bench_linear.py`` result (its ``"measurements"`` list)."""
        data = json.loads(Path(path).read_text())
        if "measurements" not in data:
            raise ValueError(f"path {path} holds no 'measurements' list (a bench_linear.py result expected)")
        return cls.from_measurements([Measurement(**entry) for entry in data["measurements"]], paths, threads)

    def choose(self, in_features: int, out_features: int, rows: int) -> KernelChoice | None:
        """The choice for ``rows`` rows of this shape; None when the shape (or so few rows) was not measured."""
        for choice in self.choices:
            if (choice.in_features, choice.out_features) == (in_features, out_features) and choice.holds(rows):
                return choice
        return None

    def packed_rows(self, in_features: int, out_features: int) -> PackedRows:
        """Row ranges where the table runs ``onednn-packed`` for this shape; the default
        :class:`PackedRows` when the shape is not in the table."""
        mine = [c for c in self.choices if (c.in_features, c.out_features) == (in_features, out_features)]
        if not mine:
            return PackedRows()
        return PackedRows(tuple((c.min_rows, c.max_rows) for c in mine if c.path == PATH_PACKED))

    def as_dicts(self) -> list[dict]:
        return [asdict(c) for c in self.choices]


def _open_last_ranges(choices: list[KernelChoice]) -> list[KernelChoice]:
    """Open the last range of every shape upwards (``max_rows = None``)."""
    out = []
    for i, choice in enumerate(choices):
        nxt = choices[i + 1] if i + 1 < len(choices) else None
        if nxt is None or (nxt.in_features, nxt.out_features) != (choice.in_features, choice.out_features):
            choice = KernelChoice(choice.in_features, choice.out_features, choice.min_rows, None,
                                  choice.path, choice.threads)
        out.append(choice)
    return out


def median_ms(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, repeats: int, warmup: int = 1,
              flush: torch.Tensor | None = None) -> float:
    """Median wall milliseconds of ``fn(x)`` over ``repeats`` calls after ``warmup`` untimed ones.

    ``flush``: a buffer larger than the last-level cache, overwritten before each timed call so
    the weight is read from memory as in a model forward (where every layer's weights evict the
    previous ones), not from a cache that a repeated call keeps warm.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got {repeats} and {warmup}")
    for _ in range(warmup):
        fn(x)
    times = []
    for _ in range(repeats):
        if flush is not None:
            flush.add_(1.0)
        start = time.perf_counter()
        fn(x)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


@dataclass(frozen=True)
class MeasureConfig:
    """What :func:`measure` times: ``rows`` and ``threads`` (torch intra-op) counts, ``repeats``
    timed calls after ``warmup`` ones, ``flush_mb`` MB of cache flush before each timed call (0: none),
    the whole measurement ``rounds`` times (each cost is the fastest round's median)."""

    rows: tuple[int, ...]
    threads: tuple[int, ...] = (1,)
    repeats: int = 5
    warmup: int = 2
    flush_mb: int = 64
    seed: int = 0
    rounds: int = 1

    def __post_init__(self) -> None:
        if self.rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {self.rounds}")


def measure(shapes: Iterable[tuple[int, int]], config: MeasureConfig,
            paths: Mapping[str, LinearPath] = RUNTIME_PATHS) -> list[Measurement]:
    """Time every path on random fp32 weights of every ``(in_features, out_features)`` shape.

    Returns one :class:`Measurement` per (shape, threads, rows, path), ``F.linear``'s output on the
    same input as the reference of ``max_abs_diff``. A path that raises while binding or running
    is recorded with its error (compilers can fail on a shape), the others still run. The thread
    count is restored afterwards. With ``config.rounds > 1`` everything is measured that many
    times in turn and each entry keeps its fastest round: a burst of other work on the machine
    (a process waking up delays a multi-threaded kernel's second thread by a scheduler quantum,
    ~8 ms here, which a 0.1 ms call cannot hide in its median) then spoils one round, not the choice.
    """
    shapes = list(shapes)
    best = _measure_round(shapes, config, paths)
    for _ in range(config.rounds - 1):
        later = _measure_round(shapes, config, paths)
        best = [new if new.ms < old.ms else old for old, new in zip(best, later)]  # NaN (error) never wins
    return best


def _measure_round(shapes: list[tuple[int, int]], config: MeasureConfig,
                   paths: Mapping[str, LinearPath]) -> list[Measurement]:
    flush = torch.zeros(config.flush_mb * 2**18) if config.flush_mb > 0 else None
    saved_threads = torch.get_num_threads()
    out: list[Measurement] = []
    try:
        with torch.inference_mode():
            for in_f, out_f in shapes:
                gen = torch.Generator().manual_seed(config.seed)
                linear = nn.Linear(in_f, out_f, bias=False)
                nn.init.uniform_(linear.weight, -in_f**-0.5, in_f**-0.5, generator=gen)
                states = {name: path.prepare(linear) for name, path in paths.items()}
                for threads in config.threads:
                    torch.set_num_threads(threads)
                    for rows in config.rows:
                        x = torch.randn(rows, in_f, generator=gen)
                        out += [_measure_one(path, states[name], linear, x, threads, config, flush)
                                for name, path in paths.items()]
    finally:
        torch.set_num_threads(saved_threads)
    return out


def _measure_one(path: LinearPath, state: object, linear: nn.Linear, x: torch.Tensor, threads: int,
                 config: MeasureConfig, flush: torch.Tensor | None) -> Measurement:
    rows, in_f = x.shape
    head = dict(in_features=in_f, out_features=linear.out_features, rows=rows, path=path.name, threads=threads)
    start = time.perf_counter()
    try:
        fn = path.bind(state, rows, threads)
        diff = float((fn(x) - F.linear(x, linear.weight)).abs().max())
        setup_s = time.perf_counter() - start
        ms = median_ms(fn, x, config.repeats, config.warmup, flush)
    except Exception as err:  # noqa: BLE001 - recorded, not hidden: the result names the failure
        return Measurement(**head, ms=float("nan"), setup_s=time.perf_counter() - start,
                           error=f"{type(err).__name__}: {err}".strip()[:2000])
    return Measurement(**head, ms=ms, max_abs_diff=diff, setup_s=setup_s)


def linear_shapes(model: nn.Module) -> list[tuple[int, int]]:
    """The distinct ``(in_features, out_features)`` of a model's linear layers (packed or not)."""
    found = {(m.in_features, m.out_features): None for m in model.modules() if isinstance(m, (nn.Linear, PackedLinear))}
    return list(found)


def measure_table(model: nn.Module, config: MeasureConfig) -> KernelTable:
    """A quick in-process table for ``model``'s shapes at the current thread count (the runtime
    does not switch threads per call; ``config.threads`` is ignored), selectable paths only.

    Example: ``model.pack_linears(measure_table(model, MeasureConfig(rows=tuple(range(1, 10)))).packed_rows)``.
    """
    threads = torch.get_num_threads()
    config = dataclasses.replace(config, threads=(threads,))
    return KernelTable.from_measurements(measure(linear_shapes(model), config), threads=threads)


# What single_row_split times: one row, after warm-up calls, the weights flushed from the cache,
# in three rounds, since its choice holds for the whole run: while another process runs, a packed
# 2-thread call of SmolLM2's small shapes (0.1 ms) measures 8 ms, and one planner run decoded the
# same plain setting at 37 and 25 ms per token, the first at MKL's single-row speed.
SINGLE_ROW_MEASURE = MeasureConfig(rows=(1,), repeats=5, warmup=2, rounds=3)


def single_row_split(model: nn.Module, config: MeasureConfig = SINGLE_ROW_MEASURE) -> Callable[[int, int], PackedRows]:
    """``(in_features, out_features) -> PackedRows`` for ``CausalLM.pack_linears``: every call of 2
    rows or more packed, and single rows too for the shapes where oneDNN's packed kernel beats
    ``F.linear`` in a quick measurement at the current thread count (:func:`measure_table` on
    ``model``'s shapes; three rounds: 1 s for SmolLM2-135M, 8 s for Qwen2.5-Coder 1.5B at 2
    threads). Both kernels compute the same fp32 product, so the choice changes speed, never the
    numbers beyond summation order. Plain decoding is a stream of single rows: measuring keeps it
    on its fastest kernel, so speculative decoding is compared against the best plain decoding
    this machine runs. The measurement runs on the first lookup, so a model whose linears are all
    packed already costs nothing."""
    if tuple(config.rows) != (1,):
        raise ValueError(f"config.rows must be (1,), got {config.rows}")

    @functools.cache
    def packed_alone() -> frozenset[tuple[int, int]]:
        return frozenset((c.in_features, c.out_features) for c in measure_table(model, config).choices
                         if c.path == PATH_PACKED)

    return lambda in_f, out_f: PackedRows(((1, None),)) if (in_f, out_f) in packed_alone() else PackedRows()
