"""EAGLE-3 draft heads in SGLang's ``LlamaForCausalLMEagle3`` checkpoint format.

The format (read from ``sglang/srt/models/llama_eagle3.py`` in 0.5.23):

* ``config.json``: a Llama config with ``architectures = ["LlamaForCausalLMEagle3"]``,
  ``num_hidden_layers = 1``, ``target_hidden_size``, ``draft_vocab_size`` and
  ``eagle_config.eagle_aux_hidden_state_layer_ids`` (target layers whose outputs feed ``fc``).
* weights (safetensors), names as SGLang's loader maps them:
    ``fc.weight``                 [hidden, n_aux * target_hidden]  concat of aux hidden states
    ``midlayer.*``                one Llama decoder layer whose q/k/v take [2 * hidden]
                                  (``input_layernorm(embeds)`` concatenated with
                                  ``hidden_norm(hidden)``); ``midlayer`` is renamed ``layers.0``
    ``norm.weight``               final RMSNorm
    ``lm_head.weight``            [draft_vocab, hidden]
    ``d2t``                       int64 [draft_vocab]: target_id = draft_id + d2t[draft_id]
    ``t2d``                       bool [target_vocab]: which target ids the draft vocab covers
  ``embed_tokens`` is not stored: SGLang shares the target's embedding.

``build_random_eagle3_head`` makes a random-init head for tests; it is not a trained drafter.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import torch

EAGLE3_ARCHITECTURE = "LlamaForCausalLMEagle3"


@dataclass
class Eagle3HeadConfig:
    """Shape of an EAGLE-3 head for a given target.

    Fields:
        target_hidden_size: hidden size of the target model (the head runs at the same size).
        target_vocab_size: vocabulary of the target.
        draft_vocab_size: vocabulary of the head's lm_head (<= target_vocab_size).
        num_attention_heads / num_key_value_heads / intermediate_size: the head's decoder layer.
        aux_layer_ids: target layers whose outputs are concatenated into ``fc``.
        max_position_embeddings, rope_theta, rms_norm_eps: copied from the target.
        init_std: std of the random weights (small keeps distributions near-uniform).
    """

    target_hidden_size: int
    target_vocab_size: int
    draft_vocab_size: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    aux_layer_ids: list[int] = field(default_factory=lambda: [0, 1, 2])
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    init_std: float = 0.02

    @classmethod
    def for_target(cls, target_config, draft_vocab_size: int | None = None, **overrides):
        """Derive a head config from a ``transformers.LlamaConfig`` of the target."""
        n_layers = target_config.num_hidden_layers
        if n_layers < 3:
            raise ValueError(f"an EAGLE-3 head needs a target with >= 3 layers, got {n_layers}")
        # Three capture points like EAGLE-3 (SGLang captures the output of layer id + 1 - 1).
        aux = [0, n_layers // 2 - 1, n_layers - 2]
        values = dict(
            target_hidden_size=target_config.hidden_size,
            target_vocab_size=target_config.vocab_size,
            draft_vocab_size=draft_vocab_size or target_config.vocab_size,
            num_attention_heads=target_config.num_attention_heads,
            num_key_value_heads=target_config.num_key_value_heads,
            intermediate_size=target_config.intermediate_size,
            aux_layer_ids=aux,
            max_position_embeddings=target_config.max_position_embeddings,
            rope_theta=_rope_theta(target_config),
            rms_norm_eps=target_config.rms_norm_eps,
        )
        values.update(overrides)
        return cls(**values)

    def to_hf_dict(self) -> dict:
        head_dim = self.target_hidden_size // self.num_attention_heads
        return {
            "architectures": [EAGLE3_ARCHITECTURE],
            "model_type": "llama",
            "hidden_size": self.target_hidden_size,
            "target_hidden_size": self.target_hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": 1,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "tie_word_embeddings": False,
            "vocab_size": self.target_vocab_size,
            "draft_vocab_size": self.draft_vocab_size,
            "torch_dtype": "float32",
            "eagle_config": {
                "eagle_aux_hidden_state_layer_ids": list(self.aux_layer_ids),
                "use_aux_hidden_state": True,
            },
        }


def _rope_theta(target_config) -> float:
    """The target's rotary base (transformers >= 5 keeps it in ``rope_parameters``)."""
    params = getattr(target_config, "rope_parameters", None) or {}
    return float(getattr(target_config, "rope_theta", None) or params.get("rope_theta") or 10000.0)


def draft_vocab_maps(draft_to_target: torch.Tensor, target_vocab_size: int):
    """Build ``(d2t, t2d)`` from the sorted target ids the draft vocabulary keeps.

    Args:
        draft_to_target: int64 [Vd], strictly increasing target ids.
    Returns:
        d2t int64 [Vd] (offsets, target = draft + d2t[draft]) and t2d bool [Vt].
    """
    d2t = draft_to_target - torch.arange(draft_to_target.numel())
    t2d = torch.zeros(target_vocab_size, dtype=torch.bool)
    t2d[draft_to_target] = True
    return d2t.to(torch.int64), t2d


def random_eagle3_state_dict(config: Eagle3HeadConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights with SGLang's checkpoint names. The draft vocabulary keeps every
    ``Vt // Vd``-th target id starting at 0 when reduced, so ``d2t`` is non-trivial."""
    gen = torch.Generator().manual_seed(seed)
    hidden = config.target_hidden_size
    head_dim = hidden // config.num_attention_heads
    q_out = config.num_attention_heads * head_dim
    kv_out = config.num_key_value_heads * head_dim
    n_aux = len(config.aux_layer_ids)

    def rand(*shape):
        return torch.randn(*shape, generator=gen) * config.init_std

    if config.draft_vocab_size == config.target_vocab_size:
        kept = torch.arange(config.target_vocab_size)
    else:
        stride = config.target_vocab_size // config.draft_vocab_size
        kept = torch.arange(config.draft_vocab_size) * stride
    d2t, t2d = draft_vocab_maps(kept, config.target_vocab_size)
    return {
        "fc.weight": rand(hidden, n_aux * config.target_hidden_size),
        "midlayer.self_attn.q_proj.weight": rand(q_out, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": rand(kv_out, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": rand(kv_out, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": rand(hidden, q_out),
        "midlayer.mlp.gate_proj.weight": rand(config.intermediate_size, hidden),
        "midlayer.mlp.up_proj.weight": rand(config.intermediate_size, hidden),
        "midlayer.mlp.down_proj.weight": rand(hidden, config.intermediate_size),
        "midlayer.input_layernorm.weight": torch.ones(hidden),
        "midlayer.hidden_norm.weight": torch.ones(hidden),
        "midlayer.post_attention_layernorm.weight": torch.ones(hidden),
        "norm.weight": torch.ones(hidden),
        "lm_head.weight": rand(config.draft_vocab_size, hidden),
        "d2t": d2t,
        "t2d": t2d,
    }


def save_eagle3_head(directory: str, config: Eagle3HeadConfig, state_dict: dict) -> str:
    """Write ``config.json`` and ``model.safetensors`` into ``directory``; returns it."""
    from safetensors.torch import save_file

    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config.to_hf_dict(), f, indent=2)
    save_file({k: v.contiguous() for k, v in state_dict.items()},
              os.path.join(directory, "model.safetensors"))
    return directory


def build_random_eagle3_head(directory: str, target_config, draft_vocab_size: int | None = None,
                             seed: int = 0, **overrides) -> Eagle3HeadConfig:
    """Random-init EAGLE-3 head matching ``target_config`` (a ``LlamaConfig``), saved to disk."""
    config = Eagle3HeadConfig.for_target(target_config, draft_vocab_size, **overrides)
    save_eagle3_head(directory, config, random_eagle3_state_dict(config, seed))
    return config
