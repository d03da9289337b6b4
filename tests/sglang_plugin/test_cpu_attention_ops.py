"""The torch stand-ins of SGLang's CPU attention ops (``cpu/kernel_ops.py``: decode and extend)
against an explicit per-query-head softmax written here, with grouped-query heads (several query
heads per KV head), several requests of different lengths, a KV cache scale and a logit cap.
No SGLang import needed."""

from __future__ import annotations

import math

import pytest
import torch

from sglang_hsd.sglang_plugin.cpu.kernel_ops import decode_attention_cpu, extend_attention_cpu

HQ, HKV, D = 6, 2, 8
POOL = 64


def reference(q, keys, values, scale, cap, visible, kv_head_of):
    """q [Tq, Hq, D], keys/values [Tk, Hkv, D], visible bool [Tq, Tk]; one head at a time."""
    out = torch.empty(q.shape[0], q.shape[1], values.shape[2], dtype=torch.float64)
    for h in range(q.shape[1]):
        kh = kv_head_of(h)
        for i in range(q.shape[0]):
            s = (keys[:, kh].double() @ q[i, h].double()) * scale
            if cap:
                s = cap * torch.tanh(s / cap)
            s = s.masked_fill(~visible[i], -math.inf)
            out[i, h] = torch.softmax(s, 0) @ values[:, kh].double()
    return out


def grouped(h):
    return h // (HQ // HKV)  # query heads 0..2 read KV head 0, 3..5 KV head 1


def interleaved(h):
    return h % HKV  # a plausible wrong head mapping the test must reject


def _cache(seed):
    gen = torch.Generator().manual_seed(seed)
    k_buffer = torch.randn(POOL, HKV, D, generator=gen)
    v_buffer = torch.randn(POOL, HKV, D, generator=gen)
    req_to_token = torch.randperm(POOL, generator=gen)[:48].view(2, 24)
    return gen, k_buffer, v_buffer, req_to_token


@pytest.mark.parametrize("requests", [1, 2])  # one request: the per-request path (_attend_row)
@pytest.mark.parametrize("kv_scale, cap", [(1.0, 0.0), (0.5, 0.0), (1.0, 3.0)])
def test_decode_attention_matches_the_per_head_softmax(kv_scale, cap, requests):
    gen, k_buffer, v_buffer, req_to_token = _cache(0)
    seq_lens = torch.tensor([19, 7])[:requests]
    pool_indices = torch.tensor([1, 0])[:requests]
    q = torch.randn(requests, HQ, D, generator=gen)
    k_new, v_new = torch.randn(2, requests, HKV, D, generator=gen)
    loc = torch.stack([req_to_token[r, int(n) - 1] for r, n in zip(pool_indices, seq_lens)])
    out = torch.empty(requests, HQ, D)
    decode_attention_cpu(q, k_buffer, v_buffer, kv_scale, kv_scale, out, k_new, v_new, loc, None,
                         req_to_token, pool_indices, seq_lens, 0.3, cap, False, 0, None, None)
    for b in range(requests):
        slots = req_to_token[pool_indices[b], : int(seq_lens[b])]
        keys, values = k_buffer[slots] * kv_scale, v_buffer[slots] * kv_scale
        assert torch.equal(k_buffer[loc[b]], k_new[b])  # the new token was written first
        visible = torch.ones(1, len(slots), dtype=torch.bool)
        want = reference(q[b : b + 1], keys, values, 0.3, cap, visible, grouped)[0]
        torch.testing.assert_close(out[b].double(), want, atol=1e-5, rtol=1e-5)
        wrong = reference(q[b : b + 1], keys, values, 0.3, cap, visible, interleaved)[0]
        assert (out[b].double() - wrong).abs().max() > 1e-2


@pytest.mark.parametrize("kv_scale, cap", [(1.0, 0.0), (2.0, 0.0), (1.0, 3.0)])
def test_causal_extend_attention_matches_the_per_head_softmax(kv_scale, cap):
    gen, k_buffer, v_buffer, req_to_token = _cache(1)
    seq_lens, extend = torch.tensor([9, 14]), torch.tensor([3, 5])
    pool_indices = torch.tensor([0, 1])
    starts = torch.tensor([0, 3])
    q, k, v = torch.randn(3, 8, HQ, D, generator=gen)
    k, v = k[:, :HKV], v[:, :HKV]
    out = torch.empty(8, HQ, D)
    extend_attention_cpu(q, k, v, out, k_buffer, v_buffer, kv_scale, kv_scale, req_to_token,
                         pool_indices, seq_lens, extend, starts, 5, 0.4, cap, False, 0, None,
                         None, None, True)
    for b in range(2):
        n, e, s = int(seq_lens[b]), int(extend[b]), int(starts[b])
        slots = req_to_token[pool_indices[b], : n - e]
        keys = torch.cat([k_buffer[slots] * kv_scale, k[s : s + e]])
        values = torch.cat([v_buffer[slots] * kv_scale, v[s : s + e]])
        visible = torch.arange(n).unsqueeze(0) <= (n - e) + torch.arange(e).unsqueeze(1)
        want = reference(q[s : s + e], keys, values, 0.4, cap, visible, grouped)
        torch.testing.assert_close(out[s : s + e].double(), want, atol=1e-5, rtol=1e-5)
        wrong = reference(q[s : s + e], keys, values, 0.4, cap, visible, interleaved)
        assert (out[s : s + e].double() - wrong).abs().max() > 1e-2
