"""Exact-enumeration checks of the chain verifiers' math (float64 oracle, no sampling)."""

from fractions import Fraction

import pytest

from sglang_hsd.verify.oracles import exact

pytestmark = pytest.mark.exact

# Enumeration in float64 reaches ~1e-16; anything above 1e-12 is a real bias.
LOSSLESS_TV = 1e-12
# The published uncapped rule is biased by 0.3%-8% on these worlds; 1e-3 separates it from noise.
LOSSY_TV = 1e-3


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("num_draft", [1, 2, 3, 4])
@pytest.mark.parametrize("method", ["hsd", "tokenwise"])
def test_lossless_methods_match_target_on_multi_token_prefixes(method, num_draft, seed):
    # Prefix length num_draft + 2 always spans at least two rounds.
    world = exact.random_world(vocab_size=3, max_len=2 * num_draft + 2, seed=seed)
    for length in range(2, num_draft + 3):
        tv = exact.prefix_tv(world, method, num_draft, length)
        assert tv < LOSSLESS_TV, f"{method} K={num_draft} L={length} seed={seed}: TV {tv:.3g}"


@pytest.mark.parametrize("draft", ["independent", "one-hot"])
def test_lossless_on_other_drafters_and_vocab4(draft):
    world = exact.random_world(vocab_size=4, max_len=5, seed=7, draft=draft, concentration=0.5)
    for method in ("hsd", "tokenwise"):
        assert exact.prefix_tv(world, method, 2, 4) < LOSSLESS_TV


def test_published_uncapped_rule_is_lossy():
    worst = max(
        exact.prefix_tv(exact.random_world(3, 6, seed=seed), "hsd-paper", 3, 3) for seed in range(3)
    )
    assert worst > LOSSY_TV


def test_toy_expected_acceptance_matches_known_fractions():
    # p = (1/3, 2/3), q = (2/3, 1/3), K = 2: 10/9 token-wise, 11/9 capped, 12/9 uncapped.
    world = exact.context_free_world([1 / 3, 2 / 3], [2 / 3, 1 / 3])
    expected = {"tokenwise": Fraction(10, 9), "hsd": Fraction(11, 9), "hsd-paper": Fraction(12, 9)}
    for method, value in expected.items():
        assert exact.expected_accepted(world, method, 2) == pytest.approx(float(value), abs=1e-14)
    # The uncapped rule emits "B A" with probability 1/3 where the target says 2/9.
    paper = exact.speculative_prefix_distribution(world, "hsd-paper", 2, 2)
    assert paper[(1, 0)] == pytest.approx(1 / 3, abs=1e-14)
    assert exact.target_prefix_distribution(world, 2)[(1, 0)] == pytest.approx(2 / 9, abs=1e-14)


@pytest.mark.parametrize("seed", range(6))
def test_hsd_accepts_at_least_as_much_as_tokenwise(seed):
    world = exact.random_world(3, 6, seed=seed, concentration=0.7)
    for num_draft in (2, 3, 4):
        for prefix in [(), (0,), (1, 2)]:
            hsd = exact.expected_accepted(world, "hsd", num_draft, prefix)
            tokenwise = exact.expected_accepted(world, "tokenwise", num_draft, prefix)
            assert hsd >= tokenwise - 1e-12


def test_hsd_gains_over_tokenwise_somewhere():
    # Guards the previous test against a degenerate world where both are trivially equal.
    world = exact.random_world(3, 6, seed=0)
    # Exact values on this world: 1.3034 vs 1.2766 accepted tokens per round.
    assert exact.expected_accepted(world, "hsd", 3) > exact.expected_accepted(world, "tokenwise", 3) + 0.02


@pytest.mark.parametrize("seed", range(3))
def test_one_hot_draft_makes_hsd_equal_tokenwise(seed):
    # With q a point mass, R_t = p(prefix) <= 1: the cap never binds and acceptance is identical.
    world = exact.random_world(3, 6, seed=seed, draft="one-hot")
    for num_draft in (1, 2, 3):
        hsd = exact.expected_accepted(world, "hsd", num_draft)
        tokenwise = exact.expected_accepted(world, "tokenwise", num_draft)
        assert hsd == pytest.approx(tokenwise, abs=1e-12)


def test_oracle_rejects_too_short_world():
    with pytest.raises(ValueError, match="max_len"):
        exact.prefix_tv(exact.random_world(3, 3, seed=0), "hsd", 3, 3)


@pytest.mark.parametrize("method", ["tokenwise", "hsd", "hsd-paper"])
def test_expected_accepted_per_length_matches_the_oracle_laws(method):
    # The batched expectation used by benchmarks/bench_verify.py against the oracle's per-draft laws.
    import numpy as np
    import torch

    from sglang_hsd.verify.chain import expected_accepted_per_length

    rng = np.random.default_rng(0)
    vocab, num_draft = 5, 4
    q = rng.dirichlet(np.ones(vocab), size=(6, num_draft))
    p = rng.dirichlet(np.ones(vocab), size=(6, num_draft + 1))
    p[:, :num_draft] = 0.6 * q + 0.4 * p[:, :num_draft]  # ratios above and below 1
    draft = np.array([[rng.choice(vocab, p=q[n, t]) for t in range(num_draft)] for n in range(6)])
    ours = expected_accepted_per_length(torch.as_tensor(draft), torch.as_tensor(q), torch.as_tensor(p), method)
    for n in range(6):
        for k in range(1, num_draft + 1):
            law = exact.OUTCOME_LAWS[method](p[n, : k + 1], q[n, :k], tuple(draft[n, :k]))
            oracle = sum(prob * accepted for (accepted, _), prob in law.items())
            assert float(ours[n, k - 1]) == pytest.approx(oracle, abs=1e-12)
