"""Setting a target's and a separate drafter's kernels: packed weights and the drafter's weight copy.

:func:`configure_kernels` applies :mod:`~sglang_hsd.runtime.kernel_paths`' choices to a model pair
in place: oneDNN pre-packed weights for multi-row calls (and single rows where measured faster),
and the copy a separate drafter's few-row steps read (:data:`DRAFTER_PRECISIONS`:
:mod:`~sglang_hsd.runtime.weight_copies`' bf16, fp16, int8, int4 and w8a8 copies, or fp32). With
``"auto"`` the fastest is measured (:func:`fastest_drafter_precision`): which copy is fastest for
one row differs between CPUs (``docs/cpu.md``). The target's numbers never change; the drafter's
may, which leaves the output law alone (the verifier uses the probabilities the drafter actually
produced) but can change how often its drafts are accepted: the round planner (``sglang-hsd plan
--drafter``) replays acceptance with each copy.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from typing import Callable, Mapping

import torch
from torch import nn

from sglang_hsd.runtime.kernel_paths import (PATH_MKL, RUNTIME_PATHS, SINGLE_ROW_MEASURE, LinearPath, MeasureConfig,
                                             measure, single_row_split)
from sglang_hsd.runtime.layers import CopyRowsLinear, PackedRows
from sglang_hsd.runtime.weight_copies import COPY_MIXES, WEIGHT_COPIES

__all__ = [
    "AUTO_PRECISION",
    "DRAFTER_PRECISIONS",
    "DRAFTER_PRECISION_OPTIONS",
    "SINGLE_COPY_PRECISIONS",
    "COPY_PATHS",
    "configure_kernels",
    "fastest_drafter_precision",
    "fastest_precision_for_shapes",
    "parse_drafter_precision",
]

# The weight copy a separate drafter's projections read for few rows (``CausalLM.set_weight_copy``,
# a ``WEIGHT_COPIES`` kind, its default rows): None = its fp32 weights. Fewer bytes make a drafting step at batch 1
# faster; the drafter's numbers change, the output law does not (the verifier uses its actual
# probabilities).
# A ``COPY_MIXES`` name reads a different copy per row count (the runtime's drafter only).
DRAFTER_PRECISIONS: Mapping[str, str | None] = {"fp32": None, **{kind: kind for kind in WEIGHT_COPIES},
                                                **{mix: mix for mix in COPY_MIXES}}
# fp32 and the single copies: what ``"auto"`` measures among (one row cannot tell a mix from its
# single-row part) and what the server's drafter offers.
SINGLE_COPY_PRECISIONS: tuple[str, ...] = ("fp32", *WEIGHT_COPIES)


# ``drafter_precision="auto"``: the fastest single-row copy on this machine, measured when the
# kernels are configured (:func:`fastest_drafter_precision`); fp32 without a separate drafter.
AUTO_PRECISION = "auto"
DRAFTER_PRECISION_OPTIONS: tuple[str, ...] = (*DRAFTER_PRECISIONS, AUTO_PRECISION)


def parse_drafter_precision(text: str, name: str = "--drafter-precision") -> str | None:
    """A :data:`DRAFTER_PRECISIONS` name -> its weight-copy kind (None: fp32); ``ValueError``
    naming ``name`` otherwise."""
    if text not in DRAFTER_PRECISIONS:
        raise ValueError(f"{name} must be one of {', '.join(DRAFTER_PRECISIONS)}, got {text!r}")
    return DRAFTER_PRECISIONS[text]


def configure_kernels(target: nn.Module, drafter: nn.Module | None, pack_linears: bool = False,
                      packed_rows: Callable[[int, int], PackedRows] | None = None,
                      drafter_precision: str = "fp32") -> str:
    """Set the kernels of a target's and a separate drafter's projections (``CausalLM`` s, in place).

    Args:
        pack_linears: multi-row calls of both models on oneDNN pre-packed weights
            (``CausalLM.pack_linears``; CPU float32 only, else left as they are): a verification
            of K + 1 rows costs about twice one row instead of K + 1 times (``docs/cpu.md``); the
            copies take as much memory again as the linear weights.
        packed_rows: with ``pack_linears``, the row counts each ``(in, out)`` shape runs packed,
            e.g. ``KernelTable.packed_rows`` of a measured table; None: every call of 2 rows or
            more, and single rows where :func:`single_row_split` measures packed faster.
        drafter_precision: a :data:`DRAFTER_PRECISION_OPTIONS` name for the drafter's few-row
            calls (``CausalLM.set_weight_copy``); a copy needs ``drafter``; ``"auto"``
            measures the fastest (:func:`fastest_drafter_precision`; fp32 without ``drafter``).

    Returns: the drafter precision now in place (``"auto"`` resolved).
    """
    if drafter_precision == AUTO_PRECISION:
        copy = None
    else:
        copy = parse_drafter_precision(drafter_precision, name="drafter_precision")
    if copy is not None and drafter is None:
        raise ValueError(f"drafter_precision={drafter_precision!r} needs a separate draft model as the first level "
                         "(an exit or EAGLE-3 drafter's numbers are the target's)")
    for model in (target, drafter):
        if pack_linears and model is not None:
            model.pack_linears(packed_rows if packed_rows is not None else single_row_split(model))
    if drafter is None:
        return "fp32"
    if drafter_precision == AUTO_PRECISION:
        drafter.set_weight_copy(None)  # measure from the fp32 kernels, whatever a previous call left
        drafter_precision = fastest_drafter_precision(drafter, pack_linears)[0]
        copy = DRAFTER_PRECISIONS[drafter_precision]
    drafter.set_weight_copy(copy)
    return drafter_precision


# A weight copy as a path :func:`measure` can time (rows on the copy, as a drafter's
# ``CopyRowsLinear`` runs them); never selectable: it changes the numbers.
COPY_PATHS: Mapping[str, LinearPath] = {
    kind: LinearPath(kind, lambda linear, kind=kind: CopyRowsLinear(linear, kind, PackedRows(((1, None),))),
                     lambda copy, rows, threads: copy, selectable=False)
    for kind in WEIGHT_COPIES
}


def fastest_drafter_precision(model: nn.Module, pack_linears: bool = True,
                              config: MeasureConfig = SINGLE_ROW_MEASURE,
                              candidates: tuple[str, ...] = SINGLE_COPY_PRECISIONS) -> tuple[str, dict[str, float]]:
    """The ``candidates`` name (:data:`SINGLE_COPY_PRECISIONS`) whose single-row projections cost
    ``model`` (its ``nn.Linear`` layers) least here: :func:`fastest_precision_for_shapes`."""
    counts = Counter((m.in_features, m.out_features) for m in model.modules() if isinstance(m, nn.Linear))
    return fastest_precision_for_shapes(counts, pack_linears, config, candidates)


def fastest_precision_for_shapes(counts: Mapping[tuple[int, int], int], pack_linears: bool = True,
                                 config: MeasureConfig = SINGLE_ROW_MEASURE,
                                 candidates: tuple[str, ...] = SINGLE_COPY_PRECISIONS) -> tuple[str, dict[str, float]]:
    """The ``candidates`` name (:data:`SINGLE_COPY_PRECISIONS`) whose single-row projections cost a
    drafter with these linear shapes least here (``config.rows``: one row count, 1 by default).

    Args:
        counts: ``(in_features, out_features)`` -> how many of the drafter's layers have it (the
            runtime's ``nn.Linear`` s or a server model's linear layers and LM head).

    Times one row of each shape (:func:`measure`, at the current thread count) in fp32 (the
    faster of MKL and oneDNN packed with ``pack_linears``, as :func:`single_row_split` chooses;
    MKL alone without) and on each candidate copy, and sums each over the layers. A few seconds
    for a 0.5B model (three rounds, ``SINGLE_ROW_MEASURE``). Which copy is faster depends on the
    CPU (bf16 on the AVX2 EPYC, fp16 on the AVX-512 one, ``docs/cpu.md``); only a separate
    drafter may run one (the verifier uses the probabilities it produced, so the output law does
    not change).

    Returns: ``(name, {precision: milliseconds of one step's projections})``; a copy that fails
    to run costs ``inf``, and ties go to fp32.
    """
    if len(tuple(config.rows)) != 1:
        raise ValueError(f"config.rows must hold one row count, got {config.rows}")
    for name in candidates:
        if name not in SINGLE_COPY_PRECISIONS:
            raise ValueError(f"candidates must be one of {', '.join(SINGLE_COPY_PRECISIONS)}, got {name!r}")
    copy_paths = {kind: path for kind, path in COPY_PATHS.items() if kind in candidates}
    fp32_paths = RUNTIME_PATHS if pack_linears else {PATH_MKL: RUNTIME_PATHS[PATH_MKL]}
    threads = torch.get_num_threads()
    config = dataclasses.replace(config, threads=(threads,))
    per_shape: dict[tuple[str, tuple[int, int]], float] = {}
    for m in measure(list(counts), config, {**fp32_paths, **copy_paths}):
        if m.error is not None or math.isnan(m.ms):
            continue  # a copy that cannot run here costs infinitely much
        name = m.path if m.path in copy_paths else "fp32"
        key = (name, m.shape)
        per_shape[key] = min(per_shape.get(key, math.inf), m.ms)
    totals = {name: sum(per_shape.get((name, shape), math.inf) * n for shape, n in counts.items())
              for name in ("fp32", *(c for c in candidates if c != "fp32"))}
    return min(totals, key=totals.__getitem__), totals
