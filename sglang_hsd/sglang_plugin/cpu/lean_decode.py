"""A lean forward for a separate draft model on CPU: its draft steps, extends and prefill.

Why: a draft step runs one row per request through every layer of the draft model, and on CPU
SGLang's model code costs more in Python than the step's arithmetic. Profiled in the server
(``benchmarks/loaded_rounds.py --torch-profile-steps``: torch.profiler through SGLang's
``/start_profile``; Qwen2.5-Coder-0.5B drafting on its int4 copy, one request, 2-core Xeon): a
46 ms step spent 19 ms in the int4 products, 16 ms in Python between torch calls (the
layer-boundary and residual machinery, custom-op dispatch, the rotary embedding recomputing cos /
sin in each of the 24 layers) and 10 ms in about 3,300 small ops; on this forward, 36 ms (19 / 8 /
9). ``LeanDecoder`` runs the same layers with the fewest calls: the rotary cos / sin once per
step, one rotation of the query and key heads together (adjacent in the fused QKV output), fused
RMSNorm, and the linear layers through their quantization method's ``apply`` (the weight copies
and packed kernels of ``draft_copies`` / ``linear_path`` are reached as before). Attention is the
layer's own ``RadixAttention``, so the KV cache writes and the draft backends' metadata (chains
and trees) are SGLang's.

Only the drafter's numbers can differ from SGLang's forward (float rounding: fused RMSNorm sums
in another order); verification uses the q computed from these logits, so the output law is
unchanged. ``LeanDecoder.build`` refuses (``LeanDecodeUnsupported``, with the reason) any model
whose layers it does not reproduce exactly: anything but a Llama / Qwen2-style decoder of
RMSNorm, fused QKV with full neox rotary, SiLU-gated MLP, one tensor-parallel rank, float32.
``install_lean_decode`` puts it in front of the model's decoder for the forward modes of
``LEAN_MODES`` (draft steps, draft extends, the draft prefill and catch-up) and leaves any other
forward to SGLang.

Tests: ``tests/sglang_plugin/test_lean_decode.py`` (settings, refusals); the chain and tree servers
of ``tests/sglang_plugin/test_draft_model_server.py`` run it ``checked`` (every forward compared
with SGLang's) through their greedy-equality, T = 1 law and load tests.

Shapes: ``n`` rows, the batch's new tokens (one per request in a chain's draft step, one per tree
node, a request's accepted window or prompt in an extend), hidden size ``H``, ``Hq`` / ``Hkv``
query / KV heads of size ``D``.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

LEAN_DECODE_FLAG = "--hsd-draft-forward"
LEAN_DECODE_ENV = "SGLANG_HSD_DRAFT_FORWARD"
# auto: lean where the model is supported, else SGLang's (logged); lean: lean or refuse;
# checked: lean and SGLang's on every forward, compared (tests); sglang: SGLang's forward.
LEAN_DECODE_MODES = ("auto", "lean", "checked", "sglang")
# SGLang forward modes the lean forward serves (by name: absent ones are skipped).
LEAN_MODES = ("DECODE", "EXTEND", "DRAFT_EXTEND", "DRAFT_EXTEND_V2")
# Largest |lean - SGLang| of a checked step's final hidden state, relative to its largest entry.
CHECK_TOLERANCE = 1e-4


@dataclass(frozen=True)
class DraftForwardConfig:
    """Fields:
        mode: one of ``LEAN_DECODE_MODES``.
    """

    mode: str = "auto"

    def __post_init__(self) -> None:
        if self.mode not in LEAN_DECODE_MODES:
            raise ValueError(f"{LEAN_DECODE_FLAG} ({LEAN_DECODE_ENV}) must be one of "
                             f"{', '.join(LEAN_DECODE_MODES)}, got {self.mode!r}")

    @classmethod
    def from_env(cls) -> "DraftForwardConfig":
        return cls(os.environ.get(LEAN_DECODE_ENV, "").strip().lower() or "auto")


class LeanDecodeUnsupported(ValueError):
    """The model has a part ``LeanDecoder`` does not reproduce (the message names it)."""


class LeanDecodeMismatch(RuntimeError):
    """A checked step's lean hidden state differs from SGLang's beyond ``CHECK_TOLERANCE``."""


@dataclass(frozen=True)
class LeanLayer:
    """One decoder layer's parts: norm weights (``[H]``), the SGLang linear modules, the
    layer's ``RadixAttention`` and the QKV split sizes."""

    input_norm: torch.Tensor
    post_norm: torch.Tensor
    qkv: torch.nn.Module
    o: torch.nn.Module
    gate_up: torch.nn.Module
    down: torch.nn.Module
    attention: torch.nn.Module
    q_size: int
    kv_size: int


def _require(condition: bool, what: str) -> None:
    if not condition:
        raise LeanDecodeUnsupported(what)


def _norm_weight(norm: torch.nn.Module, eps: float) -> torch.Tensor:
    from sglang.srt.layers.layernorm import RMSNorm

    _require(type(norm) is RMSNorm, f"norm of type {type(norm).__name__} (RMSNorm only)")
    _require(getattr(norm, "variance_size_override", None) is None, "RMSNorm variance_size_override")
    _require(getattr(norm, "override_orig_dtype", None) is None, "RMSNorm override_orig_dtype")
    _require(float(norm.variance_epsilon) == eps, "RMSNorm epsilons that differ between layers")
    return norm.weight.data


def _linear(module: torch.nn.Module, what: str) -> torch.nn.Module:
    _require(getattr(module, "quant_method", None) is not None, f"{what} without a quant_method")
    _require(not getattr(module, "skip_bias_add", False), f"{what} with skip_bias_add")
    _require(getattr(module, "tp_size", 1) == 1, f"{what} split over tensor-parallel ranks")
    return module


def _apply(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``module``'s product as its forward computes it on one rank (``x`` ``[n, in]``)."""
    return module.quant_method.apply(module, x, module.bias)


@dataclass(frozen=True)
class LeanDecoder:
    """The decoder stack of a SGLang Llama / Qwen2-style CausalLM for batches of the forward
    modes in ``LEAN_MODES`` (one token per row: draft steps, extends, prefill).

    ``forward(input_ids [n], positions [n], forward_batch)`` -> hidden ``[n, H]`` after the final
    norm, what the model's decoder (``model.model``) returns; KV written as SGLang writes it (the
    layer's ``RadixAttention`` and the forward mode's attention backend).

    Fields: the embedding module, the layers, the final norm's weight ``[H]`` and every norm's
    epsilon, the rotary cache ``[max_pos, D]`` (cos then sin) the layers share, the head size.
    """

    embed: torch.nn.Module
    layers: list[LeanLayer]
    final_norm: torch.Tensor
    eps: float
    cos_sin_cache: torch.Tensor
    head_dim: int

    @classmethod
    def build(cls, model: torch.nn.Module) -> "LeanDecoder":
        """From a loaded SGLang CausalLM; raises ``LeanDecodeUnsupported`` naming what it cannot
        reproduce."""
        from sglang.srt.layers.activation import SiluAndMul
        from sglang.srt.layers.radix_attention import RadixAttention
        from sglang.srt.layers.rotary_embedding.base import RotaryEmbedding
        from sglang.srt.models.llama import LlamaDecoderLayer
        from sglang.srt.models.qwen2 import Qwen2DecoderLayer

        decoder = getattr(model, "model", None)
        _require(decoder is not None and hasattr(decoder, "layers"), "a model without model.layers")
        _require(not getattr(model, "capture_aux_hidden_states", False), "aux hidden-state capture")
        _require(not getattr(decoder, "layers_to_capture", None), "aux hidden-state capture")
        pp = getattr(decoder, "pp_group", None)
        _require(pp is None or (pp.is_first_rank and pp.is_last_rank), "pipeline parallelism")
        layers_in = list(decoder.layers)
        _require(getattr(decoder, "start_layer", 0) == 0
                 and getattr(decoder, "end_layer", len(layers_in)) == len(layers_in),
                 "a layer range other than all layers")
        _require(decoder.embed_tokens.weight.dtype == torch.float32, "a model dtype other than float32")
        eps = float(decoder.norm.variance_epsilon)
        final_norm = _norm_weight(decoder.norm, eps)
        layers, cache, head_dim = [], None, None
        for index, layer in enumerate(layers_in):
            _require(type(layer) in (LlamaDecoderLayer, Qwen2DecoderLayer),
                     f"decoder layer {type(layer).__name__} (Llama / Qwen2 layers only)")
            attn, mlp = layer.self_attn, layer.mlp
            rope = attn.rotary_emb
            _require(type(rope) is RotaryEmbedding, f"rotary embedding {type(rope).__name__} "
                     "(the base RotaryEmbedding only)")
            _require(rope.is_neox_style and rope.rotary_dim == rope.head_size,
                     "a partial or GPT-J-style rotary embedding")
            _require(cache is None or rope.cos_sin_cache is cache, "rotary caches that differ by layer")
            cache, head_dim = rope.cos_sin_cache, rope.head_size
            _require(isinstance(attn.attn, RadixAttention), f"layer {index}: attention without RadixAttention")
            _require(type(mlp.act_fn) is SiluAndMul, f"layer {index}: an MLP activation other than SiLU")
            _require(getattr(getattr(mlp, "dual_gemm", None), "mode", None) is None,
                     f"layer {index}: a dual-GEMM MLP")
            _require(not getattr(getattr(mlp, "activation_quant", None), "enabled", False),
                     f"layer {index}: a quantized MLP activation")
            layers.append(LeanLayer(
                input_norm=_norm_weight(layer.input_layernorm, eps),
                post_norm=_norm_weight(layer.post_attention_layernorm, eps),
                qkv=_linear(attn.qkv_proj, "qkv_proj"), o=_linear(attn.o_proj, "o_proj"),
                gate_up=_linear(mlp.gate_up_proj, "gate_up_proj"), down=_linear(mlp.down_proj, "down_proj"),
                attention=attn.attn, q_size=attn.q_size, kv_size=attn.kv_size))
        _require(bool(layers), "a model without layers")
        return cls(decoder.embed_tokens, layers, final_norm, eps, cache, head_dim)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), weight, self.eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch) -> torch.Tensor:
        d = self.head_dim
        cos, sin = self.cos_sin_cache.index_select(0, positions.flatten().long()).chunk(2, dim=-1)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [n, 1, D/2]: every head of a row
        residual = self.embed(input_ids)
        hidden = self._norm(residual, self.layers[0].input_norm)
        n = residual.shape[0]
        for i, layer in enumerate(self.layers):
            if i > 0:
                residual = residual + hidden
                hidden = self._norm(residual, layer.input_norm)
            qkv = _apply(layer.qkv, hidden)
            rotated = layer.q_size + layer.kv_size
            heads = qkv[:, :rotated].view(n, -1, d)  # query heads, then key heads
            x1, x2 = heads.chunk(2, dim=-1)
            heads = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).view(n, rotated)
            q, k = heads.split((layer.q_size, layer.kv_size), dim=-1)
            v = qkv[:, rotated:]
            hidden = _apply(layer.o, layer.attention(q, k, v, forward_batch))
            residual = residual + hidden
            hidden = self._norm(residual, layer.post_norm)
            gate_up = _apply(layer.gate_up, hidden)
            width = gate_up.shape[-1] // 2
            hidden = _apply(layer.down, F.silu(gate_up[:, :width]) * gate_up[:, width:])
        return self._norm(residual + hidden, self.final_norm)


@dataclass
class LeanDecodeStats:
    """What the lean forward served, for ``/server_info``: forwards and rows per SGLang forward
    mode name, and in ``checked`` mode the largest relative difference from SGLang's forward."""

    path: str
    forwards: dict[str, int] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)
    max_checked_error: float | None = None

    def count(self, mode_name: str, rows: int) -> None:
        self.forwards[mode_name] = self.forwards.get(mode_name, 0) + 1
        self.rows[mode_name] = self.rows.get(mode_name, 0) + rows

    def as_dict(self) -> dict:
        return {"path": self.path, "forwards": dict(self.forwards), "rows": dict(self.rows),
                "max_checked_error": self.max_checked_error}


def install_lean_decode(model: torch.nn.Module, config: DraftForwardConfig) -> LeanDecodeStats:
    """Put a ``LeanDecoder`` in front of ``model.model`` (a draft model) for the forward modes of
    ``LEAN_MODES`` as ``config.mode`` says (``checked``: run SGLang's forward too and raise
    ``LeanDecodeMismatch`` when they differ; ``lean`` / ``checked`` on a model it does not
    support: ``LeanDecodeUnsupported`` naming the flag). Returns the stats the hook updates
    (``path``: ``lean``, ``checked``, or ``sglang`` with the reason the lean forward was not
    installed)."""
    mode = config.mode
    if mode == "sglang":
        return LeanDecodeStats("sglang")
    try:
        lean = LeanDecoder.build(model)
    except LeanDecodeUnsupported as why:
        if mode != "auto":
            raise LeanDecodeUnsupported(f"{LEAN_DECODE_FLAG} {mode}: the draft model has {why}; "
                                        f"pass {LEAN_DECODE_FLAG} auto or sglang") from None
        logger.info("HSD: the draft model runs SGLang's forward (the lean forward does not support %s)", why)
        return LeanDecodeStats(f"sglang ({why})")
    mode = "lean" if mode == "auto" else mode
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    # Draft steps, draft extends, the draft prefill and catch-up: modes whose every row is one
    # token of one request (no mixed chunks, no split prefill, no encoder inputs).
    modes = frozenset(getattr(ForwardMode, name) for name in LEAN_MODES if hasattr(ForwardMode, name))
    stats = LeanDecodeStats(mode)
    decoder = model.model
    original = decoder.forward

    def forward(input_ids, positions, forward_batch, input_embeds=None, pp_proxy_tensors=None, **kwargs):
        forward_mode = forward_batch.forward_mode
        if (input_embeds is not None or pp_proxy_tensors is not None or kwargs
                or forward_mode not in modes or input_ids.shape[0] == 0):
            return original(input_ids, positions, forward_batch, input_embeds,
                            pp_proxy_tensors=pp_proxy_tensors, **kwargs)
        hidden = lean.forward(input_ids, positions, forward_batch)
        stats.count(forward_mode.name, int(input_ids.shape[0]))
        if mode == "checked":
            # SGLang's forward writes the same KV slots with (nearly) the same values: harmless.
            reference = original(input_ids, positions, forward_batch)
            error = float((hidden - reference).abs().max()) / float(reference.abs().max().clamp_min(1.0))
            stats.max_checked_error = max(error, stats.max_checked_error or 0.0)
            if error > CHECK_TOLERANCE:
                raise LeanDecodeMismatch(
                    f"{LEAN_DECODE_FLAG} checked: the lean forward ({forward_mode.name}, "
                    f"{input_ids.shape[0]} rows) differs from SGLang's by {error:.3g} (relative), "
                    f"above {CHECK_TOLERANCE}")
        return hidden

    decoder.forward = forward
    logger.info("HSD: the draft model runs the lean forward (%s %s)", LEAN_DECODE_FLAG, mode)
    return stats
