"""Keyed noise and the child samplers (``tree_draft/noise.py``, ``tree_draft/children.py``).

The exact tests (``test_exact.py``) weight every ordered draw by the Plackett-Luce law; here the
samplers with the keyed noise are shown to sample that law (chi-square over ordered triples: the
inverse-transform sampler on keyed uniforms and Gumbel top-k on keyed Gumbel vectors, while a
plausible slip of the first, drawing from the whole of q and stepping past tokens already drawn,
is rejected), the lossy sampler its own i.i.d. law, and the keys to be what reproducibility and
tensor parallelism need: a request's noise depends on its seed, position and level only, not on
the batch around it.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from sglang_hsd.counter_rng import murmur_hash32, open_uniforms
from sglang_hsd.tree_draft import CHILD_SAMPLERS, KeyedNoise
from sglang_hsd.tree_draft.children import BLOCK, ChildSampler, sequential_draws
from sglang_hsd.verify.oracles.stats import chi_square_p_value

P_VALUE_FLOOR = 1e-4  # fixed seeds: a correct sampler passes; the floor leaves room for 20+ such tests
REJECT_P_VALUE = 1e-6
NUM_ROWS = 40_000
Q = torch.tensor([0.05, 0.4, 0.25, 0.2, 0.1], dtype=torch.float64)


def keyed_noise(sampler: ChildSampler, noise: KeyedNoise, k: int, vocab: int) -> torch.Tensor:
    """The root level's noise of one node per row in the shape ``sampler.draw`` takes."""
    draws = sampler.noise_draws(k)
    if sampler.noise == "uniform":
        return noise.uniform(0, 1, draws)[:, 0]
    return noise.gumbel(0, 1, draws, vocab)[:, 0]


def _draw(sampler, q: torch.Tensor, k: int, seed: int = 0) -> torch.Tensor:
    """k children of NUM_ROWS nodes with row q, keyed noise of NUM_ROWS seeds: int64 [R, k]."""
    entry = CHILD_SAMPLERS[sampler] if isinstance(sampler, str) else sampler
    seeds = torch.arange(NUM_ROWS, dtype=torch.long) + seed * NUM_ROWS
    noise = keyed_noise(entry, KeyedNoise(seeds, torch.full((NUM_ROWS,), 17)), k, q.numel())
    tokens, valid = entry.draw(q.expand(NUM_ROWS, -1), noise, torch.zeros(NUM_ROWS, dtype=torch.bool), k)
    assert valid.all()
    return tokens


def skip_drawn(q: torch.Tensor, uniforms: torch.Tensor, deterministic: torch.Tensor, k: int):
    """A plausible slip of the inverse-transform sampler: draw j inverts the cumulative mass of the
    whole of q (drawn tokens included) and steps on to the next token not drawn yet. Tokens that
    follow a likely one are drawn too often. Same signature as ``ChildSampler.draw``."""
    rows, vocab = q.shape
    cumulative = torch.cumsum(q.double(), -1)
    drawn = torch.full((rows, k), -1, dtype=torch.long)
    for j in range(k):
        x = uniforms[:, j] * cumulative[:, -1]
        token = torch.searchsorted(cumulative, x.unsqueeze(-1), right=True).squeeze(-1).clamp_max(vocab - 1)
        for _ in range(vocab):  # past drawn and zero-mass tokens, cyclically
            taken = (token.unsqueeze(-1) == drawn).any(-1) | (q.gather(1, token.unsqueeze(-1)).squeeze(-1) <= 0)
            token = torch.where(taken, (token + 1) % vocab, token)
        drawn[:, j] = token
    top_values, top_tokens = torch.topk(q, k, dim=-1)
    return torch.where(deterministic.unsqueeze(-1), top_tokens, drawn), top_values > 0


SKIP_DRAWN = ChildSampler("skip_drawn", "inverse transform over the whole q, stepping past drawn tokens (lossy)",
                          lambda k: k, skip_drawn, lossless=False, noise="uniform")


def _plackett_luce(q: torch.Tensor, order: tuple) -> float:
    prob, left = 1.0, 1.0
    for token in order:
        prob *= float(q[token]) / left
        left -= float(q[token])
    return prob


def _counts(tokens: torch.Tensor, outcomes: list) -> torch.Tensor:
    index = {outcome: i for i, outcome in enumerate(outcomes)}
    counts = torch.zeros(len(outcomes))
    for row in map(tuple, tokens.tolist()):
        counts[index[row]] += 1
    return counts


@pytest.mark.parametrize("sampler", ["inverse_cdf", "gumbel_topk"])
def test_samplers_draw_ordered_draws_without_replacement(sampler):
    outcomes = list(itertools.permutations(range(5), 3))
    tokens = _draw(sampler, Q, 3)
    expected = torch.tensor([_plackett_luce(Q, o) for o in outcomes], dtype=torch.float64)
    assert abs(float(expected.sum()) - 1) < 1e-12
    assert chi_square_p_value(_counts(tokens, outcomes), expected) > P_VALUE_FLOOR


def test_stepping_past_drawn_tokens_is_not_without_replacement():
    outcomes = list(itertools.permutations(range(5), 3))
    expected = torch.tensor([_plackett_luce(Q, o) for o in outcomes], dtype=torch.float64)
    assert chi_square_p_value(_counts(_draw(SKIP_DRAWN, Q, 3), outcomes), expected) < REJECT_P_VALUE


def test_inverse_transform_across_blocks_and_float32_rows():
    """A vocabulary of several blocks (one partial), float32 rows, mass in a few tokens of distant
    blocks: the k draws are distinct tokens of positive mass, the argmax-first variant leads with
    the argmax, and draws follow q (the first draw's frequencies, chi-square)."""
    vocab, rows = 2 * BLOCK + 37, 20_000
    hot = torch.tensor([5, BLOCK - 1, BLOCK, 2 * BLOCK + 36])  # block edges and the partial block
    q = torch.zeros(vocab)
    q[hot] = torch.tensor([0.1, 0.2, 0.3, 0.4])
    uniforms = KeyedNoise(torch.arange(rows), torch.zeros(rows, dtype=torch.long)).uniform(0, 1, 4)[:, 0]
    tokens = sequential_draws(q.expand(rows, -1), uniforms, 4)
    assert bool(torch.isin(tokens, hot).all()) and all(len(set(r)) == 4 for r in tokens[:200].tolist())
    first = CHILD_SAMPLERS["argmax_first_cdf"].draw(q.expand(rows, -1), uniforms, torch.zeros(rows, dtype=torch.bool), 4)[0]
    assert bool((first[:, 0] == hot[3]).all())
    counts = torch.stack([(tokens[:, 0] == t).sum() for t in hot]).double()
    assert chi_square_p_value(counts, q[hot].double()) > P_VALUE_FLOOR


def test_with_replacement_samples_iid_draws_and_is_not_without_replacement():
    outcomes = list(itertools.product(range(5), repeat=2))
    tokens = _draw("with_replacement", Q, 2)
    iid = torch.tensor([float(Q[a] * Q[b]) for a, b in outcomes], dtype=torch.float64)
    assert chi_square_p_value(_counts(tokens, outcomes), iid) > P_VALUE_FLOOR
    without = torch.tensor([_plackett_luce(Q, (a, b)) if a != b else 0.0 for a, b in outcomes], dtype=torch.float64)
    assert chi_square_p_value(_counts(tokens, outcomes), without) < REJECT_P_VALUE


@pytest.mark.parametrize("sampler", ["inverse_cdf", "gumbel_topk"])
def test_support_below_k_gives_invalid_children_and_deterministic_rows_take_the_top_k(sampler):
    q = torch.tensor([[0.0, 0.7, 0.0, 0.3], [0.1, 0.2, 0.3, 0.4]], dtype=torch.float64)
    entry = CHILD_SAMPLERS[sampler]
    noise = keyed_noise(entry, KeyedNoise(torch.tensor([1, 2]), torch.tensor([0, 0])), 3, 4)
    tokens, valid = entry.draw(q, noise, torch.tensor([False, True]), 3)
    assert valid[0].tolist() == [True, True, False] and sorted(tokens[0, :2].tolist()) == [1, 3]
    assert valid[1].all() and tokens[1].tolist() == [3, 2, 1]


def test_keys_depend_on_seed_position_and_level_not_on_the_batch():
    """Two tensor-parallel ranks (or two batches) holding the same request draw the same noise."""
    seeds, positions = torch.tensor([5, 7, 9]), torch.tensor([100, 3, 100])
    whole = KeyedNoise(seeds, positions).gumbel(2, 2, 1, 11)
    alone = KeyedNoise(seeds[1:2], positions[1:2]).gumbel(2, 2, 1, 11)
    assert torch.equal(whole[1:2], alone)
    assert not torch.equal(whole, KeyedNoise(seeds, positions + 1).gumbel(2, 2, 1, 11))
    assert not torch.equal(whole, KeyedNoise(seeds, positions).gumbel(3, 2, 1, 11))
    assert not torch.equal(whole[:, 0], whole[:, 1])  # the forwards of a level have their own keys
    assert torch.isfinite(whole).all()
    uniform = KeyedNoise(seeds, positions).uniform(2, 2, 3)
    assert torch.equal(uniform[1:2], KeyedNoise(seeds[1:2], positions[1:2]).uniform(2, 2, 3))
    assert not torch.equal(uniform, KeyedNoise(seeds, positions).uniform(3, 2, 3))
    assert bool((uniform > 0).all()) and bool((uniform < 1).all())


def test_uniforms_stay_inside_the_open_interval():
    extremes = torch.tensor([[0, 1, 2**32 - 2, 2**32 - 1]])
    u = open_uniforms(extremes)
    assert bool((u > 0).all()) and bool((u < 1).all())
    assert murmur_hash32(torch.tensor([3]), torch.tensor([4]), torch.arange(5)).shape == (1, 5)


def test_fresh_streams_differ_per_row_and_follow_the_generator():
    position = torch.zeros(4, dtype=torch.long)
    a = KeyedNoise.fresh(position, torch.Generator().manual_seed(1))
    b = KeyedNoise.fresh(position, torch.Generator().manual_seed(1))
    assert torch.equal(a.seed, b.seed) and a.seed.unique().numel() == 4


@pytest.mark.parametrize("bad", [torch.zeros(2, 2, dtype=torch.long), torch.zeros(2)])
def test_keyed_noise_refuses_bad_keys(bad):
    with pytest.raises(ValueError, match="seed and position"):
        KeyedNoise(bad, bad)


def test_target_keyed_noise_is_the_targets_keyed_gumbel_at_each_depth():
    """Level l of a seeded round takes G(seed, root position + l, target token id) for every
    forward and draw: the key of the target's row at that depth (``verify/coupled.py``)."""
    from sglang_hsd.tree_draft import TargetKeyedNoise
    from sglang_hsd.verify.coupled import keyed_gumbel

    seed, root = torch.tensor([5, 9]), torch.tensor([10, 30])
    ids = torch.tensor([7, 3, 11, 0])  # a reduced draft vocabulary's target ids
    noise = TargetKeyedNoise(seed, root, ids)
    level2 = noise.gumbel(2, forwards=3, draws=1, vocab=4)
    assert level2.shape == (2, 3, 1, 4)
    expected = keyed_gumbel(seed, root + 2, ids)
    assert torch.equal(level2[:, 1, 0], expected) and torch.equal(level2[:, 0, 0], expected)
    assert torch.equal(TargetKeyedNoise(seed, root).gumbel(0, 1, 1, 12)[:, 0, 0], keyed_gumbel(seed, root, 12))
    with pytest.raises(ValueError, match="Gumbel"):
        noise.uniform(0, 1, 1)
