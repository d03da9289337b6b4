"""The draft model's weight copy in the server (``--hsd-draft-precision``).

A draft step at small batch is a chain of few-row matrix products bound by reading the weights:
on the AVX-512 EPYC one row of Qwen2.5-Coder-0.5B's LM head costs 24 ms in packed float32 and
4 ms on an int4 copy (``docs/cpu.md``). The runtime already drafts on such copies
(``runtime.weight_copies``, ``runtime.kernel_setup``); this module gives a separate draft language
model served by SGLang (``--hsd-draft-kind model``) the same copies.

``--hsd-draft-precision`` (``SGLANG_HSD_DRAFT_PRECISION``) takes ``fp32`` (no copy), ``bf16``,
``fp16``, ``int8``, ``int4``, ``w8a8`` or ``auto`` (the default): the copy whose single-row products,
summed over the draft model's linear layers and LM head, measure fastest here at start-up
(``runtime.kernel_setup.fastest_precision_for_shapes``, a few seconds), or, where other copies
come within ``AUTO_CLOSE`` of it, the one of those fastest at ``AUTO_BATCH_ROWS`` rows
(``auto_precision``: a server drafts for a whole batch); the choice and every total are logged
and reported in ``/server_info``. Each layer then computes on the copy the
row counts where the copy measured faster than its float32 kernel at start-up
(``measured_copy_rows``: the layers and the LM head each timed at 1 to 32 rows, and at 256 rows
when the copy won at all of those, after which it serves every row count; the kind's default
``WeightCopyKind.rows`` for a draft too small to time), and every other call (a long draft
extend, a prefill) on its float32 kernel. A copy that serves every count (w8a8 on the Xeon and
the AVX2 EPYC) also runs the draft model's prefill and catch-ups, whose KV the later draft steps
then read.

Why it is lossless: only the *drafter's* numbers change. The draft tokens are drawn from the q the
copy produced and the verifier reads that same q, so the output law is the target's whatever q
is (``docs/verification.md``); the copy can only change how often drafts are accepted. So copies
are attached only to the draft model's own layers: a layer whose weight is also one of the
target's parameters (a shared embedding or LM head) keeps float32, and the target is never
touched.

Limits: float32 draft weights only (``--dtype float32``; ``auto`` keeps float32 for any other
dtype, an explicit copy is refused naming the flag); CPU only; the copies add their own memory
(int4: about an eighth of the float32 weights); a weight update would leave them stale, so the
server answers weight-update requests with a failure naming the flag.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import torch

from sglang_hsd.runtime.kernel_paths import SINGLE_ROW_MEASURE
from sglang_hsd.runtime.kernel_setup import (AUTO_PRECISION, DRAFTER_PRECISIONS, SINGLE_COPY_PRECISIONS,
                                             fastest_precision_for_shapes)
from sglang_hsd.runtime.layers import PackedRows
from sglang_hsd.runtime.row_padding import MIN_MEASURED_BYTES, NO_PADDING, padded_linear
from sglang_hsd.sglang_plugin.cpu.linear_path import (COPY_ATTR, PACKED_ATTR, PADDING_ATTR,
                                                      float32_linear_layers)
from sglang_hsd.runtime.weight_copies import WEIGHT_COPIES, WeightCopy, build_weight_copy, w8a8_activation_levels

logger = logging.getLogger(__name__)

DRAFT_PRECISION_ENV = "SGLANG_HSD_DRAFT_PRECISION"
DRAFT_PRECISION_FLAG = "--hsd-draft-precision"
# The server's choices: one copy per layer (its rows measured at start-up), so no copy mixes.
SERVER_DRAFT_PRECISIONS: tuple[str, ...] = (*SINGLE_COPY_PRECISIONS, AUTO_PRECISION)


# Row counts at which the copy and the float32 kernel are compared when the server starts.
COMPARED_ROWS = (1, 2, 4, 8, 12, 16, 24, 32)
# A copy that wins at every one of them is compared once more at this many rows (a prefill's, a
# catch-up's): winning there too, it serves every row count.
BULK_ROWS = 256
# ``auto``: copies whose single rows cost at most this factor times the fastest's are compared
# again at AUTO_BATCH_ROWS rows (``auto_precision``).
AUTO_CLOSE = 1.15
AUTO_BATCH_ROWS = 16
# ``DraftCopyReport.copy_rows`` for a copy that serves every row count.
EVERY_ROW_COUNT = "all"


class DraftPrecisionError(ValueError):
    """A bad ``--hsd-draft-precision`` setting; the message names the flag."""


@dataclass(frozen=True)
class DraftPrecisionConfig:
    """Fields:
        precision: a ``SERVER_DRAFT_PRECISIONS`` name (``fp32``: no copy; ``auto``: measured).
    """

    precision: str = AUTO_PRECISION

    def __post_init__(self) -> None:
        if self.precision not in SERVER_DRAFT_PRECISIONS:
            raise DraftPrecisionError(f"{DRAFT_PRECISION_FLAG} ({DRAFT_PRECISION_ENV}) must be one of "
                                      f"{', '.join(SERVER_DRAFT_PRECISIONS)}, got {self.precision!r}")

    @classmethod
    def from_env(cls) -> "DraftPrecisionConfig":
        return cls(os.environ.get(DRAFT_PRECISION_ENV, "").strip().lower() or AUTO_PRECISION)


@dataclass(frozen=True)
class LayerCopy:
    """One draft layer's copy and the row counts it serves.

    ``copy`` computes ``x @ W.T`` without bias (the caller adds the layer's bias: SGLang passes
    it separately); ``rows``: the flattened row counts taken on the copy.
    """

    copy: WeightCopy
    rows: PackedRows

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
        """``x`` ``[..., in]`` -> ``[..., out]`` fp32, or None when this call is not the copy's
        (dtype, row count, an fp16 overflow): the caller computes it in float32."""
        if x.dtype != torch.float32:
            return None
        flat = x.reshape(-1, x.shape[-1])
        if flat.shape[0] not in self.rows:
            return None
        out = self.copy(flat)
        if out is None:
            return None
        if bias is not None:
            out = out + bias
        return out.view(*x.shape[:-1], out.shape[-1])


@dataclass
class DraftCopyReport:
    """What ``attach_draft_copies`` did, for the log and ``/server_info``.

    Fields:
        precision: the precision in place (``auto`` resolved; ``fp32``: no copy).
        requested: the flag's value.
        layers: layers given a copy.
        skipped_shared: layers left in float32 because the target shares their weight.
        measured_ms: with ``auto``, one draft step's single-row projections per precision (ms).
        batch_ms: with ``auto``, the same at ``AUTO_BATCH_ROWS`` rows for the copies that came
            within ``AUTO_CLOSE`` of the fastest single rows (empty: none did).
        copy_rows: ``{"layers": m, "lm_head": m}``: calls of 1..m rows take the copy, as
            measured at start-up (``measured_copy_rows``; m = ``EVERY_ROW_COUNT``: every call);
            the kind's default where not measured.
        activation_bits: with w8a8, the bits its activations are quantized to here (8, or 7 where
            the CPU's integer kernel saturates on 8: ``weight_copies.w8a8_activation_levels``);
            None for other copies.
    """

    precision: str
    requested: str
    layers: int = 0
    skipped_shared: int = 0
    measured_ms: dict[str, float] = field(default_factory=dict)
    copy_rows: dict[str, int | str] = field(default_factory=dict)
    batch_ms: dict[str, float] = field(default_factory=dict)
    activation_bits: int | None = None

    def as_dict(self) -> dict:
        return {"precision": self.precision, "requested": self.requested, "layers": self.layers,
                "skipped_shared": self.skipped_shared, "copy_rows": dict(self.copy_rows),
                "activation_bits": self.activation_bits,
                "measured_ms": {k: round(v, 3) for k, v in self.measured_ms.items()},
                f"measured_ms_{AUTO_BATCH_ROWS}_rows": {k: round(v, 3) for k, v in self.batch_ms.items()}}


def attach_draft_copies(draft_model: torch.nn.Module, target_model: torch.nn.Module,
                        config: DraftPrecisionConfig) -> DraftCopyReport:
    """Give ``draft_model``'s float32 linear layers and LM head the configured copy (in place).

    Layers whose weight storage the target also holds are skipped. Raises
    ``DraftPrecisionError`` for an explicit copy when the draft has no float32 layer.
    """
    shared = {p.untyped_storage().data_ptr() for p in target_model.parameters()}
    layers = float32_linear_layers(draft_model)
    own = [m for m in layers if m.weight.untyped_storage().data_ptr() not in shared]
    report = DraftCopyReport(precision="fp32", requested=config.precision,
                             skipped_shared=len(layers) - len(own))
    if not own:
        if config.precision not in ("fp32", AUTO_PRECISION):
            raise DraftPrecisionError(f"{DRAFT_PRECISION_FLAG} {config.precision}: the draft model has no "
                                      "float32 linear layer of its own to copy (serve it with --dtype "
                                      "float32, or pass fp32)")
        return report
    precision = config.precision
    if precision == AUTO_PRECISION:
        counts = Counter((m.weight.shape[1], m.weight.shape[0]) for m in own)
        precision, report.measured_ms, report.batch_ms = auto_precision(counts)
    report.precision = precision
    kind = DRAFTER_PRECISIONS[precision]
    if kind is None:
        return report
    default = PackedRows((WEIGHT_COPIES[kind].rows,))
    copies = {module: build_weight_copy(kind, module.weight.detach()) for module in own}
    if kind == "w8a8":
        report.activation_bits = w8a8_activation_levels().bit_length()
    lm_head = getattr(draft_model, "lm_head", None)
    for group, modules in (("layers", [m for m in own if m is not lm_head]),
                           ("lm_head", [m for m in own if m is lm_head])):
        measured = measured_copy_rows(modules, copies) if modules else None
        if measured is not None:
            report.copy_rows[group] = EVERY_ROW_COUNT if measured[1] is None else measured[1]
        rows = default if measured is None else PackedRows((measured,))
        for module in modules:
            setattr(module, COPY_ATTR, LayerCopy(copies[module], rows))
    report.layers = len(own)
    return report


def auto_precision(counts: Counter) -> tuple[str, dict[str, float], dict[str, float]]:
    """``--hsd-draft-precision auto`` for a draft model with these ``(in, out)`` linear shapes:
    the copy whose single-row projections measure fastest, unless others come within
    ``AUTO_CLOSE`` of it; then the one of those fastest at ``AUTO_BATCH_ROWS`` rows.

    Why: a server drafts for every request of its batch. On the 2-core Xeon int4 and w8a8 are
    within 1-4% of each other for one row (either may win at a start-up), while at batch 16 a
    draft step on int4 cost 172 ms against 102 ms on w8a8 and its draft extend 432 ms against
    274 ms (int4's kernel works in blocks of rows, and falls back to float32 beyond the row
    counts it wins; ``benchmarks/README.md``, "Server goodput, twentieth run").

    Returns: ``(precision, {name: ms of one step's single rows}, {name: ms at
    AUTO_BATCH_ROWS rows}`` (the latter empty when no other copy came close))."""
    precision, single = fastest_precision_for_shapes(counts, pack_linears=True)
    close = tuple(name for name, ms in single.items() if ms <= AUTO_CLOSE * single[precision])
    if len(close) < 2:
        return precision, single, {}
    _, batch = fastest_precision_for_shapes(
        counts, pack_linears=True, config=dataclasses.replace(SINGLE_ROW_MEASURE, rows=(AUTO_BATCH_ROWS,)),
        candidates=close)
    batch = {name: ms for name, ms in batch.items() if name in close}
    return min(batch, key=batch.__getitem__), single, batch


def choose_copy_rows(copy_seconds: Callable[[int], float], float_seconds: Callable[[int], float],
                     rows: tuple[int, ...] = COMPARED_ROWS, bulk: int | None = None) -> int | None:
    """The largest of ``rows`` (ascending) up to which the copy cost less than float32 at every
    one of them (``copy_seconds(r)`` / ``float_seconds(r)``: seconds of a call of ``r`` rows);
    at least 1. A count beyond the first loss is not trusted to win again: between measured
    counts the cost is not known, and the copy's cost grows faster with rows (int4's kernel
    works in blocks of 4 rows). None (every count) when the copy won at all of ``rows`` and
    then at ``bulk`` rows too: a copy multiplied in integers (w8a8) stays ahead of float32 up
    to a prefill's row counts."""
    last = 1
    for count in rows:
        if copy_seconds(count) >= float_seconds(count):
            return last
        last = count
    if bulk is not None and copy_seconds(bulk) < float_seconds(bulk):
        return None
    return last


def measured_copy_rows(modules: list[torch.nn.Module], copies: dict, rows: tuple[int, ...] = COMPARED_ROWS,
                       repeats: int = 3, bulk: int = BULK_ROWS) -> tuple[int, int | None] | None:
    """The row counts ``(1, last)`` the copy serves (``last`` None: every count), from
    ``choose_copy_rows`` over one pass over ``modules`` in order on their ``copies`` (module
    -> ``WeightCopy``) against one on their float32 kernel (packed and padded as the server runs
    them, else ``F.linear``), the median of ``repeats`` after an untimed one; None when the
    modules' float32 weights total less than ``MIN_MEASURED_BYTES`` (cache-resident timings say
    nothing about a forward).

    Which row counts a copy wins depends on the CPU, so it is measured where the server runs.
    Each pass reads every weight once, as a forward does: timed alone, back to back, a 35 MB
    float32 projection stays in the 260 MB L3 of the 2-core Xeon and looked faster than int4
    from 8 rows, where the passes over the 0.5B draft model measured int4 faster up to 8-16 rows
    (its LM head up to 8-12) on different starts: close to equal there, so the noise is cheap.
    """
    if sum(m.weight.numel() * m.weight.element_size() for m in modules) < MIN_MEASURED_BYTES:
        return None
    inputs: dict[tuple[int, int], torch.Tensor] = {}

    def timed(product: Callable, count: int) -> float:
        for m in modules:  # one input per (rows, in_features), shared by both sides
            if (count, m.weight.shape[1]) not in inputs:
                inputs[(count, m.weight.shape[1])] = torch.randn(count, m.weight.shape[1])
        xs = [inputs[(count, m.weight.shape[1])] for m in modules]
        times = []
        for _ in range(repeats + 1):  # the first pass is not timed (oneDNN creates its kernels)
            started = time.perf_counter()
            for module, x in zip(modules, xs):
                product(module, x)
            times.append(time.perf_counter() - started)
        return sorted(times[1:])[repeats // 2]

    return 1, choose_copy_rows(lambda count: timed(lambda m, x: copies[m](x), count),
                               lambda count: timed(_float32_product, count), rows, bulk)


def _float32_product(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The float32 product the server computes for ``module`` when its copy does not serve."""
    packed = getattr(module, PACKED_ATTR, None)
    if packed is not None:
        return padded_linear(x, packed, None, getattr(module, PADDING_ATTR, NO_PADDING))
    return torch.nn.functional.linear(x, module.weight)


def log_report(report: DraftCopyReport) -> None:
    measured = ", ".join(f"{k} {v:.1f} ms" for k, v in report.measured_ms.items())
    if report.batch_ms:
        measured += f"; at {AUTO_BATCH_ROWS} rows " + ", ".join(f"{k} {v:.1f} ms" for k, v in report.batch_ms.items())
    rows = ", ".join(f"{group} {'every row count' if last == EVERY_ROW_COUNT else f'1-{last} rows'}"
                     for group, last in report.copy_rows.items())
    bits = f", {report.activation_bits}-bit activations" if report.activation_bits else ""
    logger.info("sglang-hsd: draft model weight copy %s%s (%s %s%s): %d layers%s%s", report.precision, bits,
                DRAFT_PRECISION_FLAG, report.requested,
                f"; one draft step's single rows measured {measured}" if measured else "",
                report.layers,
                f", {report.skipped_shared} shared with the target kept float32" if report.skipped_shared else "",
                f"; the copy serves (measured) {rows}" if rows else "")
