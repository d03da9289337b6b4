"""The one-node coupling bound (``verify/oracles/root_coupling.py``) against exact enumeration."""

import numpy as np
import pytest
import torch

from sglang_hsd.verify.oracles import tree_exact
from sglang_hsd.verify.oracles.exact import context_free_world
from sglang_hsd.verify.oracles.root_coupling import (exact_optimum, inclusion_probabilities, miss_probabilities,
                                                     node_bound, swor_set_law)


def _pair(seed: int, vocab: int, sharp: float = 1.0):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(vocab, sharp))
    q = rng.dirichlet(np.full(vocab, sharp))
    return p, q


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("seed", range(4))
def test_inclusion_and_miss_probabilities_match_enumeration(seed, k):
    _, q = _pair(seed, 6, sharp=0.5)
    law = swor_set_law(q, k)
    pi = inclusion_probabilities(torch.tensor(q)[None], torch.zeros(1, dtype=torch.float64), k)[0].numpy()
    exact_pi = np.array([sum(prob for s, prob in law.items() if x in s) for x in range(len(q))])
    assert abs(pi.sum() - k) < 1e-6
    np.testing.assert_allclose(pi, exact_pi, atol=1e-7)
    miss = miss_probabilities(torch.tensor(q)[None], torch.zeros(1, dtype=torch.float64), k)[0].numpy()
    for j in range(len(q) + 1):
        exact = sum(prob for s, prob in law.items() if not s & set(range(j)))
        assert abs(miss[j] - exact) < 1e-7, (j, miss[j], exact)


def test_rest_stream_stands_for_many_small_tokens():
    """Eight tokens of visible mass plus 400 tiny ones: the Poisson stream for the tiny ones gives
    the inclusion probabilities of the explicit computation."""
    rng = np.random.default_rng(3)
    big = rng.dirichlet(np.ones(8)) * 0.9
    tiny = np.full(400, 0.1 / 400)
    explicit = inclusion_probabilities(torch.tensor(np.concatenate([big, tiny]))[None], torch.zeros(1, dtype=torch.float64), 3)
    lumped = inclusion_probabilities(torch.tensor(big)[None], torch.tensor([0.1], dtype=torch.float64), 3)
    np.testing.assert_allclose(lumped[0].numpy(), explicit[0, :8].numpy(), atol=2e-4)


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("seed", range(6))
def test_bound_is_above_the_optimum_and_the_verifiers(seed, k):
    """bound >= alpha* (every H enumerated) >= what RRS and the traversal verifier accept on a
    one-level tree of k children drawn without replacement."""
    p, q = _pair(seed, 5, sharp=0.7)
    optimum = exact_optimum(p, q, k)
    out = node_bound(torch.tensor(p)[None], torch.tensor(q)[None], k)
    assert float(out["bound"][0]) >= optimum - 1e-7
    assert float(out["bound_nested"][0]) >= optimum - 1e-7
    world = context_free_world(p.tolist(), q.tolist(), max_len=2)
    for method in ("rrs", "hsd"):
        accepted = tree_exact.tree_expected_accepted(world, method, k, 1, (), "without-replacement")
        assert accepted <= optimum + 1e-9, (method, accepted, optimum)
    assert abs(float(out["stock"][0]) - p[np.argsort(-q, kind="stable")[:k]].sum()) < 1e-12


def test_nested_bound_is_tight_on_most_tiny_pairs():
    """The nested family finds alpha* itself on most random pairs (a loose bound would hide
    headroom); a wrong family (H ordered by q instead of p / pi) is looser on some pair."""
    tight, looser = 0, 0
    for seed in range(12):
        p, q = _pair(100 + seed, 5, sharp=0.7)
        optimum = exact_optimum(p, q, 2)
        bound = float(node_bound(torch.tensor(p)[None], torch.tensor(q)[None], 2)["bound"][0])
        tight += abs(bound - optimum) < 1e-6
        order = np.argsort(-q)
        miss = miss_probabilities(torch.tensor(q[order])[None], torch.zeros(1, dtype=torch.float64), 2)[0].numpy()
        by_q = min(1 - p[order[:j]].sum() + 1 - miss[j] for j in range(6))
        looser += by_q > optimum + 1e-6
    assert tight >= 10
    assert looser >= 1


def test_bad_arguments_are_named():
    p = torch.full((1, 4), 0.25, dtype=torch.float64)
    with pytest.raises(ValueError, match="p and q must both be"):
        node_bound(p, p[:, :3], 1)
    with pytest.raises(ValueError, match="k must be in 1..4"):
        node_bound(p, p, 5)
