"""Seeded streams of the exit level: every (round, sub-round) of a request draws from its own
key, reproducibly (``sglang_plugin/seeds.py``)."""

from __future__ import annotations

import pytest
import torch

from sglang_hsd.sglang_plugin.seeds import (
    CONTINUATION_SEED_TAG,
    EXIT_COIN_SEED_TAG,
    sub_round_seed,
)


def test_sub_round_seeds_are_distinct_and_non_negative():
    seeds = torch.tensor([0, 7, 2**40 + 3])
    streams = [sub_round_seed(seeds, tag, j) for tag in (EXIT_COIN_SEED_TAG, CONTINUATION_SEED_TAG)
               for j in range(16)]
    keys = {(i, int(s[i])) for s in streams for i in range(3)}
    assert len(keys) == 3 * len(streams)  # no two (tag, sub-round) pairs share a seed
    assert all(bool((s >= 0).all()) for s in streams)


@pytest.mark.sglang
def test_exit_coins_are_reproducible_and_never_reused_across_rounds():
    pytest.importorskip("sglang")
    from sglang_hsd.sglang_plugin.exit_level import exit_uniforms

    seed = torch.tensor([5, 5])
    window_start = torch.tensor([10, 11])  # the same request in two consecutive rounds
    coins = {j: exit_uniforms(seed, window_start, 4, j) for j in range(4)}
    again = exit_uniforms(seed, window_start, 4, 2)
    assert torch.equal(coins[2].accept, again.accept) and torch.equal(coins[2].sample, again.sample)
    rows = [tuple(coins[j].accept[r].tolist()) for j in coins for r in range(2)]
    assert len(set(rows)) == len(rows)  # every (round, sub-round) has its own coins
    assert bool(((coins[0].accept >= 0) & (coins[0].accept < 1)).all())
