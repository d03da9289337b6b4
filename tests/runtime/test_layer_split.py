"""KV reuse across layer ranges: the property the early-exit verifier relies on.

The early layers [0, L) run ahead on provisional tokens; the late layers [L, N) catch up later
from the saved hidden states, possibly on fewer positions, possibly after the early layers have
cached more. Results must equal one full pass, row by row in a ragged batch.
"""

import copy

import pytest
import torch

from sglang_hsd.runtime.model import CausalLM
from sglang_hsd.runtime.testing import hf_logits, right_pad, tiny_llama, tiny_qwen2

ATOL = 1e-4  # float32, same contract as the exactness tests
SPLIT = 2  # L: early-exit layer of the 4-layer tiny models


@pytest.fixture(params=["llama", "qwen2"])
def hf_model(request):
    return tiny_llama(seed=10) if request.param == "llama" else tiny_qwen2(seed=11)


def test_split_in_one_step_equals_full_pass(hf_model):
    model = CausalLM.from_hf(hf_model)
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(0))
    cache = model.new_cache(2, 9)
    early = model.forward_layers(model.embed(ids), 0, SPLIT, cache)
    late = model.forward_layers(early, SPLIT, model.num_layers, cache)
    assert (model.exit_logits(late) - hf_logits(hf_model, ids)).abs().max() < ATOL


def test_staggered_lengths_late_layers_catch_up(hf_model):
    """Early layers cache MORE positions than late ones, then the late layers catch up."""
    model = CausalLM.from_hf(hf_model)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 64, (n,), generator=gen) for n in (6, 3)]
    provisional = torch.randint(0, 64, (2, 4), generator=gen)  # drafted tokens, 4 per row
    ids, num_prompt = right_pad(prompts)
    cache = model.new_cache(2, 16)
    model(ids, cache, num_prompt)

    # Step 1: early layers run ahead on 3 provisional tokens (in two calls), late layers idle.
    saved = [
        model.forward_layers(model.embed(provisional[:, :2]), 0, SPLIT, cache),
        model.forward_layers(model.embed(provisional[:, 2:3]), 0, SPLIT, cache),
    ]
    assert cache.lengths[:SPLIT].eq(num_prompt + 3).all()
    assert cache.lengths[SPLIT:].eq(num_prompt).all()

    # Step 2: early layers run further ahead (4th token) before the late layers catch up.
    saved.append(model.forward_layers(model.embed(provisional[:, 3:]), 0, SPLIT, cache))

    # Step 3: late layers catch up on the first 2 positions only, from saved hidden states.
    hidden = torch.cat(saved, dim=1)
    late = model.forward_layers(hidden[:, :2], SPLIT, model.num_layers, cache)
    logits = model.exit_logits(late)
    assert cache.lengths[SPLIT:].eq(num_prompt + 2).all()
    assert cache.lengths[:SPLIT].eq(num_prompt + 4).all()

    # Step 4: then on the remaining 2 (ragged: row 1 only accepts 1 of them).
    tail_new = torch.tensor([2, 1])
    tail = model.exit_logits(model.forward_layers(hidden[:, 2:], SPLIT, model.num_layers, cache, tail_new))
    cache.truncate(num_prompt + 2 + tail_new, layers=range(0, SPLIT))
    assert cache.lengths.eq(num_prompt + 2 + tail_new).all()

    for b, prompt in enumerate(prompts):
        full = torch.cat([prompt, provisional[b]])[None]
        ref = hf_logits(hf_model, full)[0, len(prompt) :]
        got = torch.cat([logits[b], tail[b, : int(tail_new[b])]])
        assert (got - ref[: len(got)]).abs().max() < ATOL

    # The cache is now a consistent chain: a further full decode step matches transformers.
    nxt = torch.randint(0, 64, (2, 1), generator=gen)
    step = model(nxt, cache)
    for b, prompt in enumerate(prompts):
        full = torch.cat([prompt, provisional[b, : 2 + int(tail_new[b])], nxt[b]])[None]
        assert (step[b, 0] - hf_logits(hf_model, full)[0, -1]).abs().max() < ATOL


def test_range_with_mixed_lengths_equals_layer_by_layer(hf_model):
    """Within one call every layer uses its own length (slots, mask), not the first layer's."""
    model = CausalLM.from_hf(hf_model)
    gen = torch.Generator().manual_seed(3)
    cache = model.new_cache(2, 16)
    model(torch.randint(0, 64, (2, 5), generator=gen), cache, torch.tensor([5, 3]))
    model.forward_layers(model.embed(torch.randint(0, 64, (2, 3), generator=gen)), 0, SPLIT, cache)
    reference = copy.deepcopy(cache)
    hidden = model.embed(torch.randint(0, 64, (2, 2), generator=gen))
    positions = torch.tensor([[9, 10], [7, 8]])
    num_new = torch.tensor([2, 1])

    fused = model.forward_layers(hidden, 0, model.num_layers, cache, num_new, positions)
    for layer in range(model.num_layers):
        hidden = model.forward_layers(hidden, layer, layer + 1, reference, num_new, positions)
    assert (fused[0] - hidden[0]).abs().max() < ATOL and (fused[1, :1] - hidden[1, :1]).abs().max() < ATOL
    assert torch.equal(cache.lengths, reference.lengths)
    assert cache.lengths[:, 0].tolist() == [10, 10, 7, 7]


def test_counters_count_layer_token_forwards():
    model = CausalLM.from_hf(tiny_llama(seed=12))
    cache = model.new_cache(3, 12)
    ids = torch.randint(0, 64, (3, 5), generator=torch.Generator().manual_seed(2))
    model(ids, cache, torch.tensor([5, 2, 0]))
    assert model.counters.layer_token_forwards == 4 * 7
    assert model.counters.lm_head_tokens == 15  # all B*T positions go through lm_head
    before = model.counters.snapshot()
    hidden = model.forward_layers(model.embed(ids[:, :3]), 1, 3, cache, torch.tensor([1, 3, 2]))
    model.exit_logits(hidden, exit_head=torch.nn.Linear(32, 64))
    assert model.counters.layer_token_forwards - before.layer_token_forwards == 2 * 6
    assert model.counters.calls == 2 and before.calls == 1
    assert model.counters.exit_head_tokens == 9 and model.counters.lm_head_tokens == 15
    model.counters.reset()
    assert model.counters.layer_token_forwards == 0 and model.counters.calls == 0
    assert before.layer_token_forwards == 28  # snapshot is a copy, unaffected by reset
