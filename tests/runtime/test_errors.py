"""CausalLM argument validation: every error names the offending argument."""

import pytest
import torch

from sglang_hsd.runtime.model import CausalLM
from sglang_hsd.runtime.testing import tiny_llama, tiny_mistral


@pytest.fixture(scope="module")
def model():
    return CausalLM.from_hf(tiny_llama(seed=40))


def test_layer_range_errors(model):
    cache = model.new_cache(1, 8)
    hidden = torch.zeros(1, 2, 32)
    for start, end in ((0, 5), (-1, 2), (2, 2), (3, 1)):
        with pytest.raises(ValueError, match="layer range"):
            model.forward_layers(hidden, start, end, cache)


def test_cache_too_short(model):
    cache = model.new_cache(2, 6)
    model(torch.zeros(2, 4, dtype=torch.long), cache)
    with pytest.raises(ValueError, match="cache too short"):
        model(torch.zeros(2, 3, dtype=torch.long), cache)
    # Padding beyond capacity is fine as long as the valid tokens fit (padding slots 6, 7
    # of row 0 would lie past the buffer: they must go to the scratch slot).
    model(torch.zeros(2, 4, dtype=torch.long), cache, num_new=torch.tensor([2, 1]))
    assert cache.lengths[:, 0].eq(6).all() and cache.lengths[:, 1].eq(5).all()


def test_shape_errors(model):
    cache = model.new_cache(2, 8)
    with pytest.raises(ValueError, match="hidden must be"):
        model.forward_layers(torch.zeros(2, 3, 31), 0, 4, cache)
    with pytest.raises(ValueError, match="hidden batch size"):
        model.forward_layers(torch.zeros(3, 3, 32), 0, 4, cache)
    with pytest.raises(ValueError, match="num_new must be"):
        model.forward_layers(torch.zeros(2, 3, 32), 0, 4, cache, num_new=torch.tensor([1]))
    with pytest.raises(ValueError, match="num_new must lie"):
        model.forward_layers(torch.zeros(2, 3, 32), 0, 4, cache, num_new=torch.tensor([4, 1]))
    with pytest.raises(ValueError, match="position_ids must be"):
        model.forward_layers(torch.zeros(2, 3, 32), 0, 4, cache, position_ids=torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="attn_mask must be"):
        model.forward_layers(torch.zeros(2, 3, 32), 0, 4, cache, attn_mask=torch.ones(2, 3, 3))
    with pytest.raises(ValueError, match="input_ids must be"):
        model(torch.zeros(3, dtype=torch.long), cache)
    with pytest.raises(ValueError, match="cache layout"):
        model.forward_layers(torch.zeros(1, 3, 32), 0, 4, CausalLM.from_hf(tiny_llama(num_layers=2)).new_cache(1, 8))
    assert cache.lengths.eq(0).all()  # failed calls leave the cache untouched


def test_unsupported_architecture_names_supported_ones():
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=16))
    with pytest.raises(ValueError, match="LlamaForCausalLM.*Qwen2ForCausalLM"):
        CausalLM.from_hf(gpt2)


def test_unsupported_rope_and_activation():
    with pytest.raises(ValueError, match="rope_type 'dynamic'"):
        CausalLM.from_hf(tiny_llama(rope_scaling={"rope_type": "dynamic", "factor": 2.0}))
    hf_model = tiny_llama()
    hf_model.config.hidden_act = "gelu"
    with pytest.raises(ValueError, match="hidden_act"):
        CausalLM.from_hf(hf_model)


def test_sliding_window_is_rejected():
    with pytest.raises(ValueError, match="sliding-window"):
        CausalLM.from_hf(tiny_mistral(sliding_window=8))
