"""Statistical test of the batched budgeted drafter (``tree/expand.py``) with ``verify_tree``.

20k sequences on a context-dependent tabular world, rounds until each has 3 tokens; the 3-token
prefix counts are compared with the exact target law (chi-square), and first-round acceptance with
the exact expectation of ``oracles/expand_exact.py``. The score-pruned sampled tree must fail.
"""

import pytest
import torch

from sglang_hsd.verify.oracles import exact
from sglang_hsd.verify.oracles.expand_exact import Shape, expand_round_law
from sglang_hsd.verify.oracles.simulate import simulate_tree, target_prefix_probs
from sglang_hsd.verify.oracles.stats import chi_square_p_value
from sglang_hsd.tree_draft import TreeShape
from sglang_hsd.verify.oracles.expand_draft import EXPANSION_RULES, expand_tree

pytestmark = pytest.mark.statistical

NUM_SEQUENCES = 20_000
PREFIX_LEN = 3
P_VALUE_FLOOR = 1e-4  # fixed seeds: deterministic runs; the floor leaves room for draw-order changes
REJECT_P_VALUE = 1e-6


def _simulate(world, rule, cfg, seed):
    spec = EXPANSION_RULES[rule]
    generator = torch.Generator().manual_seed(seed)

    def draft(q_fn, roots, gen):
        return expand_tree(q_fn, cfg, roots, rule=rule, generator=gen)

    return simulate_tree(world, spec.verify_method, cfg.topk, cfg.depth, PREFIX_LEN, NUM_SEQUENCES, generator,
                         dtype=torch.float64, draft_fn=draft)


@pytest.mark.parametrize("rule", ["spine", "beam", "best_first", "stock"])
def test_batched_rules_match_target(rule):
    world = exact.random_world(3, PREFIX_LEN - 1 + 3, seed=7)
    cfg = TreeShape(depth=3, topk=2, num_draft_tokens=7)
    result = _simulate(world, rule, cfg, seed=11)
    p_value = chi_square_p_value(result.prefix_counts(3), target_prefix_probs(world, PREFIX_LEN))
    assert p_value > P_VALUE_FLOOR
    expected = expand_round_law(world, rule, Shape(3, 2, 7)).expected_accepted
    accepted = result.first_round_accepted.double()
    assert abs(accepted.mean().item() - expected) < 5 * accepted.std().item() / NUM_SEQUENCES**0.5


def test_batched_score_pruning_is_rejected():
    world = exact.random_world(3, PREFIX_LEN - 1 + 2, seed=7)
    result = _simulate(world, "pruned_beam", TreeShape(depth=2, topk=2, num_draft_tokens=5), seed=11)
    p_value = chi_square_p_value(result.prefix_counts(3), target_prefix_probs(world, PREFIX_LEN))
    assert p_value < REJECT_P_VALUE
