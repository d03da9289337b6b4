"""Statistical test of the batched ``LevelDrafter`` driven as the server drives it, with ``verify_tree``.

20k sequences on a context-dependent tabular world; each round runs the level-synchronous draft
loop (q from the per-slot contexts of SGLang's draft KV cache), verifies the tree, appends the
emitted tokens. The 3-token prefix counts are compared with the exact target law (chi-square) and
first-round acceptance with the exact expectation of ``oracles/level_exact.py``; the pruned
variant must fail.
"""

import pytest
import torch

from sglang_hsd.verify.oracles import exact
from sglang_hsd.verify.oracles.level_exact import drive, level_round_law
from sglang_hsd.verify.oracles.simulate import simulate_tree, target_prefix_probs
from sglang_hsd.verify.oracles.stats import chi_square_p_value
from sglang_hsd.verify.tree.expand import ExpandConfig
from sglang_hsd.verify.tree.level_draft import LEVEL_RULES, LevelDrafter

pytestmark = pytest.mark.statistical

NUM_SEQUENCES = 20_000
PREFIX_LEN = 3
P_VALUE_FLOOR = 1e-4
REJECT_P_VALUE = 1e-6
CFG = ExpandConfig(depth=3, topk=2, num_draft_tokens=7)


def _simulate(world, rule, method, seed):
    def draft(q_fn, roots, gen):
        root_q = q_fn(roots.view(-1, 1, 1))[:, 0]
        drafter = LevelDrafter(CFG, rule, root_q, torch.zeros_like(roots, dtype=torch.bool), generator=gen, validate=False)
        return drive(drafter, q_fn, roots, context="slot")

    return simulate_tree(world, method, CFG.topk, CFG.depth, PREFIX_LEN, NUM_SEQUENCES,
                         torch.Generator().manual_seed(seed), dtype=torch.float64, draft_fn=draft)


@pytest.mark.parametrize("rule,method", [("spine_wide", "hsd"), ("spine_wide", "rrs"), ("beam", "hsd"), ("spine", "hsd")])
def test_batched_drafter_matches_target(rule, method):
    world = exact.random_world(3, PREFIX_LEN - 1 + CFG.depth, seed=7)
    result = _simulate(world, rule, method, seed=11)
    expected = target_prefix_probs(world, PREFIX_LEN)
    assert chi_square_p_value(result.prefix_counts(3), expected) > P_VALUE_FLOOR
    mean = level_round_law(world, rule, CFG, (), method, context="slot").expected_accepted
    accepted = result.first_round_accepted.double()
    assert abs(float(accepted.mean()) - mean) < 5 * float(accepted.std()) / NUM_SEQUENCES**0.5


def test_pruned_fails():
    assert not LEVEL_RULES["pruned"].lossless
    world = exact.random_world(3, PREFIX_LEN - 1 + CFG.depth, seed=7)
    result = _simulate(world, "pruned", "hsd", seed=11)
    assert chi_square_p_value(result.prefix_counts(3), target_prefix_probs(world, PREFIX_LEN)) < REJECT_P_VALUE
