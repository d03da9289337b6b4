"""Helpers of the Monte Carlo oracle that the statistical tests compare against."""

from sglang_hsd.verify.oracles import exact
from sglang_hsd.verify.oracles.simulate import target_prefix_probs


def test_target_prefix_probs_match_the_oracle():
    world = exact.random_world(3, 3, seed=2)
    table = target_prefix_probs(world, 3)
    oracle = exact.target_prefix_distribution(world, 3)
    for prefix, prob in oracle.items():
        code = prefix[0] * 9 + prefix[1] * 3 + prefix[2]
        assert abs(float(table[code]) - prob) < 1e-15
