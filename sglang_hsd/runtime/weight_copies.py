"""Reduced-precision weight copies that a separate drafter's projections may read.

A drafting step at batch 1 is a chain of one-row matrix products, each bound by reading its
weight, so a copy with fewer bytes per weight makes it faster: on the AVX-512 EPYC, one row of the
Qwen2.5-Coder-0.5B LM head (896 x 151,936) costs 24 ms in packed fp32, 9 ms on an fp16 copy and
4 ms on an int4 copy (2 threads, ``docs/cpu.md``, "The drafter's weight copy"). A copy changes the
drafter's numbers, never the output law: the verifier uses the probabilities the drafter actually
produced. So copies are only for a separate draft model, never for a target or an early exit
(whose numbers are the target's).

:data:`WEIGHT_COPIES` is the one registry of copy kinds:

* ``bf16`` / ``fp16``: the weight cast to half precision; activations cast for the product. An
  fp16 product that overflows is reported unusable and recomputed in fp32 by the caller.
* ``int8``: symmetric per-output-channel int8 (scale = row max / 127), bf16 activations,
  ``torch.ops.aten._weight_int8pack_mm``.
* ``int4``: asymmetric int4 in groups of 32 input features (scale and zero point per group from
  the group's min and max), bf16 activations, ``torch.ops.aten._weight_int4pack_mm_for_cpu``.
* ``w8a8``: symmetric per-output-channel int8 weights and 8-bit activations quantized per row at
  each call, multiplied in integers by fbgemm's dynamic-quantization kernel (VNNI dot products
  where the CPU has them). One forward of Qwen2.5-Coder-0.5B on the 2-core Xeon (AVX-512 VNNI,
  ``benchmarks/results/drafter_step_qwen2.5-coder-0.5b_w8a8_sharegpt.md``): 38 ms for one row
  (int4 31, packed fp32 88), 69 ms for 9 rows (int4 115, packed fp32 137) and 563 ms for 256
  (packed fp32 1048): the copy that pays at several rows and for a prefill. Per-token acceptance
  by the 1.5B at T = 1 (sum of min(p, q), teacher-forced on its greedy continuations of 6
  ShareGPT prompts): 0.808 against 0.808 in fp32 and 0.794 on int4. Activations are quantized per
  row (each row scaled to [-1, 1] before the kernel's per-call quantization, the scale
  multiplied back after): quantized over a whole call, one row's outliers would coarsen every
  row. Without VNNI (an AVX2-only EPYC, for one) fbgemm multiplies with ``vpmaddubsw``, whose
  16-bit pair sums saturate on 8-bit activations (a probe of 64 products of 127 x 255 came back
  as 32.4 instead of 64), so there the activations take 7 bits (the kernel's ``reduce_range``,
  which keeps every pair sum in range): :func:`w8a8_activation_levels` probes the kernel once.

The integer copies pad shapes their kernels cannot take (input features to a multiple of 32,
int4's output features to 16) with zero weights.

Every copy computes ``x @ weight.T + bias`` for ``x`` ``[rows, in_features]`` fp32 and returns
fp32 ``[rows, out_features]``.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from typing import Callable, Mapping

import torch
import torch.nn.functional as F

__all__ = [
    "INT4_GROUP_SIZE",
    "WEIGHT_COPIES",
    "HalfCopy",
    "Int4Copy",
    "Int8Copy",
    "W8A8Copy",
    "WeightCopy",
    "WeightCopyKind",
    "COPY_MIXES",
    "build_weight_copy",
    "single_row_copy",
    "w8a8_activation_levels",
]

# Input features sharing one int4 scale and zero point (GGUF's Q4_0 / Q4_1 block size).
INT4_GROUP_SIZE = 32
# The int4 kernel packs output features in tiles of 16.
_INT4_OUT_MULTIPLE = 16
# The int8 kernel reads input features in blocks: torch 2.13's crashes (a segmentation fault, not
# an error) on in_features = 72, so every integer copy pads the input features to 32.
_INT_IN_MULTIPLE = 32
# torch's int4 CPU kernel dequantizes q in [0, 15] as (q - 8) * scale + zero.
_INT4_MID = 8


class WeightCopy:
    """A weight ``[out, in]`` (and bias ``[out]``) held in a reduced precision.

    ``__call__(x)``: ``x`` ``[rows, in]`` fp32 -> ``[rows, out]`` fp32, or None when this copy's
    product is unusable for that input (an fp16 overflow); the caller then uses fp32 weights.
    """

    in_features: int
    out_features: int

    def __call__(self, x: torch.Tensor) -> torch.Tensor | None:
        raise NotImplementedError


def _check_weight(weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    if weight.dim() != 2 or weight.dtype != torch.float32 or weight.device.type != "cpu":
        raise ValueError(f"weight must be a 2-D CPU float32 tensor, got {tuple(weight.shape)} {weight.dtype} "
                         f"on {weight.device}")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"bias must have shape ({weight.shape[0]},), got {tuple(bias.shape)}")


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _int8_channel_scale(weight: torch.Tensor) -> torch.Tensor:
    """Symmetric int8 scale per output channel of ``weight`` ``[out, in]``: its largest magnitude
    over 127 (an all-zero row gets 1 and stays zero)."""
    scale = weight.abs().amax(dim=1) / 127.0
    return torch.where(scale > 0, scale, torch.ones_like(scale))


class _IntegerCopy(WeightCopy):
    """Shared by the integer copies: the weight padded with zeros to the kernel's shapes (the
    input padded with zero features at call time, the padding cut from the output), bias in fp32."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, out_multiple: int) -> None:
        _check_weight(weight, bias)
        self.out_features, self.in_features = weight.shape
        self.in_padding = _round_up(self.in_features, _INT_IN_MULTIPLE) - self.in_features
        out_padding = _round_up(self.out_features, out_multiple) - self.out_features
        self.padded_weight = F.pad(weight.detach(), (0, self.in_padding, 0, out_padding))
        self.bias = None if bias is None else bias.detach().float()

    def _product(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` ``[rows, in_padded]`` bf16 -> ``[rows, out_padded]``."""
        raise NotImplementedError

    def __call__(self, x: torch.Tensor) -> torch.Tensor | None:
        x = x.to(torch.bfloat16)
        if self.in_padding:
            x = F.pad(x, (0, self.in_padding))
        out = self._product(x)[:, :self.out_features].float()
        return out if self.bias is None else out + self.bias


class HalfCopy(WeightCopy):
    """The weight and bias cast to ``dtype`` (``torch.bfloat16`` or ``torch.float16``)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> None:
        if dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"dtype must be torch.bfloat16 or torch.float16, got {dtype}")
        _check_weight(weight, bias)
        self.dtype = dtype
        self.out_features, self.in_features = weight.shape
        self.weight = weight.detach().to(dtype)
        self.bias = None if bias is None else bias.detach().to(dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor | None:
        out = F.linear(x.to(self.dtype), self.weight, self.bias)
        if self.dtype == torch.float16 and not bool(torch.isfinite(out).all()):
            return None  # fp16's range is +-65504: an overflow is recomputed in fp32
        return out.float()


class Int8Copy(_IntegerCopy):
    """Symmetric per-output-channel int8: ``weight ~ int8 [out, in] * scale [out]``."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__(weight, bias, out_multiple=1)
        weight = self.padded_weight
        scale = _int8_channel_scale(weight)
        self.weight = torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8)
        self.scale = scale.to(torch.bfloat16)
        del self.padded_weight

    def _product(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int8pack_mm(x, self.weight, self.scale)


class Int4Copy(_IntegerCopy):
    """Asymmetric int4 in groups of :data:`INT4_GROUP_SIZE` input features.

    Per group of one output row: ``scale = (max - min) / 15``, ``q = round((w - min) / scale)`` in
    [0, 15], stored in torch's packed int4 CPU layout; scales and zero points ``[in / 32, out, 2]``
    in bf16, dequantized by the kernel as ``(q - 8) * scale + zero`` with ``zero = min + 8 scale``.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__(weight, bias, out_multiple=_INT4_OUT_MULTIPLE)
        out_padded, in_padded = self.padded_weight.shape
        groups = self.padded_weight.reshape(out_padded, in_padded // INT4_GROUP_SIZE, INT4_GROUP_SIZE)
        low, high = groups.amin(dim=-1), groups.amax(dim=-1)
        scale = (high - low) / 15.0
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # a constant group: q = 0 is exact
        q = torch.round((groups - low[..., None]) / scale[..., None]).clamp(0, 15).to(torch.int32)
        self.weight = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.reshape(out_padded, in_padded), 1)
        zero = low + _INT4_MID * scale
        self.scales_and_zeros = torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous().to(torch.bfloat16)
        del self.padded_weight

    def _product(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.weight, INT4_GROUP_SIZE, self.scales_and_zeros)


def _w8a8_prepack(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fbgemm's packed int8 weight for ``weight`` ``[out, in]`` fp32 at per-row ``scale`` ``[out]``."""
    zero_points = torch.zeros(weight.shape[0], dtype=torch.long)
    with warnings.catch_warnings():
        # torch marks its quantized tensor types deprecated; fbgemm's packed weight is built from
        # one and is what its integer kernel reads.
        warnings.simplefilter("ignore", UserWarning)
        quantized = torch.quantize_per_channel(weight, scale, zero_points, 0, torch.qint8)
    return torch.ops.quantized.linear_prepack(quantized, None)


@functools.cache
def w8a8_activation_levels() -> int:
    """255 where fbgemm's dynamic int8 product is exact on 8-bit activations, 127 (7 bits, its
    ``reduce_range``) where it saturates (no VNNI: module docstring).

    The probe: weights all 127 (scale 1/127) against activations all at the top of their range,
    64 products summing to 64.0; a kernel adding pairs in 16 bits returns about half.
    """
    packed = _w8a8_prepack(torch.ones(8, 64), torch.full((8,), 1 / 127))
    out = torch.ops.quantized.linear_dynamic(torch.ones(1, 64), packed, False)
    return 255 if torch.allclose(out, torch.full_like(out, 64.0), rtol=1e-2) else 127


class W8A8Copy(WeightCopy):
    """int8 weights ``weight ~ int8 [out, in] * scale [out]`` (symmetric per output channel) in
    fbgemm's packed layout, activations quantized per row at each call to
    :func:`w8a8_activation_levels` levels (module docstring); bias added in fp32."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        _check_weight(weight, bias)
        self.out_features, self.in_features = weight.shape
        self.packed = _w8a8_prepack(weight.detach(), _int8_channel_scale(weight.detach()))
        self.bias = None if bias is None else bias.detach().float()
        self.activation_levels = w8a8_activation_levels()

    @property
    def reduce_range(self) -> bool:
        """7-bit activations: where the kernel's 16-bit pair sums would saturate on 8."""
        return self.activation_levels < 255

    def stored_weight(self) -> torch.Tensor:
        """The fp32 weight ``[out, in]`` the packed int8 weight stands for."""
        return torch.ops.quantized.linear_unpack(self.packed)[0].dequantize()

    def __call__(self, x: torch.Tensor) -> torch.Tensor | None:
        x = x.float()
        if x.shape[0] == 1:  # one row: the kernel's per-call quantization is per row already
            out = torch.ops.quantized.linear_dynamic(x, self.packed, self.reduce_range)
        else:
            reach = x.abs().amax(dim=1, keepdim=True)
            reach = torch.where(reach > 0, reach, torch.ones_like(reach))
            out = torch.ops.quantized.linear_dynamic(x / reach, self.packed, self.reduce_range) * reach
        return out if self.bias is None else out + self.bias


@dataclass(frozen=True)
class WeightCopyKind:
    """One entry of :data:`WEIGHT_COPIES`.

    Fields:
        name: as ``--drafter-precision`` spells it.
        bits: bits per weight, scales excluded (what a memory-bound row reads).
        build: ``(weight [out, in] fp32, bias [out] or None) -> WeightCopy``.
        rows: ``(first, last)``, the row counts a drafter's calls take the copy for by default
            (``last`` None: every count from ``first``): where one forward of
            Qwen2.5-Coder-0.5B on it was measured faster than on oneDNN's packed fp32 weights
            (``benchmarks/results/drafter_step_qwen2.5-coder-0.5b_copies.md``, 2 threads: int4
            up to 16 rows, int8 up to 8, the half copies one row; w8a8 every count: faster than
            packed fp32 from 1 to 256 rows, module docstring).
    """

    name: str
    bits: int
    build: Callable[[torch.Tensor, torch.Tensor | None], WeightCopy]
    rows: tuple[int, int | None] = (1, 1)


WEIGHT_COPIES: Mapping[str, WeightCopyKind] = {
    "bf16": WeightCopyKind("bf16", 16, lambda w, b: HalfCopy(w, b, torch.bfloat16)),
    "fp16": WeightCopyKind("fp16", 16, lambda w, b: HalfCopy(w, b, torch.float16)),
    "int8": WeightCopyKind("int8", 8, Int8Copy, rows=(1, 8)),
    "int4": WeightCopyKind("int4", 4, Int4Copy, rows=(1, 16)),
    "w8a8": WeightCopyKind("w8a8", 8, W8A8Copy, rows=(1, None)),
}


# Drafter precisions that read a different copy for different row counts: ``(kind, (first, last))``
# parts, each a :data:`WEIGHT_COPIES` kind and the row counts it serves (inclusive, ``last`` None:
# open-ended; other counts read the fp32 weights). ``int4+w8a8``: a drafting step's single row (and
# up to 3) on int4, the fewest bytes; every call of 4 rows or more (a small model's check of a
# lookup's copies, a prefill) on w8a8, whose integer kernel grows slowly with the rows while int4's
# grows about linearly. One forward of Qwen2.5-Coder-0.5B on the AVX-512 EPYC, 2 threads (ms,
# int4 / w8a8; docs/cpu.md): 1 row 26 / 31, 3 rows 33 / 36, 4 rows 37 / 37, 9 rows 90 / 52.
COPY_MIXES: Mapping[str, tuple[tuple[str, tuple[int, int | None]], ...]] = {
    "int4+w8a8": (("int4", (1, 3)), ("w8a8", (4, None))),
}


def single_row_copy(name: str) -> str:
    """The :data:`WEIGHT_COPIES` kind that serves a single row (a drafting step) under ``name``, a
    kind or a :data:`COPY_MIXES` mix: what a drafter's proposals are computed on."""
    for kind, (first, last) in COPY_MIXES.get(name, ((name, (1, 1)),)):
        if first == 1:
            return kind
    raise ValueError(f"{name!r} serves no single row from a copy")


def build_weight_copy(kind: str, weight: torch.Tensor, bias: torch.Tensor | None = None) -> WeightCopy:
    """A :data:`WEIGHT_COPIES` ``kind`` copy of ``weight`` ``[out, in]`` fp32 (and ``bias`` ``[out]``)."""
    if kind not in WEIGHT_COPIES:
        raise ValueError(f"kind must be one of {', '.join(WEIGHT_COPIES)}, got {kind!r}")
    return WEIGHT_COPIES[kind].build(weight, bias)
