"""The CPU shim's ``murmur_hash32_cpu`` (seeded sampling and verify coins on CPU) equals
MurmurHash3 over SGLang's four blocks (seed low, seed high, position, column), written here
independently with Python integers, and SGLang's Triton kernel (values recorded by running it
under TRITON_INTERPRET=1)."""

from __future__ import annotations

import torch

from sglang_hsd.sglang_plugin.cpu.kernel_ops import murmur_hash32_cpu

MASK = 0xFFFFFFFF


def _reference(seed: int, position: int, column: int) -> int:
    def rotl(x, r):
        return ((x << r) | (x >> (32 - r))) & MASK

    h = 0
    for block in (seed & MASK, (seed >> 32) & MASK, position & MASK, column & MASK):
        k = rotl((block * 0xCC9E2D51) & MASK, 15)
        k = (k * 0x1B873593) & MASK
        h = (rotl(h ^ k, 13) * 5 + 0xE6546B64) & MASK
    h ^= 16
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & MASK
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & MASK
    return h ^ (h >> 16)


def test_murmur_hash_matches_python_reference_and_sglang_kernel():
    seeds = [0, 5, 2**40 + 3, 123456789012, 2**62 + 17]
    positions = [0, 10, 11, 999999, 2**31 + 5]
    columns = torch.arange(0, 300, 7)
    out = murmur_hash32_cpu(torch.tensor(seeds).to(torch.uint64),
                            torch.tensor(positions).to(torch.uint64), columns)
    assert out.dtype == torch.uint32 and out.shape == (5, columns.numel())
    for i, (seed, position) in enumerate(zip(seeds, positions)):
        assert [int(v) for v in out[i].to(torch.int64)] == [
            _reference(seed, position, int(c)) for c in columns]
    # SGLang's murmur_hash32_kernel (Triton, interpreted on CPU) for the first row, columns 0..3
    first = murmur_hash32_cpu(torch.tensor([0]), torch.tensor([0]), torch.arange(4))
    assert first.to(torch.int64)[0].tolist() == [2167721464, 10027521, 2423355346, 1368026766]
    assert murmur_hash32_cpu.default is murmur_hash32_cpu  # SGLang calls <op>.default
