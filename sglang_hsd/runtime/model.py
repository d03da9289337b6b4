"""Compact causal-LM forward over HF Llama-family weights, with layer-range execution.

The early-exit verifier runs the target's first ``L_i`` layers plus an exit head; the full
verifier later runs only layers ``[L_i, N)`` on the saved hidden states, reusing the K/V the
early layers already wrote. :meth:`CausalLM.forward_layers` is the primitive for both: it runs
any layer range ``[start, end)`` against a :class:`KVCache` whose layers may hold different
numbers of positions.

Shapes: ``B`` rows, ``T`` new tokens per row (right-padded; ``num_new[b]`` are valid), ``D``
hidden size, ``V`` vocabulary, ``H`` query heads, ``H_kv`` K/V heads, ``G = H / H_kv``,
``Dh`` head dim, ``W`` attended key slots (the longest valid prefix in the call).

Attention per layer ``l`` and row ``b`` (old length ``L0 = cache.lengths[l, b]``): new token
``t`` is written at slot ``L0 + t`` and its query sees every slot ``< L0`` plus the new tokens
``t'`` with ``attn_mask[b, t, t']`` (causal by default). Grouped-query attention folds the
``G`` query heads of a K/V head into the query-length axis, so K/V are never repeated.

Numerics follow transformers' Llama/Qwen2 eager code: RMSNorm in float32, rotary tables in
float32 then cast to the activation dtype, ``1/sqrt(Dh)`` attention scale.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch
from torch import nn

from sglang_hsd.runtime.kv_cache import KVCache
from sglang_hsd.runtime.row_padding import (MIN_MEASURED_BYTES, NO_PADDING, PADDING_CHOICES, decode_forward,
                                            forward_row_padding)
from sglang_hsd.runtime.layers import (CopyRowsLinear, DecoderLayer, PackedLinear, PackedRows, RMSNorm,
                                       build_attention_mask, fold_groups, packed_linear_supported, with_weight_copy)

__all__ = ["SUPPORTED_ARCHITECTURES", "CausalLM", "ForwardCounters"]

# HF architectures whose decoder block is exactly: RMSNorm -> rotary GQA attention (optional
# qkv bias) -> residual -> RMSNorm -> SwiGLU MLP -> residual, under the same attribute names.
SUPPORTED_ARCHITECTURES: frozenset[str] = frozenset(
    {"LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM"}
)
# Rope types whose inverse frequencies depend on the run-time sequence length.
_UNSUPPORTED_ROPE_TYPES = frozenset({"dynamic", "longrope"})


@dataclasses.dataclass
class ForwardCounters:
    """Work done by a :class:`CausalLM`, for cost accounting of speculative decoding.

    Attributes:
        layer_token_forwards: sum over ``forward_layers`` calls of
            ``(end - start) * sum(num_new)`` (padding tokens are not counted).
        lm_head_tokens: positions projected by the default exit head (final norm + lm_head),
            padding included (``exit_logits`` does not know which positions are padding).
        exit_head_tokens: positions mapped by a custom ``exit_head`` passed to ``exit_logits``.
        calls: number of ``forward_layers`` calls.
    """

    layer_token_forwards: int = 0
    lm_head_tokens: int = 0
    exit_head_tokens: int = 0
    calls: int = 0

    def reset(self) -> None:
        for field in dataclasses.fields(self):
            setattr(self, field.name, 0)

    def snapshot(self) -> "ForwardCounters":
        return dataclasses.replace(self)


def _check_hf_config(hf_model: nn.Module) -> None:
    config = hf_model.config
    archs = set(getattr(config, "architectures", None) or []) | {type(hf_model).__name__}
    if not archs & SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"hf_model architecture {sorted(archs)} is unsupported; supported: {sorted(SUPPORTED_ARCHITECTURES)}"
        )
    if getattr(config, "hidden_act", "silu") != "silu":
        raise ValueError(f"hf_model.config.hidden_act must be 'silu' (SwiGLU), got {config.hidden_act!r}")
    layer_types = getattr(config, "layer_types", None) or []
    if getattr(config, "sliding_window", None) is not None and (
        getattr(config, "use_sliding_window", True) or any(t != "full_attention" for t in layer_types)
    ):
        raise ValueError("hf_model uses sliding-window attention, which is unsupported")
    rope_type = getattr(hf_model.model.rotary_emb, "rope_type", "default")
    if rope_type in _UNSUPPORTED_ROPE_TYPES:
        raise ValueError(f"hf_model rope_type {rope_type!r} is unsupported (length-dependent frequencies)")


class CausalLM(nn.Module):
    """Llama / Qwen2 / Mistral (any HF model with the same block: RMSNorm, rotary, GQA,
    SwiGLU MLP, optional qkv bias, tied or untied lm_head) re-implemented over the HF weights.

    Parameters are shared with the HF model, not copied. Call under ``torch.inference_mode()``
    for decoding (the cache must be created under the same mode it is used in).
    """

    def __init__(self, hf_model: nn.Module) -> None:
        super().__init__()
        _check_hf_config(hf_model)
        config = hf_model.config
        self.config = config
        self.num_layers: int = config.num_hidden_layers
        self.hidden_size: int = config.hidden_size
        self.vocab_size: int = config.vocab_size
        self.num_heads: int = config.num_attention_heads
        self.num_kv_heads: int = config.num_key_value_heads
        self.head_dim: int = getattr(config, "head_dim", None) or self.hidden_size // self.num_heads
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_attention_heads {self.num_heads} not divisible by num_key_value_heads")
        base = hf_model.model
        self.embed_tokens = base.embed_tokens
        self.layers = nn.ModuleList(
            DecoderLayer(layer, config, self.num_heads, self.num_kv_heads, self.head_dim)
            for layer in base.layers[: self.num_layers]
        )
        self.norm = RMSNorm(base.norm.weight, config.rms_norm_eps)
        self.lm_head = hf_model.lm_head
        self.row_padding, self._measured_padding = NO_PADDING, {}  # pack_linears: in use; per thread count
        rotary = base.rotary_emb
        self.register_buffer("inv_freq", rotary.inv_freq.detach().float().clone(), persistent=False)
        self.rope_scaling: float = float(rotary.attention_scaling)
        self.counters = ForwardCounters()

    @classmethod
    def from_hf(cls, hf_model: nn.Module) -> "CausalLM":
        """Wrap a transformers ``*ForCausalLM`` (parameters shared)."""
        return cls(hf_model)

    @classmethod
    def from_pretrained(cls, path: str, dtype: torch.dtype = torch.float32) -> "CausalLM":
        """Load ``path`` with ``transformers.AutoModelForCausalLM`` (eager attention) and wrap it."""
        from transformers import AutoModelForCausalLM

        hf_model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager")
        return cls.from_hf(hf_model.eval())

    def _linear_slots(self) -> list[tuple[nn.Module, str]]:
        """``(owner, name)`` of every projection and the LM head, looking through a
        :class:`CopyRowsLinear` s to the fp32 module they keep (``(wrapper, "inner")``)."""
        slots = []
        for owner, name in self._outer_slots():
            while isinstance(getattr(owner, name), CopyRowsLinear):  # a mix nests one per part
                owner, name = getattr(owner, name), "inner"
            slots.append((owner, name))
        return slots

    def _outer_slots(self) -> list[tuple[nn.Module, str]]:
        """``(owner, name)`` of every projection and the LM head, as the forward calls them."""
        slots = [(self, "lm_head")]
        for layer in self.layers:
            slots += [(layer.attn, name) for name in ("q_proj", "k_proj", "v_proj", "o_proj")]
            slots += [(layer.mlp, name) for name in ("gate_proj", "up_proj", "down_proj")]
        return slots

    def unpack_linears(self) -> None:
        """Undo :meth:`pack_linears`: back to the plain HF ``nn.Linear`` modules (frees the copies)."""
        for owner, name in self._linear_slots():
            module = getattr(owner, name)
            if isinstance(module, PackedLinear):
                setattr(owner, name, module.linear)
        self.row_padding = NO_PADDING

    def pack_linears(self, packed_rows: Callable[[int, int], PackedRows] | None = None,
                     row_padding: str = "auto") -> bool:
        """Run every projection and the LM head through :class:`PackedLinear` (oneDNN, CPU float32).

        Idempotent. Parameters stay shared with the HF model; the packed copies take as much
        memory again as the linear weights (exit heads read the LM head: they run packed too).
        ``packed_rows``: ``(in_features, out_features) -> PackedRows``, the row counts each shape
        runs packed (e.g. ``KernelTable.packed_rows`` of ``runtime/kernel_paths.py``); a shape with
        no packed rows stays a plain ``nn.Linear`` (no copy). None: every call of 2 rows or more.
        Linears packed earlier keep their ranges (:meth:`unpack_linears` first to change them).
        Rows on a weight copy (:meth:`set_weight_copy`) keep serving their rows.
        ``row_padding``: ``auto`` pads packed calls of 1-3 rows where a forward of 4 rows measured
        cheaper (``row_padding.forward_row_padding``: about 4 s for a 1.5B, once per thread count;
        :attr:`row_padding` holds it); ``off`` never pads. Returns whether the linears are packed
        afterwards (``False``: unsupported dtype, device or torch build; nothing changed).
        """
        if row_padding not in PADDING_CHOICES:
            raise ValueError(f"row_padding must be one of {', '.join(PADDING_CHOICES)}, got {row_padding!r}")
        todo = [(owner, name) for owner, name in self._linear_slots()
                if not isinstance(getattr(owner, name), PackedLinear)]
        if not all(packed_linear_supported(getattr(owner, name)) for owner, name in todo):
            return False
        for owner, name in todo:
            linear = getattr(owner, name)
            rows = PackedRows() if packed_rows is None else packed_rows(linear.in_features, linear.out_features)
            if rows.ranges:
                setattr(owner, name, PackedLinear(linear, rows))
        slots = [getattr(owner, name) for owner, name in self._linear_slots()]  # the LM head first
        packed = [module for module in slots if isinstance(module, PackedLinear)]
        # Measured unpadded, once per thread count; cache-resident models are not timed (row_padding.py).
        threads = torch.get_num_threads()
        if row_padding == "auto" and threads not in self._measured_padding and any(
                isinstance(m, PackedLinear) and m.weight.numel() * m.weight.element_size() >= MIN_MEASURED_BYTES
                for m in slots[1:]):
            for module in packed:
                module.padding = None
            self._measured_padding[threads] = forward_row_padding(decode_forward(self))
        self.row_padding = self._measured_padding.get(threads, NO_PADDING) if row_padding == "auto" else NO_PADDING
        for module in packed:
            module.padding = self.row_padding
        return True

    def packed_single_row_shapes(self) -> list[tuple[int, int]]:
        """``(in_features, out_features)`` of the linears whose single-row calls take oneDNN's
        packed kernel (distinct, sorted); every other shape's single rows run ``F.linear``. What
        :meth:`pack_linears` was given decides it (e.g. ``kernel_paths.single_row_split``'s
        measurement), so benchmarks record it next to their timings."""
        return sorted({(module.in_features, module.out_features) for owner, name in self._linear_slots()
                       if isinstance(module := getattr(owner, name), PackedLinear) and 1 in module.packed_rows})

    def set_weight_copy(self, kind: str | None, rows: PackedRows | None = None) -> None:
        """Projections' calls of ``rows`` rows (None: the kind's default ``WeightCopyKind.rows``,
        which includes one row, a drafting step at batch 1) on a ``kind`` copy of the weights
        (``layers.with_weight_copy``; a ``WEIGHT_COPIES`` name: bf16 and fp16 take half as much
        memory again as the linear weights, int8 a quarter, int4 an eighth; or a ``COPY_MIXES``
        mix, each part on its rows); None: back to fp32. Only for a separate draft model: it changes
        the model's numbers. Composes with :meth:`pack_linears` (other row counts).
        """
        for owner, name in self._outer_slots():
            setattr(owner, name, with_weight_copy(getattr(owner, name), kind, rows))

        # ---------------------------------------------------------------- pieces
    def new_cache(self, batch_size: int, max_len: int) -> KVCache:
        """An empty cache for ``batch_size`` rows of up to ``max_len`` positions."""
        weight = self.embed_tokens.weight
        return KVCache(
            self.num_layers, batch_size, self.num_kv_heads, self.head_dim, max_len, weight.dtype, weight.device
        )

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``LongTensor[B, T]`` -> ``[B, T, D]``."""
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [B, T], got {tuple(input_ids.shape)}")
        return self.embed_tokens(input_ids)

    def rotary(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``LongTensor[B, T]`` -> ``(cos, sin)``, each ``[B, T, Dh]`` in ``dtype``."""
        freqs = position_ids[..., None].float() * self.inv_freq
        angles = torch.cat((freqs, freqs), dim=-1)
        return (angles.cos() * self.rope_scaling).to(dtype), (angles.sin() * self.rope_scaling).to(dtype)

    def exit_logits(self, hidden: torch.Tensor, exit_head: nn.Module | None = None) -> torch.Tensor:
        """``[B, T, D]`` -> ``[B, T, V]``: final norm + lm_head ("logit lens"), or ``exit_head``."""
        if hidden.dim() != 3 or hidden.shape[-1] != self.hidden_size:
            raise ValueError(f"hidden must be [B, T, D={self.hidden_size}], got {tuple(hidden.shape)}")
        positions = hidden.shape[0] * hidden.shape[1]
        if exit_head is not None:
            self.counters.exit_head_tokens += positions
            return exit_head(hidden)
        self.counters.lm_head_tokens += positions
        return self.lm_head(self.norm(hidden))

    def forward(self, input_ids: torch.Tensor, cache: KVCache, num_new: torch.Tensor | None = None) -> torch.Tensor:
        """Embed + all layers + default exit head: ``LongTensor[B, T]`` -> logits ``[B, T, V]``."""
        hidden = self.forward_layers(self.embed(input_ids), 0, self.num_layers, cache, num_new)
        return self.exit_logits(hidden)

    # ----------------------------------------------------------- layer range
    def forward_layers(
        self,
        hidden: torch.Tensor,
        start: int,
        end: int,
        cache: KVCache,
        num_new: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
        mask_prefix: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Run layers ``[start, end)`` on ``T`` new tokens per row and append their K/V.

        Each layer ``l`` writes K/V of the valid new tokens at slots
        ``cache.lengths[l, b] .. + num_new[b] - 1`` and advances its length by ``num_new``.

        Args:
            hidden: ``[B, T, D]`` input hidden states (embeddings when ``start == 0``).
            start, end: layer range, ``0 <= start < end <= num_layers``.
            cache: the cache; its layers in the range may hold different lengths.
            num_new: ``LongTensor[B]`` valid tokens per row (the rest is right padding),
                default ``T``.
            position_ids: ``LongTensor[B, T]`` rotary positions, default
                ``cache.lengths_for(start)[:, None] + arange(T)``; draft trees pass depths.
            attn_mask: ``BoolTensor[B, T, P + T]``, True where new token ``t`` may attend column
                ``c``: for row b with prefix ``P_b`` (``mask_prefix``), column ``c < P_b`` is cached
                slot ``L0 - P_b + c`` and column ``P_b + t'`` new token ``t'`` (must include the
                diagonal; columns past ``P_b + T`` unused); default causal, ``P = 0``. Used for
                draft trees.
            mask_prefix: ``LongTensor[B]``, per row how many of the last cached slots of every
                layer in the range ``attn_mask`` governs (``<= P``; needs ``attn_mask``): the
                nodes an earlier forward of the same draft tree wrote, which a new node sees only
                if they are its ancestors. Default 0.

        Returns:
            ``[B, T, D]`` hidden states after layer ``end - 1`` (padding positions unspecified).

        Note: one host sync per call sizes the attended key window to the longest valid prefix
        (so cost grows with the current length, not ``max_len``) and checks capacity.
        """
        batch, seq = self._check_forward_args(hidden, start, end, cache)
        device = hidden.device
        num_new = self._check_num_new(num_new, batch, seq, device)
        lengths = cache.lengths[start:end]  # [n, B]
        kv_len, total_new = self._kv_window(lengths, num_new, seq, cache)
        if position_ids is None:
            position_ids = lengths[0][:, None] + torch.arange(seq, device=device)
        elif position_ids.shape != (batch, seq):
            raise ValueError(f"position_ids must be [B={batch}, T={seq}], got {tuple(position_ids.shape)}")
        prefix = self._check_mask(attn_mask, mask_prefix, lengths, num_new, batch, seq)

        rope = self.rotary(position_ids, hidden.dtype)
        masks = build_attention_mask(lengths, num_new, seq, kv_len, attn_mask, prefix)
        masks = fold_groups(masks, self.num_heads // self.num_kv_heads)
        new_index = torch.arange(seq, device=device)
        valid = (new_index[None, :] < num_new[:, None])[None]  # [1, B, T]
        # Per-layer write slots [n, B, T]; padding tokens go to the scratch slot.
        slots = torch.where(valid, lengths[..., None] + new_index, cache.scratch_slot)
        for offset, layer in enumerate(range(start, end)):
            hidden = self.layers[layer](hidden, rope, cache, layer, slots[offset], masks[offset])
        lengths += num_new[None, :]  # in place: advances cache.lengths[start:end]

        self.counters.layer_token_forwards += (end - start) * total_new
        self.counters.calls += 1
        return hidden

    def _check_forward_args(self, hidden: torch.Tensor, start: int, end: int, cache: KVCache) -> tuple[int, int]:
        if not (isinstance(start, int) and isinstance(end, int) and 0 <= start < end <= self.num_layers):
            raise ValueError(
                f"layer range must satisfy 0 <= start < end <= {self.num_layers}, got start={start}, end={end}"
            )
        if hidden.dim() != 3 or hidden.shape[-1] != self.hidden_size:
            raise ValueError(f"hidden must be [B, T, D={self.hidden_size}], got {tuple(hidden.shape)}")
        if hidden.shape[1] == 0:
            raise ValueError("hidden must hold at least one token (T >= 1)")
        layout = (cache.num_layers, cache.num_kv_heads, cache.head_dim)
        if layout != (self.num_layers, self.num_kv_heads, self.head_dim):
            raise ValueError("cache layout does not match this model; create it with CausalLM.new_cache")
        if cache.batch_size != hidden.shape[0]:
            raise ValueError(f"hidden batch size {hidden.shape[0]} != cache batch size {cache.batch_size}")
        return hidden.shape[0], hidden.shape[1]

    @staticmethod
    def _check_mask(attn_mask, mask_prefix, lengths, num_new, batch: int, seq: int) -> torch.Tensor | None:
        """Validate ``attn_mask`` / ``mask_prefix``; returns the prefix (int64 [B]) or None."""
        if attn_mask is None:
            if mask_prefix is not None:
                raise ValueError("mask_prefix needs an attn_mask over the prefix slots and the new tokens")
            return None
        if attn_mask.dtype != torch.bool or attn_mask.dim() != 3 or attn_mask.shape[:2] != (batch, seq) \
                or attn_mask.shape[2] < seq:
            raise ValueError(
                f"attn_mask must be a BoolTensor [B={batch}, T={seq}, P + T] with P >= 0, "
                f"got {attn_mask.dtype} {tuple(attn_mask.shape)}"
            )
        columns = attn_mask.shape[2]
        if mask_prefix is None:
            if columns != seq:
                raise ValueError(f"attn_mask has {columns - seq} prefix columns: pass mask_prefix [B={batch}]")
            return None
        if not isinstance(mask_prefix, torch.Tensor) or mask_prefix.shape != (batch,):
            raise ValueError(f"mask_prefix must be a LongTensor [B={batch}], got {getattr(mask_prefix, 'shape', mask_prefix)}")
        prefix = mask_prefix.to(device=lengths.device, dtype=torch.long)
        # Only rows that run new tokens need their prefix inside the cache and the mask.
        bad = (num_new > 0) & ((prefix < 0) | (prefix + seq > columns) | (prefix[None, :] > lengths).any(0))
        if bool(bad.any()):
            raise ValueError(
                f"mask_prefix must lie in [0, min(cached length, P = {columns - seq})] for rows with new "
                f"tokens, got {prefix.tolist()}"
            )
        return prefix

    @staticmethod
    def _check_num_new(num_new: torch.Tensor | None, batch: int, seq: int, device: torch.device) -> torch.Tensor:
        if num_new is None:
            return torch.full((batch,), seq, dtype=torch.long, device=device)
        if not isinstance(num_new, torch.Tensor) or num_new.shape != (batch,):
            raise ValueError(f"num_new must be a LongTensor [B={batch}], got {getattr(num_new, 'shape', num_new)}")
        return num_new.to(device=device, dtype=torch.long)

    @staticmethod
    def _kv_window(lengths: torch.Tensor, num_new: torch.Tensor, seq: int, cache: KVCache) -> tuple[int, int]:
        """Return ``(W, sum(num_new))`` after validating ``num_new`` and capacity (one sync)."""
        stats = torch.stack([(lengths + num_new[None, :]).max(), num_new.sum(), num_new.min(), num_new.max()])
        needed, total_new, lowest, highest = stats.tolist()
        if lowest < 0 or highest > seq:
            raise ValueError(f"num_new must lie in [0, T={seq}], got {num_new.tolist()}")
        if needed > cache.max_len:
            raise ValueError(f"cache too short: max_len={cache.max_len} but {needed} slots are needed")
        return max(needed, 1), total_new
