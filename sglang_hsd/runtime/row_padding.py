"""Few-row calls of oneDNN's packed linear kernel padded with zero rows up to a cheaper row count.

On some CPUs oneDNN picks, for a packed float32 weight, a slower kernel for 1-3 rows than for 4:
on the 2-core Zen 4 EPYC Qwen2.5-1.5B's 1536 x 8960 projection cost 2.73 ms for one row and 1.75
ms for four, its LM head 35.2 ms and 26.6 ms (``benchmarks/results/linear_paths_qwen2.5-coder-
1.5b_zen4.md``), and a plain server decoding one request at a time ran faster once its one-row
calls were padded (``benchmarks/README.md``, "Server goodput, twelfth run"). Other EPYCs measured
flat (one row about four rows' price), and single-call timings with a cache flush before each
call disagree between runs, so whether to pad is measured where the model runs,
the way a forward calls it (the same layer back to back, its weight streamed from memory each
time): :func:`measure_row_padding` times one packed layer at each few-row count and at
``PAD_TARGET`` rows, and :class:`RowPadding` pads a call only where the padded call measured
faster.

Exactness: a zero row adds nothing to another row's product; the real rows' outputs are those of
the kernel oneDNN runs for the padded row count (equal up to summation order to the unpadded
ones, as any two row counts are).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from sglang_hsd.runtime.layers import packed_linear
from sglang_hsd.runtime.timing import median_seconds

# Few-row calls are compared against this row count (the smallest cheap one measured above).
PAD_TARGET = 4
# The padded call must be at least this much cheaper than the unpadded one to be chosen
# (timing noise between two nearly equal kernels must not flip the choice).
MIN_GAIN = 0.9


@dataclass(frozen=True)
class RowPadding:
    """Row counts a packed linear call is padded to.

    Fields:
        pad_to: ``pad_to[r - 1]`` is the row count a call of ``r`` rows runs with (``>= r``);
            row counts beyond the tuple run as they are. Empty: no padding.
    """

    pad_to: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for rows, padded in enumerate(self.pad_to, start=1):
            if not isinstance(padded, int) or padded < rows:
                raise ValueError(f"pad_to[{rows - 1}] (the row count for {rows} rows) must be an "
                                 f"int >= {rows}, got {padded!r}")

    def rows_for(self, rows: int) -> int:
        """The row count a call of ``rows`` rows runs with."""
        return self.pad_to[rows - 1] if 1 <= rows <= len(self.pad_to) else rows

    def run(self, x: torch.Tensor, product: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """``product`` of ``x`` ``[rows, in]`` with zero rows appended up to ``rows_for(rows)``;
        returns the real rows' ``[rows, out]``."""
        rows = x.shape[0]
        padded = self.rows_for(rows)
        if padded == rows:
            return product(x)
        return product(torch.cat([x, x.new_zeros(padded - rows, x.shape[1])]))[:rows]

    def describe(self) -> str:
        padded = [f"{r} -> {p}" for r, p in enumerate(self.pad_to, start=1) if p != r]
        return "rows padded: " + ", ".join(padded) if padded else "no row padding"


NO_PADDING = RowPadding()
# ``auto``: measured per model when its linears are packed (``probe_row_padding``); ``off``: never padded.
PADDING_CHOICES = ("auto", "off")
# A model whose largest packed layer (LM head aside) is smaller than this is not padded: such a
# layer stays in the cache between calls, so timing it says nothing about a forward, and a choice
# made by noise would differ between two loads of the same model.
MIN_MEASURED_BYTES = 16 << 20


def padded_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None,
                  padding: RowPadding = NO_PADDING) -> torch.Tensor:
    """``packed_linear`` of ``x`` ``[rows, in]`` with ``padding``'s zero rows appended for the
    call; returns ``[rows, out]``."""
    return padding.run(x, lambda rows: packed_linear(rows, packed, bias))


def choose_row_padding(cost: Callable[[int], float], target: int = PAD_TARGET,
                       min_gain: float = MIN_GAIN) -> RowPadding:
    """The padding from measured costs: ``cost(r)`` seconds of a call of ``r`` rows; a row count
    below ``target`` is padded to it when ``cost(target) < min_gain * cost(r)``."""
    if not isinstance(target, int) or target < 1:
        raise ValueError(f"target must be a positive int, got {target!r}")
    if not 0 < min_gain <= 1:
        raise ValueError(f"min_gain must be in (0, 1], got {min_gain!r}")
    at_target = cost(target)
    return RowPadding(tuple(target if at_target < min_gain * cost(rows) else rows
                            for rows in range(1, target)))


def measure_row_padding(packed: torch.Tensor, in_features: int, repeats: int = 7,
                        target: int = PAD_TARGET) -> RowPadding:
    """``choose_row_padding`` from the median time of ``repeats`` calls (after one untimed) of
    the packed weight ``packed`` (``pack_linear_weight`` of an ``[out, in_features]`` weight) at
    each row count up to ``target``, on random input."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")

    def cost(rows: int) -> float:
        x = torch.randn(rows, in_features)
        return median_seconds(lambda: packed_linear(x, packed, None), repeats, warmup=1)

    return choose_row_padding(cost, target)


def decode_forward(model, context: int = 16) -> Callable[[int], None]:
    """``forward(rows)`` of a ``CausalLM``: ``rows`` new positions after a ``context``-token
    prompt on a scratch cache, rolled back after each call."""
    cache = model.new_cache(1, context + PAD_TARGET)
    with torch.inference_mode():
        model.forward(torch.zeros(1, context, dtype=torch.long), cache)
    base = cache.lengths[0].clone()  # [B]: every layer holds the context

    @torch.inference_mode()
    def forward(rows: int) -> None:
        model.forward(torch.zeros(1, rows, dtype=torch.long), cache)
        cache.truncate(base)

    return forward


def forward_row_padding(forward: Callable[[int], None], repeats: int = 3, target: int = PAD_TARGET) -> RowPadding:
    """``choose_row_padding`` from whole forwards: the median seconds of ``forward(rows)`` (a
    model's forward of ``rows`` new positions, unpadded) at each row count up to ``target``,
    after one untimed call. Steadier than one layer's calls: a forward streams every weight, as
    decoding does, and lasts long enough for the timer (one layer of the 1.5B took 1.75-2.73 ms
    a call, and two probes of it on the same machine chose differently)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")

    return choose_row_padding(lambda rows: median_seconds(lambda: forward(rows), repeats, warmup=1), target)


def probe_row_padding(layers: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> tuple[RowPadding, tuple[int, int] | None]:
    """The padding of a model's packed layers, measured on the largest (``measure_row_padding``).

    Args:
        layers: ``(weight [out, in], packed weight)`` of each packed layer, the LM head left out
            by the caller (it would cost tens of ms a call and is not what a forward repeats).
    Returns:
        ``(padding, (out, in) of the layer measured)``; ``(NO_PADDING, None)`` without a layer of
        at least ``MIN_MEASURED_BYTES``.
    """
    if not layers:
        return NO_PADDING, None
    weight, packed = max(layers, key=lambda layer: layer[0].numel())
    if weight.numel() * weight.element_size() < MIN_MEASURED_BYTES:
        return NO_PADDING, None
    return measure_row_padding(packed, weight.shape[1]), tuple(weight.shape)
