"""Statistical tests of the batched ``verify_tree`` against the exact target.

``simulate_tree`` drafts real trees (``sample_tree`` / ``topk_tree``) and runs the torch reference
for many sequences over several rounds; 3-token prefix frequencies are compared with the exact
target law by a chi-square test, and first-round acceptance with the exact expectation from
``tree_exact`` (which is derived independently of the batched state machines).
"""

import pytest
import torch

from sglang_hsd.verify.oracles import exact, tree_exact
from sglang_hsd.verify.oracles.simulate import simulate_tree, target_prefix_probs
from sglang_hsd.verify.oracles.stats import chi_square_p_value

pytestmark = pytest.mark.statistical

NUM_SEQUENCES = 40_000
# Fixed seeds make each run deterministic; 1e-4 leaves room for changes in the draw order.
P_VALUE_FLOOR = 1e-4
PREFIX_LEN = 3


def _chi_square_p_value(world, result):
    return chi_square_p_value(result.prefix_counts(world.vocab_size), target_prefix_probs(world, PREFIX_LEN))


CASES = [  # (method, drafting, vocab, topk, depth, seed)
    ("hsd", "without-replacement", 3, 2, 3, 0),
    ("hsd", "iid", 3, 2, 2, 1),
    ("rrs", "without-replacement", 4, 3, 2, 2),
    ("target-only", "top-k", 3, 2, 2, 3),
]


@pytest.mark.parametrize("method,drafting,vocab,topk,depth,seed", CASES)
def test_batched_tree_sampler_matches_target(method, drafting, vocab, topk, depth, seed):
    world = exact.random_world(vocab, PREFIX_LEN - 1 + depth, seed=seed)
    gen = torch.Generator().manual_seed(4321 + seed)
    result = simulate_tree(world, method, topk, depth, PREFIX_LEN, NUM_SEQUENCES, gen, drafting)
    assert _chi_square_p_value(world, result) > P_VALUE_FLOOR
    accepted = result.first_round_accepted.double()
    standard_error = accepted.std().item() / NUM_SEQUENCES**0.5
    exact_mean = tree_exact.tree_expected_accepted(world, method, topk, depth, (), drafting)
    assert abs(accepted.mean().item() - exact_mean) < 5 * standard_error


def test_chi_square_catches_a_mismatched_pairing():
    # hsd run on deterministic top-k trees (q read, tree not drawn from q) is biased by TV ~0.7.
    world = exact.random_world(3, PREFIX_LEN + 1, seed=0)
    gen = torch.Generator().manual_seed(7)
    result = simulate_tree(world, "hsd", 2, 2, PREFIX_LEN, 20_000, gen, "top-k")
    assert _chi_square_p_value(world, result) < 1e-12
