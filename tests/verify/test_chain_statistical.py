"""Statistical tests of the batched ``verify_chain`` against the exact target.

These run the real sampler (not the oracle) for many sequences and compare multi-token prefix
frequencies with the exact target law by a chi-square test. With 200k sequences over 27 prefixes,
a bias of TV 0.01 gives a non-centrality of several hundred, far beyond the rejection threshold,
so a 1% bias fails reliably; ``test_chi_square_catches_the_lossy_rule`` proves the test has teeth.
"""

import numpy as np
import pytest
import torch

from sglang_hsd.verify import exact
from sglang_hsd.verify.simulate import chi_square_p_value, simulate_chain, target_prefix_probs

scipy_stats = pytest.importorskip("scipy.stats")

NUM_SEQUENCES = 200_000
# Seeds are fixed, so each test is deterministic; 1e-4 keeps an honest sampler from failing by bad luck
# if the seeds or the sampler's draw order change.
P_VALUE_FLOOR = 1e-4
PREFIX_LEN = 3


def _chi_square_p_value(world, result, length):
    return chi_square_p_value(result.prefix_counts(world.vocab_size), target_prefix_probs(world, length))


def test_target_prefix_probs_match_the_oracle():
    world = exact.random_world(3, 3, seed=2)
    table = target_prefix_probs(world, 3)
    oracle = exact.target_prefix_distribution(world, 3)
    for prefix, prob in oracle.items():
        code = prefix[0] * 9 + prefix[1] * 3 + prefix[2]
        assert abs(float(table[code]) - prob) < 1e-15


def test_chi_square_matches_scipy_when_no_cell_is_pooled():
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(10))
    observed = rng.multinomial(10_000, probs)
    ours = chi_square_p_value(torch.as_tensor(observed), torch.as_tensor(probs))
    assert ours == pytest.approx(scipy_stats.chisquare(observed, probs * 10_000).pvalue, rel=1e-6)


@pytest.mark.parametrize(
    "method,num_draft,seed,length",
    [("hsd", 3, 0, 3), ("hsd", 2, 1, 4), ("hsd", 4, 2, 3), ("tokenwise", 3, 0, 4), ("tokenwise", 2, 1, 3)],
)
def test_batched_sampler_matches_target_prefixes(method, num_draft, seed, length):
    world = exact.random_world(3, length - 1 + num_draft, seed=seed)
    gen = torch.Generator().manual_seed(1234 + seed)
    result = simulate_chain(world, method, num_draft, length, NUM_SEQUENCES, gen)
    assert _chi_square_p_value(world, result, length) > P_VALUE_FLOOR


@pytest.mark.parametrize("method", ["hsd", "tokenwise"])
def test_batched_mean_acceptance_matches_exact(method):
    world = exact.random_world(3, 4, seed=0)
    gen = torch.Generator().manual_seed(99)
    result = simulate_chain(world, method, 3, 1, NUM_SEQUENCES, gen)
    accepted = result.first_round_accepted.double()
    standard_error = accepted.std().item() / NUM_SEQUENCES**0.5
    exact_mean = exact.expected_accepted(world, method, 3)
    assert abs(accepted.mean().item() - exact_mean) < 5 * standard_error


def test_chi_square_catches_the_lossy_rule():
    # On this world the uncapped rule's 3-token TV is ~0.09; a working test must reject it.
    world = exact.random_world(3, 5, seed=0)
    assert exact.prefix_tv(world, "hsd-paper", 3, PREFIX_LEN) > 1e-2
    gen = torch.Generator().manual_seed(5)
    with pytest.warns(UserWarning, match="NOT preserve"):
        result = simulate_chain(world, "hsd-paper", 3, PREFIX_LEN, NUM_SEQUENCES, gen)
    assert _chi_square_p_value(world, result, PREFIX_LEN) < 1e-12


def test_chi_square_detects_a_one_percent_bias():
    # Move 1% of the target mass between two prefixes and sample directly: the same test must fail.
    world = exact.random_world(3, 3, seed=3)
    target = exact.target_prefix_distribution(world, PREFIX_LEN)
    keys = sorted(target)
    probs = np.array([target[k] for k in keys])  # sorted tuples = base-V order
    biased = probs.copy()
    donor, receiver = int(np.argmax(probs)), int(np.argmin(probs))
    biased[donor] -= 0.01
    biased[receiver] += 0.01
    rng = np.random.default_rng(0)
    observed = rng.multinomial(NUM_SEQUENCES, biased)
    p_value = chi_square_p_value(torch.as_tensor(observed), torch.as_tensor(probs))
    assert p_value < P_VALUE_FLOOR


def test_two_sample_p_value_accepts_one_law_and_rejects_two():
    from sglang_hsd.verify.simulate import two_sample_p_value

    gen = torch.Generator().manual_seed(0)
    law = torch.tensor([0.5, 0.3, 0.15, 0.05])
    other = torch.tensor([0.4, 0.3, 0.2, 0.1])

    def sample(probs, n):
        return torch.bincount(torch.multinomial(probs, n, replacement=True, generator=gen), minlength=4)

    assert two_sample_p_value(sample(law, 3000), sample(law, 2000)) > 1e-3
    assert two_sample_p_value(sample(law, 3000), sample(other, 2000)) < 1e-6
    # categories too rare for the chi-square are pooled, empty ones dropped
    assert two_sample_p_value(torch.tensor([50, 50, 1, 0]), torch.tensor([45, 55, 0, 0])) > 0.05
