"""Decoder building blocks over shared HF parameters, and the cache-aware attention mask.

Shapes: ``B`` rows, ``T`` new tokens per row, ``D`` hidden size, ``H`` query heads, ``H_kv``
K/V heads, ``G = H / H_kv``, ``Dh`` head dim, ``W`` attended key slots, ``n`` layers in a range.

Grouped-query attention folds the ``G`` query heads that share a K/V head into the query-length
axis (``[B, H_kv, G*T, Dh]``), so K/V are read straight from the cache and never repeated; the
mask is folded the same way (:func:`fold_groups`).

:class:`PackedLinear` runs a projection through oneDNN with its weight reordered once
(``torch.ops.mkldnn``, CPU float32). On CPUs whose BLAS treats a few-row matrix product as that
many matrix-vector products, verifying K + 1 tokens costs K + 1 single-token forwards; the packed
kernel computes 5-8 rows for about twice the price of one (``benchmarks/README.md``, "Runtime
cost per round").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from sglang_hsd.runtime.kv_cache import KVCache
from sglang_hsd.runtime.weight_copies import COPY_MIXES, WEIGHT_COPIES, build_weight_copy

__all__ = [
    "Attention",
    "CopyRowsLinear",
    "DecoderLayer",
    "PackedLinear",
    "PackedRows",
    "RMSNorm",
    "SwiGLU",
    "apply_rotary",
    "build_attention_mask",
    "fold_groups",
    "pack_linear_weight",
    "packed_linear",
    "packed_linear_supported",
]

# Rows the packed weight layout is tuned for: a verification forward of a few-token draft.
_PACK_ROWS_HINT = 8
# oneDNN's call costs ~0.1 ms more than a BLAS matrix-vector product: one row takes F.linear.
# Measured per shape, the row counts that gain come from a kernel table (runtime/kernel_paths.py).
_PACKED_MIN_ROWS = 2


@dataclass(frozen=True)
class PackedRows:
    """Row counts for which :class:`PackedLinear` takes the packed kernel.

    ``ranges``: ``(first, last)`` pairs, inclusive, ``last = None`` open-ended; a call with ``rows``
    rows (all leading dimensions flattened) is packed when some range holds it. The default packs
    every call of ``_PACKED_MIN_ROWS`` rows or more.
    """

    ranges: tuple[tuple[int, int | None], ...] = ((_PACKED_MIN_ROWS, None),)

    def __post_init__(self) -> None:
        for first, last in self.ranges:
            if first < 1 or (last is not None and last < first):
                raise ValueError(f"ranges must be (first >= 1, last >= first or None) pairs, got {self.ranges}")

    def __contains__(self, rows: int) -> bool:
        return any(first <= rows and (last is None or rows <= last) for first, last in self.ranges)


def packed_linear_supported(linear: nn.Module) -> bool:
    """Whether :class:`PackedLinear` can wrap ``linear`` (a CPU float32 ``nn.Linear``, oneDNN built in)."""
    return (
        isinstance(linear, nn.Linear)
        and linear.weight.dtype == torch.float32
        and linear.weight.device.type == "cpu"
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


def pack_linear_weight(weight: torch.Tensor) -> torch.Tensor:
    """oneDNN's pre-packed copy of a CPU float32 ``weight`` ``[out, in]`` (as much memory again)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), _PACK_ROWS_HINT)


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ weight.T + bias`` through the packed copy: ``x`` ``[rows, in]`` fp32 -> ``[rows, out]``."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, None if bias is None else bias.detach(),
                                              "none", [], "")


class PackedLinear(nn.Module):
    """An ``nn.Linear`` whose weight is also kept pre-packed for oneDNN (inference only).

    The wrapped module keeps the shared HF parameters (``weight``, ``bias``); the packed copy
    costs as much memory again and is rebuilt when the weight is changed in place (except for
    weights created under inference mode, which carry no version counter). Inputs that need
    gradients, or are not CPU float32, take the plain ``F.linear`` path, and so does any row count
    outside ``packed_rows`` (default: a single row, see ``_PACKED_MIN_ROWS``; a measured table gives
    per-shape ranges, ``runtime/kernel_paths.py``). ``padding`` (a ``runtime.row_padding.RowPadding``,
    set by ``CausalLM.pack_linears``; None: none) runs a packed call of few rows with zero rows
    appended where a larger row count measured cheaper.
    """

    def __init__(self, linear: nn.Linear, packed_rows: PackedRows = PackedRows()) -> None:
        super().__init__()
        if not packed_linear_supported(linear):
            raise ValueError("linear must be a CPU float32 nn.Linear and torch must be built with oneDNN")
        if not isinstance(packed_rows, PackedRows):
            raise ValueError(f"packed_rows must be a PackedRows, got {type(packed_rows).__name__}")
        self.linear = linear
        self.packed_rows = packed_rows
        self.padding = None
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self._pack()

    def _pack(self) -> None:
        self._packed_version = self._weight_version()
        self._packed = pack_linear_weight(self.linear.weight)

    def _weight_version(self) -> int | None:
        # The version counter tells when the shared weight was changed in place, so a stale packed
        # copy is rebuilt. Tensors created under inference mode have none (not tracked).
        weight = self.linear.weight
        return None if weight.is_inference() else weight._version

    @property
    def weight(self) -> nn.Parameter:
        return self.linear.weight

    @property
    def bias(self) -> nn.Parameter | None:
        return self.linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., in_features]`` -> ``[..., out_features]``."""
        if x.dtype != torch.float32 or x.device.type != "cpu" or (torch.is_grad_enabled() and x.requires_grad):
            return self.linear(x)
        flat = x.reshape(-1, self.in_features)
        if flat.shape[0] not in self.packed_rows:
            return self.linear(x)
        if self._weight_version() != self._packed_version:
            self._pack()
        if self.padding is None:
            out = packed_linear(flat, self._packed, self.linear.bias)
        else:
            out = self.padding.run(flat, lambda rows: packed_linear(rows, self._packed, self.linear.bias))
        return out.view(*x.shape[:-1], self.out_features)


class CopyRowsLinear(nn.Module):
    """A drafter's projection whose calls of some row counts read a reduced-precision weight copy.

    A few-row product is bound by reading the weight, so a copy of fewer bytes
    (:mod:`~sglang_hsd.runtime.weight_copies`: bf16, fp16, int8, int4, w8a8) makes it faster; ``inner``
    (the fp32 ``nn.Linear`` or :class:`PackedLinear`) serves every other row count, and a product
    the copy reports unusable (an fp16 overflow). Activations stay fp32 outside the product. This
    changes the numbers, so it is only for a separate draft model: the verifier uses the
    probabilities the drafter actually produced, and the output law does not depend on them
    (never wrap a target's layers).

    Args:
        inner: the fp32 projection, kept for the other row counts (and its shared parameters).
        kind: a ``WEIGHT_COPIES`` name.
        rows: the row counts the copy serves (None: the kind's default, ``WeightCopyKind.rows``).
    """

    def __init__(self, inner: nn.Module, kind: str, rows: PackedRows | None = None) -> None:
        super().__init__()
        weight = inner.weight
        if weight.dtype != torch.float32 or weight.device.type != "cpu":
            raise ValueError(f"inner must be a CPU float32 linear, got {weight.dtype} on {weight.device}")
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.copy = build_weight_copy(kind, weight, inner.bias)
        self.inner, self.kind = inner, kind
        self.rows = PackedRows((WEIGHT_COPIES[kind].rows,)) if rows is None else rows

    @property
    def weight(self) -> nn.Parameter:
        return self.inner.weight

    @property
    def bias(self) -> nn.Parameter | None:
        return self.inner.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., in_features]`` fp32 -> ``[..., out_features]`` fp32."""
        if x.dtype != torch.float32 or (torch.is_grad_enabled() and x.requires_grad):
            return self.inner(x)
        flat = x.reshape(-1, self.in_features)
        if flat.shape[0] not in self.rows:
            return self.inner(x)
        out = self.copy(flat)
        if out is None:
            return self.inner(x)
        return out.view(*x.shape[:-1], self.out_features)


def with_weight_copy(module: nn.Module, name: str | None, rows: PackedRows | None = None) -> nn.Module:
    """``module`` (a projection; any :class:`CopyRowsLinear` around it removed) reading the copies
    ``name`` names: a ``WEIGHT_COPIES`` kind on ``rows`` (None: the kind's default rows), a
    ``COPY_MIXES`` mix on each part's own rows (one :class:`CopyRowsLinear` per part, the first
    outermost), or None: the bare projection."""
    while isinstance(module, CopyRowsLinear):
        module = module.inner
    if name is None:
        return module
    if name not in COPY_MIXES:
        return CopyRowsLinear(module, name, rows)
    if rows is not None:
        raise ValueError(f"rows: the mix {name!r} names its parts' rows itself, got {rows}")
    for kind, part_rows in reversed(COPY_MIXES[name]):
        module = CopyRowsLinear(module, kind, PackedRows((part_rows,)))
    return module


class RMSNorm(nn.Module):
    """RMSNorm computed in float32, sharing its ``weight`` with the wrapped HF norm."""

    def __init__(self, weight: nn.Parameter, eps: float) -> None:
        super().__init__()
        self.weight = weight
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: ``[..., D]`` -> ``[..., D]``, same dtype."""
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[B, T, heads, Dh]`` by ``cos``/``sin`` ``[B, T, Dh]`` (half-split layout)."""
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    return x * cos + _rotate_half(x) * sin


class Attention(nn.Module):
    """Grouped-query self-attention over a :class:`KVCache`, projections shared with HF."""

    def __init__(self, hf_attn: nn.Module, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
        super().__init__()
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            if not isinstance(getattr(hf_attn, name, None), nn.Linear):
                raise ValueError(f"self_attn.{name} must be an nn.Linear (quantized weights are unsupported)")
        self.q_proj, self.k_proj = hf_attn.q_proj, hf_attn.k_proj
        self.v_proj, self.o_proj = hf_attn.v_proj, hf_attn.o_proj
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.groups = num_heads // num_kv_heads

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        cache: KVCache,
        layer: int,
        slots: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """One attention block.

        Args:
            x: ``[B, T, D]`` normed hidden states.
            rope: ``(cos, sin)``, each ``[B, T, Dh]``.
            cache, layer: where K/V live; new K/V are written at ``slots`` ``LongTensor[B, T]``.
            mask: ``BoolTensor[B, 1, G*T, W]``, True = may attend (already group-folded).

        Returns:
            ``[B, T, D]``.
        """
        batch, seq, _ = x.shape
        q = self.q_proj(x).view(batch, seq, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(batch, seq, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(batch, seq, self.num_kv_heads, self.head_dim)
        q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        cache.write(layer, k, v, slots)
        keys, values = cache.window(layer, mask.shape[-1])  # [B, H_kv, W, Dh]

        # Fold the G query heads sharing a K/V head into the query axis: [B, H_kv, G*T, Dh].
        q = q.view(batch, seq, self.num_kv_heads, self.groups, self.head_dim)
        q = q.permute(0, 2, 3, 1, 4).reshape(batch, self.num_kv_heads, self.groups * seq, self.head_dim)
        out = F.scaled_dot_product_attention(
            q, keys.to(q.dtype), values.to(q.dtype), attn_mask=mask, scale=self.head_dim**-0.5
        )
        out = out.view(batch, self.num_kv_heads, self.groups, seq, self.head_dim)
        out = out.permute(0, 3, 1, 2, 4).reshape(batch, seq, self.num_heads * self.head_dim)
        return self.o_proj(out)


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))`` with the HF projections shared."""

    def __init__(self, hf_mlp: nn.Module) -> None:
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = hf_mlp.gate_proj, hf_mlp.up_proj, hf_mlp.down_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, T, D]`` -> ``[B, T, D]``."""
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm block: ``h + attn(norm(h))``, then ``h + mlp(norm(h))``."""

    def __init__(self, hf_layer: nn.Module, config, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
        super().__init__()
        eps = config.rms_norm_eps
        self.input_norm = RMSNorm(hf_layer.input_layernorm.weight, eps)
        self.attn = Attention(hf_layer.self_attn, num_heads, num_kv_heads, head_dim)
        self.post_attn_norm = RMSNorm(hf_layer.post_attention_layernorm.weight, eps)
        self.mlp = SwiGLU(hf_layer.mlp)

    def forward(self, h, rope, cache, layer, slots, mask) -> torch.Tensor:
        """``h``: ``[B, T, D]`` -> ``[B, T, D]``; other args as in :meth:`Attention.forward`."""
        h = h + self.attn(self.input_norm(h), rope, cache, layer, slots, mask)
        return h + self.mlp(self.post_attn_norm(h))


def build_attention_mask(
    lengths: torch.Tensor,
    num_new: torch.Tensor,
    seq_len: int,
    kv_len: int,
    attn_mask: torch.Tensor | None,
    mask_prefix: torch.Tensor | None = None,
) -> torch.Tensor:
    """Boolean attention masks of ``n`` layers over key slots ``[0, kv_len)``.

    Args:
        lengths: ``LongTensor[n, B]``, old cache length of each layer in the range.
        num_new: ``LongTensor[B]``, valid new tokens per row.
        seq_len: ``T``.
        kv_len: ``W``, at least ``max(lengths + num_new)``.
        attn_mask: ``BoolTensor[B, T, P + T]`` (True = may attend) over the last ``P`` cached
            slots and the new tokens, or None for causal (then ``P = 0``).
        mask_prefix: ``LongTensor[B]``, per row how many of the last cached slots ``attn_mask``
            governs (``P_b <= P``, the rest of its first ``P`` columns unused), default 0: the
            slots of draft-tree nodes written by earlier forwards of the same tree.

    Returns:
        ``BoolTensor[n, B, T, W]``. Query ``t`` of row ``b`` may see slot ``j < L0 - P_b`` and
        slot ``L0 - P_b + c`` when ``attn_mask[b, t, c]`` (``c < P_b + num_new[b]``). Padding
        queries see only slot 0 so that no softmax row is empty (their outputs are finite and
        unspecified).
    """
    device = lengths.device
    prefix = torch.zeros_like(num_new) if mask_prefix is None else mask_prefix
    slot = torch.arange(kv_len, device=device)  # [W]
    query = torch.arange(seq_len, device=device)  # [T]
    rel = slot - (lengths - prefix[None, :])[..., None]  # [n, B, W]: column of attn_mask
    cached = (rel < 0)[:, :, None, :]  # [n, B, 1, W]
    governed = ((rel >= 0) & (rel < (prefix + num_new)[None, :, None]))[:, :, None, :]
    if attn_mask is None:
        allowed = rel[:, :, None, :] <= query[None, None, :, None]  # [n, B, T, W]
    else:
        columns = attn_mask.shape[-1]
        index = rel.clamp(0, columns - 1)[:, :, None, :].expand(-1, -1, seq_len, -1)
        allowed = attn_mask[None].expand(lengths.shape[0], -1, -1, -1).gather(-1, index)
    mask = cached | (governed & allowed)
    valid_query = (query[None, :] < num_new[:, None])[None, :, :, None]  # [1, B, T, 1]
    return torch.where(valid_query, mask, slot == 0)


def fold_groups(mask: torch.Tensor, groups: int) -> torch.Tensor:
    """``[n, B, T, W]`` -> ``[n, B, 1, G*T, W]``, matching the group-folded queries."""
    n, batch, seq, kv_len = mask.shape
    return mask[:, :, None, None].expand(n, batch, 1, groups, seq, kv_len).reshape(n, batch, 1, groups * seq, kv_len)
