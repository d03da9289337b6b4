"""EAGLE-3 draft head as a plain torch module, in the layout of SGLang's ``LlamaForCausalLMEagle3``.

One module serves training (``ttt_forward``, no cache) and the runtime (``forward_cached`` over a
one-layer ``KVCache``); parameter names equal SGLang's checkpoint names (``eagle_heads/eagle3.py``
documents the format), so ``state_dict()`` is the export.

Entry t of the head (its position t) reads the token x_{t+1} and a hidden state for position t:

* ``fc(concat(aux_1(t), aux_2(t), aux_3(t)))`` when the target has processed position t (aux_i
  is the target's hidden state after ``capture_layers[i]`` layers), or
* the head's own output at entry t - 1, when the target has not (drafting ahead, as EAGLE does);

and outputs ``out(t)`` whose logits ``lm_head(norm(out(t)))`` over the draft vocabulary predict
x_{t+2}. The decoder layer, as SGLang's ``midlayer``:

    r = hidden;  a = attn(concat(input_layernorm(embed(x_{t+1})), hidden_norm(hidden)))
    h = r + a;   out = h + mlp(post_attention_layernorm(h))

Draft-vocabulary id d maps to target id ``d + d2t[d]``; ``target_probs`` scatters the draft
distribution to the target vocabulary (ids outside the draft vocabulary get probability 0).
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from sglang_hsd.runtime.kv_cache import KVCache
from sglang_hsd.runtime.layers import (
    Attention,
    RMSNorm,
    SwiGLU,
    apply_rotary,
    build_attention_mask,
    fold_groups,
)
from sglang_hsd.runtime.model import CausalLM


class Eagle3Head(nn.Module):
    """EAGLE-3 head over ``target`` (whose token embedding it shares, frozen, unsaved).

    Args:
        hf_config: the head's ``config.json`` as a dict (``Eagle3HeadConfig.to_hf_dict()``).
        target: the target ``CausalLM`` (embedding, rotary base, depth for the capture layers).
    """

    def __init__(self, hf_config: dict, target: CausalLM) -> None:
        super().__init__()
        dim = hf_config["hidden_size"]
        heads, kv_heads = hf_config["num_attention_heads"], hf_config["num_key_value_heads"]
        head_dim = hf_config.get("head_dim") or dim // heads
        inter, eps = hf_config["intermediate_size"], hf_config["rms_norm_eps"]
        aux_ids = hf_config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
        vocab, draft_vocab = hf_config["vocab_size"], hf_config["draft_vocab_size"]
        if dim != target.hidden_size or vocab != target.vocab_size:
            raise ValueError(f"head (hidden {dim}, vocab {vocab}) does not match the target "
                             f"(hidden {target.hidden_size}, vocab {target.vocab_size})")
        self.hf_config = dict(hf_config)
        # SGLang config ids name the layer whose *output* is captured: after id + 1 layers.
        self.capture_layers = [i + 1 for i in aux_ids]
        self.num_heads, self.num_kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.draft_vocab_size, self.target_vocab_size = draft_vocab, vocab

        def linear(i, o):
            return nn.Linear(i, o, bias=False)

        def norm():
            return RMSNorm(nn.Parameter(torch.ones(dim)), eps)

        self.fc = linear(len(aux_ids) * dim, dim)
        self.midlayer = nn.Module()
        self.midlayer.self_attn = Attention(SimpleNamespace(
            q_proj=linear(2 * dim, heads * head_dim), k_proj=linear(2 * dim, kv_heads * head_dim),
            v_proj=linear(2 * dim, kv_heads * head_dim), o_proj=linear(heads * head_dim, dim)),
            heads, kv_heads, head_dim)
        self.midlayer.mlp = SwiGLU(SimpleNamespace(gate_proj=linear(dim, inter), up_proj=linear(dim, inter),
                                                   down_proj=linear(inter, dim)))
        self.midlayer.input_layernorm, self.midlayer.hidden_norm = norm(), norm()
        self.midlayer.post_attention_layernorm = norm()
        self.norm = norm()
        self.lm_head = linear(dim, draft_vocab)
        self.register_buffer("d2t", torch.zeros(draft_vocab, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(vocab, dtype=torch.bool) if draft_vocab == vocab else torch.zeros(vocab, dtype=torch.bool))
        theta = float(hf_config.get("rope_theta", 10000.0))
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._target = (target,)  # shared, not a submodule: not saved, not trained

    # ------------------------------------------------------------------ pieces
    @property
    def draft_to_target(self) -> torch.Tensor:
        """int64 [Vd]: the target id of each draft id."""
        return torch.arange(self.draft_vocab_size, device=self.d2t.device) + self.d2t

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """Concatenated aux hidden states [..., n_aux * D] -> [..., D]."""
        return self.fc(aux)

    def _rope(self, positions: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        angles = positions[..., None].float() * self.inv_freq
        angles = torch.cat((angles, angles), -1)
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def _layer_input(self, ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        embeds = self._target[0].embed_tokens(ids)
        return torch.cat((self.midlayer.input_layernorm(embeds), self.midlayer.hidden_norm(hidden)), -1)

    def _finish(self, hidden: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        h = hidden + attn_out
        return h + self.midlayer.mlp(self.midlayer.post_attention_layernorm(h))

    def draft_logits(self, out: torch.Tensor) -> torch.Tensor:
        """Head output [..., D] -> logits over the draft vocabulary [..., Vd]."""
        return self.lm_head(self.norm(out))

    def target_logits(self, out: torch.Tensor) -> torch.Tensor:
        """Head output [..., D] -> logits over the target vocabulary [..., V] (-inf outside the
        draft vocabulary), ready for ``logits_to_probs``."""
        draft = self.draft_logits(out).float()
        full = draft.new_full((*draft.shape[:-1], self.target_vocab_size), float("-inf"))
        return full.index_copy(-1, self.draft_to_target, draft)

    # ------------------------------------------------------------------ runtime
    def new_cache(self, batch_size: int, max_len: int) -> KVCache:
        weight = self.fc.weight
        return KVCache(1, batch_size, self.num_kv_heads, self.head_dim, max_len, weight.dtype, weight.device)

    def forward_cached(
        self,
        ids: torch.Tensor,
        hidden: torch.Tensor,
        cache: KVCache,
        num_new: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
        mask_prefix: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Append ``num_new[b]`` entries per row to ``cache`` (rotary position = slot by default).

        Args:
            ids: int64 [B, T], the token each entry reads (x_{t+1} for entry t).
            hidden: [B, T, D], fused aux hidden or the head's own previous output.
            num_new: int64 [B], valid entries per row (right padding).
            position_ids, attn_mask, mask_prefix: as ``CausalLM.forward_layers`` (draft trees: the
                entries of one tree level at their depth's position, each attending its forwarded
                ancestors among the last ``mask_prefix`` entries).
        Returns:
            the head's output hidden [B, T, D] (padding rows unspecified).
        """
        batch, seq = ids.shape
        lengths = cache.lengths[0:1]
        kv_len, _ = CausalLM._kv_window(lengths, num_new, seq, cache)
        offsets = torch.arange(seq, device=ids.device)
        slot_ids = lengths[0][:, None] + offsets
        positions = slot_ids if position_ids is None else position_ids
        prefix = CausalLM._check_mask(attn_mask, mask_prefix, lengths, num_new, batch, seq)
        masks = fold_groups(build_attention_mask(lengths, num_new, seq, kv_len, attn_mask, prefix),
                            self.num_heads // self.num_kv_heads)
        slots = torch.where(offsets[None] < num_new[:, None], slot_ids, cache.scratch_slot)
        x = self._layer_input(ids, hidden)
        attn = self.midlayer.self_attn(x, self._rope(positions, x.dtype), cache, 0, slots, masks[0])
        lengths += num_new[None, :]
        return self._finish(hidden, attn)

    # ------------------------------------------------------------------ training
    def ttt_forward(self, ids: torch.Tensor, aux: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """Training-time test over windows of a sequence, no cache.

        Step 0 reads (x_{t+1}, fc(aux_t)) at entry t; step j >= 1 reads (x_{t+1+j}, out_{j-1}(t))
        at rotary position t + j and attends to the step-0 entries t' <= t plus its own earlier
        steps at t (the keys decoding would have: target-fed context, then self-fed drafts).

        Args:
            ids: int64 [B, >= T + steps - 1], tokens x_1 .. of each window (ids[:, t + j] is read by
                entry t at step j).
            aux: [B, T, n_aux * D], concatenated aux hidden states at positions 0 .. T - 1.
        Returns:
            per step, the head output hidden [B, T, D] (logits via ``draft_logits``).
        """
        batch, seq = aux.shape[:2]
        attn = self.midlayer.self_attn
        groups = self.num_heads // self.num_kv_heads
        causal = torch.ones(seq, seq, dtype=torch.bool, device=aux.device).tril()
        hidden = self.fuse(aux)
        keys, values, outs = [], [], []
        for step in range(steps):
            x = self._layer_input(ids[:, step : step + seq], hidden)
            cos, sin = self._rope(torch.arange(seq, device=aux.device).expand(batch, -1) + step, x.dtype)
            q = apply_rotary(attn.q_proj(x).view(batch, seq, self.num_heads, self.head_dim), cos, sin)
            k = apply_rotary(attn.k_proj(x).view(batch, seq, self.num_kv_heads, self.head_dim), cos, sin)
            v = attn.v_proj(x).view(batch, seq, self.num_kv_heads, self.head_dim)
            keys.append(k.repeat_interleave(groups, 2))
            values.append(v.repeat_interleave(groups, 2))
            scale = self.head_dim**-0.5
            ctx = torch.einsum("bthd,bshd->bhts", q, keys[0]) * scale  # [B, H, T, T]
            ctx = ctx.masked_fill(~causal, float("-inf"))
            diag = [torch.einsum("bthd,bthd->bht", q, k_s)[..., None] * scale for k_s in keys[1:]]
            weights = torch.softmax(torch.cat([ctx, *diag], -1), -1)
            out = torch.einsum("bhts,bshd->bthd", weights[..., :seq], values[0])
            for s, v_s in enumerate(values[1:]):
                out = out + weights[..., seq + s].transpose(1, 2)[..., None] * v_s
            hidden = self._finish(hidden, attn.o_proj(out.reshape(batch, seq, -1)))
            outs.append(hidden)
        return outs

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(cls, directory: str, target: CausalLM) -> "Eagle3Head":
        """Load an exported head (``config.json`` + ``model.safetensors``) onto ``target``."""
        from safetensors.torch import load_file

        with open(os.path.join(directory, "config.json")) as f:
            head = cls(json.load(f), target)
        state = load_file(os.path.join(directory, "model.safetensors"))
        missing, unexpected = head.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ValueError(f"EAGLE-3 checkpoint {directory}: missing {missing}, unexpected {unexpected}")
        return head.to(target.embed_tokens.weight.dtype).eval().requires_grad_(False)
