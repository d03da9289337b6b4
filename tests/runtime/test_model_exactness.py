"""CausalLM against transformers: same logits for prefill, incremental decode and ragged batches.

Regimes: plain MHA-free GQA Llama (untied), tied embeddings, Qwen2 (qkv bias, tied, large
rope_theta), Llama with attention bias, linear and llama3 rope scaling, MHA (kv_heads == heads),
multi-query attention (kv_heads == 1), Mistral without sliding window.
"""

import pytest
import torch

from sglang_hsd.runtime.model import CausalLM
from sglang_hsd.runtime.testing import decode_chain, hf_logits, right_pad, tiny_llama, tiny_mistral, tiny_qwen2

# float32 throughout: our forward and transformers' eager forward differ only in summation
# order (GQA folding, fused SDPA), measured at ~2e-6 on O(1) logits; 1e-4 is the contract.
ATOL = 1e-4

CONFIGS = {
    "llama_gqa_untied": lambda: tiny_llama(),
    "llama_tied": lambda: tiny_llama(tie=True, seed=1),
    "llama_mha": lambda: tiny_llama(kv_heads=4, seed=2),
    "llama_mqa_bias": lambda: tiny_llama(kv_heads=1, attention_bias=True, seed=3),
    "llama_theta_linear_rope": lambda: tiny_llama(
        rope_theta=500.0, rope_scaling={"rope_type": "linear", "factor": 2.0}, seed=4
    ),
    "llama3_rope": lambda: tiny_llama(
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
        seed=5,
    ),
    "qwen2_tied_bias": lambda: tiny_qwen2(),
    "qwen2_untied": lambda: tiny_qwen2(tie=False, seed=6),
    "mistral_full_attention": lambda: tiny_mistral(seed=8),
}


@pytest.fixture(params=sorted(CONFIGS))
def hf_model(request):
    return CONFIGS[request.param]()


def test_parameters_are_shared(hf_model):
    model = CausalLM.from_hf(hf_model)
    hf_ids = {id(p) for p in hf_model.parameters()}
    assert all(id(p) in hf_ids for p in model.parameters())
    assert model.layers[0].attn.q_proj.weight is hf_model.model.layers[0].self_attn.q_proj.weight
    assert model.num_layers == 4 and model.hidden_size == 32 and model.vocab_size == 64


def test_prefill_matches_transformers(hf_model):
    model = CausalLM.from_hf(hf_model)
    ids = torch.randint(0, 64, (3, 11), generator=torch.Generator().manual_seed(0))
    logits = model(ids, model.new_cache(3, 16))
    assert (logits - hf_logits(hf_model, ids)).abs().max() < ATOL


def test_incremental_decode_matches_prefill(hf_model):
    model = CausalLM.from_hf(hf_model)
    ids = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(1))
    prefill = model(ids, model.new_cache(2, 10))
    # Prompt of 4 in one call, then one token at a time: exercises the cached-prefix path.
    cache = model.new_cache(2, 10)
    staged = torch.cat([model(ids[:, :4], cache), decode_chain(model, cache, ids[:, 4:])], dim=1)
    assert (staged - prefill).abs().max() < ATOL
    assert (staged - hf_logits(hf_model, ids)).abs().max() < ATOL
    assert cache.lengths.eq(10).all()


def test_ragged_batch_matches_each_row_alone(hf_model):
    model = CausalLM.from_hf(hf_model)
    gen = torch.Generator().manual_seed(2)
    rows = [torch.randint(0, 64, (n,), generator=gen) for n in (7, 3, 5, 1)]
    ids, num_new = right_pad(rows, pad=63)
    cache = model.new_cache(4, 12)
    logits = model(ids, cache, num_new)
    assert cache.lengths.eq(num_new[None, :]).all()
    for b, row in enumerate(rows):
        alone = hf_logits(hf_model, row[None])[0]
        assert (logits[b, : len(row)] - alone).abs().max() < ATOL

    # A second ragged step continues each row from its own length.
    gen_next = [torch.randint(0, 64, (n,), generator=gen) for n in (2, 4, 1, 3)]
    step_ids, step_new = right_pad(gen_next)
    step_logits = model(step_ids, cache, step_new)
    for b, (row, extra) in enumerate(zip(rows, gen_next)):
        alone = hf_logits(hf_model, torch.cat([row, extra])[None])[0, len(row) :]
        assert (step_logits[b, : len(extra)] - alone).abs().max() < ATOL


def test_from_pretrained_roundtrip(tmp_path):
    hf_model = tiny_qwen2(seed=7)
    hf_model.save_pretrained(tmp_path)
    model = CausalLM.from_pretrained(str(tmp_path))
    ids = torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(3))
    assert (model(ids, model.new_cache(1, 6)) - hf_logits(hf_model, ids)).abs().max() < ATOL
