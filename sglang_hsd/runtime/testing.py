"""Tiny randomly initialised HF models for tests (no download, CPU, float32, eval mode)."""

from __future__ import annotations

import torch

__all__ = ["decode_chain", "greedy_reference", "hf_logits", "right_pad", "tiny_llama", "tiny_mistral", "tiny_qwen2"]


def _common_config(vocab_size: int, num_layers: int, hidden_size: int, heads: int, kv_heads: int, tie: bool) -> dict:
    return dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2 + 8,
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        tie_word_embeddings=tie,
        # Larger than HF's 0.02 so attention is far from uniform and logits are O(1):
        # exactness tests then compare numbers that differ between wrong implementations.
        initializer_range=0.15,
        attn_implementation="eager",
    )


def _build(model_cls, config, seed: int):
    torch.manual_seed(seed)
    model = model_cls(config).float().eval()
    # HF initialises norms to ones and biases to zeros; randomise them so tests can see them.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            elif name.endswith("bias"):
                param.copy_(0.2 * torch.randn_like(param))
    return model


def tiny_llama(
    vocab_size: int = 64,
    num_layers: int = 4,
    hidden_size: int = 32,
    heads: int = 4,
    kv_heads: int = 2,
    seed: int = 0,
    tie: bool = False,
    rope_theta: float = 10000.0,
    rope_scaling: dict | None = None,
    attention_bias: bool = False,
):
    """A random ``transformers.LlamaForCausalLM`` (float32, eval).

    ``rope_scaling``: extra rope parameters, e.g. ``{"rope_type": "linear", "factor": 2.0}``.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    rope = {"rope_type": "default", "rope_theta": rope_theta, **(rope_scaling or {})}
    config = LlamaConfig(
        **_common_config(vocab_size, num_layers, hidden_size, heads, kv_heads, tie),
        rope_parameters=rope,
        attention_bias=attention_bias,
    )
    return _build(LlamaForCausalLM, config, seed)


def tiny_qwen2(
    vocab_size: int = 64,
    num_layers: int = 4,
    hidden_size: int = 32,
    heads: int = 4,
    kv_heads: int = 2,
    seed: int = 0,
    tie: bool = True,
    rope_theta: float = 1000000.0,
):
    """A random ``transformers.Qwen2ForCausalLM`` (float32, eval; qkv projections have bias)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        **_common_config(vocab_size, num_layers, hidden_size, heads, kv_heads, tie),
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
    )
    return _build(Qwen2ForCausalLM, config, seed)


def tiny_mistral(
    vocab_size: int = 64,
    num_layers: int = 4,
    hidden_size: int = 32,
    heads: int = 4,
    kv_heads: int = 2,
    seed: int = 0,
    tie: bool = False,
    sliding_window: int | None = None,
):
    """A random ``transformers.MistralForCausalLM`` (float32, eval), full attention by default."""
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(
        **_common_config(vocab_size, num_layers, hidden_size, heads, kv_heads, tie), sliding_window=sliding_window
    )
    return _build(MistralForCausalLM, config, seed)


def hf_logits(hf_model, ids: torch.Tensor) -> torch.Tensor:
    """transformers' logits for unpadded ``ids`` ``LongTensor[B, T]`` -> ``[B, T, V]``."""
    with torch.inference_mode():
        return hf_model(ids).logits


def decode_chain(model, cache, tokens: torch.Tensor) -> torch.Tensor:
    """Feed ``tokens`` ``LongTensor[B, T]`` to a ``CausalLM`` one at a time -> logits ``[B, T, V]``."""
    return torch.cat([model(tokens[:, i : i + 1], cache) for i in range(tokens.shape[1])], dim=1)


def greedy_reference(model, prompt: list[int], steps: int) -> list[int]:
    """Plain greedy decoding of ``steps`` tokens with a ``CausalLM``, one token at a time: the
    oracle every speculative configuration's greedy output is compared with."""
    with torch.inference_mode():
        cache = model.new_cache(1, len(prompt) + steps + 1)
        logits = model(torch.tensor([prompt]), cache)
        out = []
        for _ in range(steps):
            token = int(logits[0, -1].argmax())
            out.append(token)
            logits = model(torch.tensor([[token]]), cache)
        return out


def right_pad(rows: list[torch.Tensor], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """1-D LongTensors -> (right-padded ids ``LongTensor[B, T_max]``, lengths ``LongTensor[B]``)."""
    lengths = torch.tensor([len(row) for row in rows], dtype=torch.long)
    out = torch.full((len(rows), int(lengths.max())), pad, dtype=torch.long)
    for b, row in enumerate(rows):
        out[b, : len(row)] = row
    return out, lengths
