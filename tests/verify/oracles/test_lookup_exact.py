"""The lookup hierarchy (``lookup`` drafts, a middle model verifies, the target verifies) is lossless.

Exact enumeration over several target rounds with multi-token prefixes (``lookup_exact``), in
context-dependent worlds whose prompt makes the lookup copy; the slip of handing a copied token up
with the lookup's one-hot q instead of the middle's row fails the same check. The batched runtime
itself is checked statistically in ``tests/runtime/test_engine_lookup.py``."""

from __future__ import annotations

import pytest
import torch

from sglang_hsd.lookup_draft import lookup_continuation
from sglang_hsd.verify.oracles.exact import random_world
from sglang_hsd.verify.oracles.lookup_exact import lookup_prefix_distribution, lookup_prefix_tv, middle_buffer_law

PROMPTS = ((0, 1, 2, 0, 1), (2, 2, 1, 2, 0, 2))
LENGTH = 3


def _world(seed: int, concentration: float = 0.7):
    # contexts reach LENGTH - 1 committed + buffer (< N_1 + N_d) + a copy (N_d) tokens
    return random_world(vocab_size=3, max_len=10, seed=seed, concentration=concentration)


def test_lookup_copies_the_continuation_of_the_latest_match():
    ctx = torch.tensor([5, 6, 7, 9, 5, 6, 8, 1, 5, 6])
    assert lookup_continuation(ctx, 2, 3).tolist() == [8, 1, 5]  # latest "5 6" first
    assert lookup_continuation(ctx, 3, 1).tolist() == [8]  # no earlier "1 5 6": the 2-gram matches
    assert lookup_continuation(torch.tensor([1, 2, 3]), 3, 4).tolist() == []  # nothing earlier
    assert lookup_continuation(torch.tensor([4, 4]), 1, 4).tolist() == [4]
    longest = torch.tensor([1, 2, 3, 7, 9, 2, 3, 8, 1, 2, 3])
    assert lookup_continuation(longest, 3, 2).tolist() == [7, 9]  # "1 2 3" beats the later "2 3"
    with pytest.raises(ValueError, match="max_ngram and max_tokens"):
        lookup_continuation(ctx, 0, 2)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("ngram,num_draft,buffer", [(1, 1, 1), (2, 2, 2), (3, 2, 3), (2, 3, 1)])
@pytest.mark.parametrize("methods", [("hsd", "hsd"), ("tokenwise", "hsd"), ("hsd", "tokenwise")])
def test_three_levels_with_a_lookup_drafter_keep_the_target_law(seed, prompt, ngram, num_draft, buffer, methods):
    world = _world(seed)
    tv = lookup_prefix_tv(world, prompt, ngram, num_draft, buffer, LENGTH, *methods)
    assert tv < 1e-12
    # the lookup really copied: some buffers hold accepted copies
    buffers = middle_buffer_law(world, prompt, (), ngram, num_draft, buffer, methods[0])
    assert any(copied for buf in buffers for _, copied in buf)
    assert sum(lookup_prefix_distribution(world, prompt, ngram, num_draft, buffer, LENGTH,
                                          *methods).values()) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_handing_copies_up_with_the_lookups_q_is_caught(seed, prompt):
    world = _world(seed)
    assert lookup_prefix_tv(world, prompt, 2, 2, 2, LENGTH, middle_q="middle") < 1e-12
    assert lookup_prefix_tv(world, prompt, 2, 2, 2, LENGTH, middle_q="one-hot") > 1e-3
