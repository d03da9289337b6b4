"""Statistical tests of the batched ``verify_chain`` against the exact target.

These run the real sampler (not the oracle) for many sequences and compare multi-token prefix
frequencies with the exact target law by a chi-square test. With 200k sequences over 27 prefixes,
a bias of TV 0.01 gives a non-centrality of several hundred, far beyond the rejection threshold,
so a 1% bias fails reliably (``tests/verify/oracles/test_stats.py``);
``test_chi_square_catches_the_lossy_rule`` proves the test has teeth.
"""

import pytest
import torch

from sglang_hsd.verify.oracles import exact
from sglang_hsd.verify.oracles.simulate import simulate_chain, target_prefix_probs
from sglang_hsd.verify.oracles.stats import chi_square_p_value

pytestmark = pytest.mark.statistical

NUM_SEQUENCES = 200_000
# Seeds are fixed, so each test is deterministic; 1e-4 keeps an honest sampler from failing by bad luck
# if the seeds or the sampler's draw order change.
P_VALUE_FLOOR = 1e-4
PREFIX_LEN = 3


def _chi_square_p_value(world, result, length):
    return chi_square_p_value(result.prefix_counts(world.vocab_size), target_prefix_probs(world, length))


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
