"""The chi-square helpers every distribution test relies on: agreement with scipy, and power."""

import numpy as np
import pytest
import torch

from sglang_hsd.verify.oracles import exact
from sglang_hsd.verify.oracles.stats import chi_square_p_value, two_sample_p_value

scipy_stats = pytest.importorskip("scipy.stats")

# The chain statistical tests draw this many sequences; the power test below uses the same size.
NUM_SEQUENCES = 200_000
P_VALUE_FLOOR = 1e-4
PREFIX_LEN = 3


def test_chi_square_matches_scipy_when_no_cell_is_pooled():
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(10))
    observed = rng.multinomial(10_000, probs)
    ours = chi_square_p_value(torch.as_tensor(observed), torch.as_tensor(probs))
    assert ours == pytest.approx(scipy_stats.chisquare(observed, probs * 10_000).pvalue, rel=1e-6)


@pytest.mark.statistical
def test_chi_square_detects_a_one_percent_bias():
    # Move 1% of the target mass between two prefixes and sample directly: the test must fail.
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


@pytest.mark.statistical
def test_two_sample_p_value_accepts_one_law_and_rejects_two():
    gen = torch.Generator().manual_seed(0)
    law = torch.tensor([0.5, 0.3, 0.15, 0.05])
    other = torch.tensor([0.4, 0.3, 0.2, 0.1])

    def sample(probs, n):
        return torch.bincount(torch.multinomial(probs, n, replacement=True, generator=gen), minlength=4)

    assert two_sample_p_value(sample(law, 3000), sample(law, 2000)) > 1e-3
    assert two_sample_p_value(sample(law, 3000), sample(other, 2000)) < 1e-6
    # categories too rare for the chi-square are pooled, empty ones dropped
    assert two_sample_p_value(torch.tensor([50, 50, 1, 0]), torch.tensor([45, 55, 0, 0])) > 0.05
