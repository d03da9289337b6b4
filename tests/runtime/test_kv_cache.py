"""KVCache rollback (truncate), compaction (keep) and argument validation."""

import pytest
import torch

from sglang_hsd.runtime.kv_cache import KVCache
from sglang_hsd.runtime.model import CausalLM
from sglang_hsd.runtime.testing import decode_chain, tiny_llama

ATOL = 1e-5  # identical ops on identical inputs; only SDPA window length may differ


def test_truncate_rollback_equals_fresh_decode():
    model = CausalLM.from_hf(tiny_llama(seed=30))
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 64, (2, 4), generator=gen)
    first = torch.randint(0, 64, (2, 5), generator=gen)
    second = torch.randint(0, 64, (2, 2), generator=gen)

    cache = model.new_cache(2, 16)
    model(prompt, cache)
    decode_chain(model, cache, first)  # decode 5
    cache.truncate(torch.tensor([7, 7]))  # keep prompt + 3
    rolled = decode_chain(model, cache, second)  # decode 2 different tokens

    fresh_cache = model.new_cache(2, 16)
    model(prompt, fresh_cache)
    decode_chain(model, fresh_cache, first[:, :3])
    fresh = decode_chain(model, fresh_cache, second)
    assert (rolled - fresh).abs().max() < ATOL
    assert torch.equal(cache.lengths, fresh_cache.lengths)
    for layer in range(model.num_layers):
        assert (cache.keys(layer)[:, :, :9] - fresh_cache.keys(layer)[:, :, :9]).abs().max() < ATOL


def test_truncate_validation():
    cache = KVCache(num_layers=3, batch_size=2, num_kv_heads=1, head_dim=4, max_len=8)
    cache.lengths[:] = torch.tensor([5, 3])
    cache.truncate(torch.tensor([4, 3]), layers=range(1, 3))
    assert cache.lengths.tolist() == [[5, 3], [4, 3], [4, 3]]
    with pytest.raises(ValueError, match="new_lengths may only shrink"):
        cache.truncate(torch.tensor([5, 3]))
    with pytest.raises(ValueError, match="new_lengths must be >= 0"):
        cache.truncate(torch.tensor([-1, 0]))
    with pytest.raises(ValueError, match="new_lengths must be a LongTensor of shape"):
        cache.truncate(torch.tensor([1, 1, 1]))
    with pytest.raises(ValueError, match="layers must lie within"):
        cache.truncate(torch.tensor([1, 1]), layers=range(2, 4))


def test_keep_compacts_selected_slots_in_order():
    cache = KVCache(num_layers=2, batch_size=2, num_kv_heads=1, head_dim=1, max_len=8)
    # Slot s of row b holds 10*b + s in both layers; tree nodes start at slot 2 (row 0), 1 (row 1).
    ramp = (torch.arange(2)[:, None] * 10 + torch.arange(9)[None, :]).float()
    cache._k[:] = ramp[None, :, None, :, None]
    cache._v[:] = -ramp[None, :, None, :, None]
    cache.lengths[:] = torch.tensor([7, 5])
    cache.keep(range(0, 2), torch.tensor([2, 1]), torch.tensor([[0, 3, 4], [2, 0, 0]]), torch.tensor([3, 1]))
    assert cache.lengths.tolist() == [[5, 2], [5, 2]]
    for layer in range(2):
        assert cache.keys(layer)[0, 0, :5, 0].tolist() == [0, 1, 2, 5, 6]
        assert cache.keys(layer)[1, 0, :2, 0].tolist() == [10, 13]
        assert cache.values(layer)[0, 0, :5, 0].tolist() == [0, -1, -2, -5, -6]


def test_keep_validation():
    cache = KVCache(num_layers=2, batch_size=1, num_kv_heads=1, head_dim=1, max_len=8)
    cache.lengths[:] = 4
    start, keep_len = torch.tensor([2]), torch.tensor([1])
    with pytest.raises(ValueError, match="keep_index must point at written tree nodes"):
        cache.keep(range(2), start, torch.tensor([[2]]), keep_len)
    with pytest.raises(ValueError, match="keep_len must be in"):
        cache.keep(range(2), start, torch.tensor([[0]]), torch.tensor([2]))
    with pytest.raises(ValueError, match="keep_index must be"):
        cache.keep(range(2), start, torch.tensor([0]), keep_len)
    with pytest.raises(ValueError, match="start must be in"):
        cache.keep(range(2), torch.tensor([5]), torch.tensor([[0]]), keep_len)
