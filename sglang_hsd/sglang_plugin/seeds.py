"""Seeded random streams of the exit level (reproducible draws for seeded requests).

SGLang derives a seeded request's draws from ``murmur_hash32(seed, key, column)``: the verify
coins use key = the committed length s (``_seeded_verify_coins``), draft proposals key = a
position and column = draft step x vocabulary + token (``fast_sample``). The exit level draws
coins and continuation drafts of its own, possibly several times per round (sub-rounds), from
streams separated by a domain tag and the sub-round.
"""

from __future__ import annotations

import torch

from sglang_hsd.counter_rng import domain_seed

# Domain tags (XORed into the request's seed).
EXIT_COIN_SEED_TAG = 0x5EED_E417
CONTINUATION_SEED_TAG = 0xD4AF_7C0E


def sub_round_seed(sampling_seed: torch.Tensor, tag: int, sub_round: int) -> torch.Tensor:
    """A seeded stream of its own for exit sub-round ``sub_round`` (int64 [B] seeds).

    Callers key the draws by the round's window start s, which no other round of the request
    shares, so with the sub-round in the seed no two draws of a request share a key (a reused
    key would make a later draw depend on what an earlier one decided). Bits 48.. hold the
    sub-round, so the seed stays a non-negative int64 for seeds below 2^48.
    """
    return domain_seed(sampling_seed, tag, sub_round)
