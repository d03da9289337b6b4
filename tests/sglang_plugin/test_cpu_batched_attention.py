"""The batched form of the CPU attention stand-ins (``cpu/batched_attention.py``) against their
per-request loop (``cpu/kernel_ops.py`` with the batched form turned off, itself checked against
an explicit softmax in ``test_cpu_attention_ops.py``): decode, a one-token verify, causal extends
of different lengths, a request with no cached prefix, a non-causal extend and a tree mask; a
wrong mask (each new token sees the whole request's new tokens in a causal extend) differs."""

from __future__ import annotations

import pytest
import torch

from sglang_hsd.sglang_plugin.cpu import batched_attention
from sglang_hsd.sglang_plugin.cpu.kernel_ops import decode_attention_cpu, extend_attention_cpu

HQ, HKV, D, POOL = 6, 2, 8, 96


def _cache(seed):
    gen = torch.Generator().manual_seed(seed)
    k_buffer, v_buffer = torch.randn(2, POOL, HKV, D, generator=gen)
    req_to_token = torch.randperm(POOL, generator=gen)[:90].view(3, 30)
    return gen, k_buffer, v_buffer, req_to_token


def _both(monkeypatch, call):
    """``call()``'s output with the batched form, then with the per-request loop."""
    batched = call()
    monkeypatch.setattr(batched_attention, "BATCHED_MAX_SCORES", 0)
    looped = call()
    monkeypatch.undo()
    return batched, looped


def test_batched_decode_equals_the_loop(monkeypatch):
    gen, k_buffer, v_buffer, req_to_token = _cache(0)
    seq_lens, pool_indices = torch.tensor([5, 27, 13]), torch.tensor([2, 0, 1])
    q = torch.randn(3, HQ, D, generator=gen)

    def call():
        out = torch.full((3, HQ, D), float("nan"))
        decode_attention_cpu(q, k_buffer, v_buffer, 0.5, 0.5, out, None, None, None, None,
                             req_to_token, pool_indices, seq_lens, 0.3, 0.0, False, 0, None, None)
        return out

    batched, looped = _both(monkeypatch, call)
    torch.testing.assert_close(batched, looped, atol=1e-5, rtol=1e-5)


def _extend(gen, k_buffer, v_buffer, req_to_token, seq_lens, extend, tree_mask=None, causal=True):
    starts = torch.cumsum(extend, 0) - extend
    rows = int(extend.sum())
    q, k, v = torch.randn(3, rows, HQ, D, generator=gen)
    k, v = k[:, :HKV].contiguous(), v[:, :HKV].contiguous()

    def call():
        out = torch.full((rows, HQ, D), float("nan"))
        extend_attention_cpu(q, k, v, out, k_buffer, v_buffer, 1.0, 1.0, req_to_token,
                             torch.tensor([1, 2, 0]), seq_lens, extend, starts, int(extend.max()),
                             0.4, 0.0, False, 0, None, None, tree_mask, causal)
        return out

    return call


@pytest.mark.parametrize("seq_lens, extend", [
    ([12, 25, 7], [1, 1, 1]),   # a one-token verify (a round that drafted nothing)
    ([12, 25, 7], [5, 2, 7]),   # chains of different lengths; the last has no cached prefix
    ([9, 9, 9], [3, 3, 3]),
])
@pytest.mark.parametrize("causal", [True, False])
def test_batched_extend_equals_the_loop(monkeypatch, seq_lens, extend, causal):
    gen, k_buffer, v_buffer, req_to_token = _cache(1)
    call = _extend(gen, k_buffer, v_buffer, req_to_token, torch.tensor(seq_lens), torch.tensor(extend),
                   causal=causal)
    batched, looped = _both(monkeypatch, call)
    assert not batched.isnan().any()
    torch.testing.assert_close(batched, looped, atol=1e-5, rtol=1e-5)


def test_batched_tree_extend_equals_the_loop_and_a_wrong_mask_differs(monkeypatch):
    gen, k_buffer, v_buffer, req_to_token = _cache(2)
    extend = torch.tensor([4, 3, 4])
    seq_lens = torch.tensor([10, 20, 6])
    # Request 0: root -> {1, 2}, 1 -> 3; request 1: a chain; request 2: root -> {1, 2, 3}.
    blocks = [torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]),
              torch.tril(torch.ones(3, 3, dtype=torch.long)),
              torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 0, 1]])]
    tree_mask = torch.cat([b.reshape(-1) for b in blocks]).bool()
    call = _extend(gen, k_buffer, v_buffer, req_to_token, seq_lens, extend, tree_mask=tree_mask)
    batched, looped = _both(monkeypatch, call)
    torch.testing.assert_close(batched, looped, atol=1e-5, rtol=1e-5)
    wrong = torch.cat([torch.ones_like(b).reshape(-1) for b in blocks]).bool()
    gen, k_buffer, v_buffer, req_to_token = _cache(2)
    wrong_out = _extend(gen, k_buffer, v_buffer, req_to_token, seq_lens, extend, tree_mask=wrong)()
    assert (wrong_out - batched).abs().max() > 1e-2
