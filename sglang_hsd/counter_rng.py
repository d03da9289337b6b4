"""Counter-based random numbers: a draw is a pure function of its key, not of a generator's state.

Why: a draw keyed by (request seed, position, column) gives the same value whichever batch the
request shares, whichever device or tensor-parallel rank computes it, and inside a captured CUDA
graph (no generator state to advance, no host synchronisation). SGLang keys its own seeded
sampling the same way (MurmurHash3 of a 64-bit seed, a 32-bit position and a 32-bit column), so
``murmur_hash32`` here returns exactly the values of SGLang's Triton ``murmur_hash32_kernel``
(``tests/test_counter_rng.py`` pins them).

Every product is split into 16-bit halves so that no intermediate leaves the int64 range: the
same code is exact in eager torch, under ``torch.compile`` (where signed overflow is undefined
behaviour in the generated C++) and on every device.
"""

from __future__ import annotations

import torch

_U32 = 0xFFFFFFFF
_TWO_POW_32 = 4294967296.0


def _mul32(x: torch.Tensor, constant: int) -> torch.Tensor:
    """(x * constant) mod 2^32 for int64 x in [0, 2^32), without int64 overflow."""
    low, high = constant & 0xFFFF, constant >> 16
    return (x * low + (((x * high) & 0xFFFF) << 16)) & _U32


def _rotl32(x: torch.Tensor, r: int) -> torch.Tensor:
    return ((x << r) | (x >> (32 - r))) & _U32


def _mix(h: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
    k = _rotl32(_mul32(block, 0xCC9E2D51), 15)
    k = _mul32(k, 0x1B873593)
    h = _rotl32(h ^ k, 13)
    return (_mul32(h, 5) + 0xE6546B64) & _U32


def murmur_hash32(seed: torch.Tensor, position: torch.Tensor, column: torch.Tensor) -> torch.Tensor:
    """MurmurHash3 (32 bit) of the blocks (seed low, seed high, position, column).

    Args:
        seed: int [R] (any integer dtype; 64 bits are hashed).
        position: int [R] (the low 32 bits are hashed).
        column: int [C] (the low 32 bits are hashed).
    Returns:
        int64 [R, C] in [0, 2^32).
    """
    seed = seed.to(torch.int64).view(-1, 1)
    h = _mix(torch.zeros_like(seed), seed & _U32)
    h = _mix(h, (seed >> 32) & _U32)
    h = _mix(h, position.to(torch.int64).view(-1, 1) & _U32)
    h = _mix(h, column.to(torch.int64).view(1, -1) & _U32)
    h = h ^ 16  # the key length in bytes
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def open_uniforms(hashed: torch.Tensor) -> torch.Tensor:
    """float64 uniforms strictly inside (0, 1) from 32-bit hashes (int64 [...] in [0, 2^32)).

    The midpoint of each of the 2^32 cells: never 0 or 1, so logs and Gumbel noise stay finite."""
    return (hashed.to(torch.float64) + 0.5) / _TWO_POW_32


def gumbel_from_hash(hashed: torch.Tensor) -> torch.Tensor:
    """float64 standard Gumbel noise -log(-log u) from 32-bit hashes (int64 [...])."""
    return -torch.log(-torch.log(open_uniforms(hashed)))


def seeded_sampler_gumbel(hashed: torch.Tensor) -> torch.Tensor:
    """float64 standard Gumbel noise from 32-bit hashes with the mapping of SGLang's seeded sampler
    (``multinomial_with_seed``: u = hash / (2^32 - 1), both ends clamped), so draws keyed like
    SGLang's equal its draws (``verify/coupled.py``)."""
    x = hashed.to(torch.float64).div_(float(_U32))
    x.log_().clamp_(min=torch.finfo(torch.float64).min, max=-(2.0 ** -32)).neg_()
    return x.log_().neg_()


def domain_seed(seed: torch.Tensor, tag: int, index: int = 0) -> torch.Tensor:
    """The seed of a stream of its own: ``seed ^ tag ^ (index << 48)`` (int64 [R]).

    Draws of different purposes (verify coins, tree noise, exit sub-rounds) hash the same
    (position, column) keys; a domain tag and an index in bits 48.. keep their streams apart, so
    no draw of a request shares a key with another (a reused key would make one draw depend on
    what another decided). For seeds below 2^48 the result stays a non-negative int64.
    """
    if not 0 <= index < 2**15:
        raise ValueError(f"index must be in [0, 2^15), got {index}")
    return seed.to(torch.int64) ^ tag ^ (index << 48)
