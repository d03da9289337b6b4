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

import torch
import torch.nn.functional as F
from torch import nn

from sglang_hsd.runtime.kv_cache import KVCache

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
) -> torch.Tensor:
    """Boolean attention masks of ``n`` layers over key slots ``[0, kv_len)``.

    Args:
        lengths: ``LongTensor[n, B]``, old cache length of each layer in the range.
        num_new: ``LongTensor[B]``, valid new tokens per row.
        seq_len: ``T``.
        kv_len: ``W``, at least ``max(lengths + num_new)``.
        attn_mask: ``BoolTensor[B, T, T]`` among new tokens (True = may attend), or None for causal.

    Returns:
        ``BoolTensor[n, B, T, W]``. Query ``t`` of row ``b`` may see slot ``j < L0`` and slot
        ``L0 + t'`` for a valid new token ``t'`` it is allowed to see. Padding queries see only
        slot 0 so that no softmax row is empty (their outputs are finite and unspecified).
    """
    device = lengths.device
    slot = torch.arange(kv_len, device=device)  # [W]
    query = torch.arange(seq_len, device=device)  # [T]
    rel = slot - lengths[..., None]  # [n, B, W]: index among the new tokens
    cached = (rel < 0)[:, :, None, :]  # [n, B, 1, W]
    is_new = ((rel >= 0) & (rel < num_new[None, :, None]))[:, :, None, :]
    if attn_mask is None:
        allowed = rel[:, :, None, :] <= query[None, None, :, None]  # [n, B, T, W]
    else:
        index = rel.clamp(0, seq_len - 1)[:, :, None, :].expand(-1, -1, seq_len, -1)
        allowed = attn_mask[None].expand(lengths.shape[0], -1, -1, -1).gather(-1, index)
    mask = cached | (is_new & allowed)
    valid_query = (query[None, :] < num_new[:, None])[None, :, :, None]  # [1, B, T, 1]
    return torch.where(valid_query, mask, slot == 0)


def _fold_groups(mask: torch.Tensor, groups: int) -> torch.Tensor:
    """``[n, B, T, W]`` -> ``[n, B, 1, G*T, W]``, matching the group-folded queries."""
    n, batch, seq, kv_len = mask.shape
    return mask[:, :, None, None].expand(n, batch, 1, groups, seq, kv_len).reshape(n, batch, 1, groups * seq, kv_len)


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
            attn_mask: ``BoolTensor[B, T, T]``, True where new token ``t`` may attend new token
                ``t'`` (must include the diagonal), default causal; used for draft trees.

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
        if attn_mask is not None and (attn_mask.shape != (batch, seq, seq) or attn_mask.dtype != torch.bool):
            raise ValueError(
                f"attn_mask must be a BoolTensor [B={batch}, T={seq}, T={seq}], "
                f"got {attn_mask.dtype} {tuple(attn_mask.shape)}"
            )

        rope = self.rotary(position_ids, hidden.dtype)
        masks = build_attention_mask(lengths, num_new, seq, kv_len, attn_mask)
        masks = _fold_groups(masks, self.num_heads // self.num_kv_heads)
        valid = torch.arange(seq, device=device)[None, :] < num_new[:, None]  # [B, T]
        for offset, layer in enumerate(range(start, end)):
            slots = torch.where(valid, lengths[offset][:, None] + torch.arange(seq, device=device), cache.scratch_slot)
            hidden = self.layers[layer](hidden, rope, cache, layer, slots, masks[offset])
        lengths += num_new[None, :]  # in place: advances cache.lengths[start:end]

        self.counters.layer_token_forwards += (end - start) * total_new
        self.counters.calls += 1
        return hidden

    def _check_forward_args(self, hidden: torch.Tensor, start: int, end: int, cache: KVCache) -> tuple[int, int]:
        if not (isinstance(start, int) and isinstance(end, int) and 0 <= start < end <= self.num_layers):
            raise ValueError(f"layer range must satisfy 0 <= start < end <= {self.num_layers}, got start={start}, end={end}")
        if hidden.dim() != 3 or hidden.shape[-1] != self.hidden_size:
            raise ValueError(f"hidden must be [B, T, D={self.hidden_size}], got {tuple(hidden.shape)}")
        if hidden.shape[1] == 0:
            raise ValueError("hidden must hold at least one token (T >= 1)")
        if cache.num_layers != self.num_layers or cache.num_kv_heads != self.num_kv_heads or cache.head_dim != self.head_dim:
            raise ValueError("cache layout does not match this model; create it with CausalLM.new_cache")
        if cache.batch_size != hidden.shape[0]:
            raise ValueError(f"hidden batch size {hidden.shape[0]} != cache batch size {cache.batch_size}")
        return hidden.shape[0], hidden.shape[1]

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
