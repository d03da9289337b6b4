"""Statistical test of the batched ``LevelDrafter`` driven as the server drives it, with ``verify_tree``.

20k sequences on a context-dependent tabular world; each round runs the level-synchronous draft
loop (q from the per-slot contexts of SGLang's draft KV cache), verifies the tree, appends the
emitted tokens. The 3-token prefix counts are compared with the exact target law (chi-square) and
first-round acceptance with the exact expectation of ``oracles/level_exact.py``. The children come
from the keyed noise of the server (``KeyedNoise``); the pruned rule must fail, and so must
noise whose keys forget the level (a node's children reuse its parent's noise).
"""

import pytest
import torch

from sglang_hsd.verify.oracles import exact
from sglang_hsd.verify.oracles.level_exact import drive, level_round_law
from sglang_hsd.verify.oracles.simulate import simulate_tree, target_prefix_probs
from sglang_hsd.verify.oracles.stats import chi_square_p_value
from sglang_hsd.tree_draft import LEVEL_RULES, DraftPlan, KeyedNoise, LevelDrafter, TreeShape

pytestmark = pytest.mark.statistical

NUM_SEQUENCES = 20_000
PREFIX_LEN = 3
P_VALUE_FLOOR = 1e-4
REJECT_P_VALUE = 1e-6
CFG = TreeShape(depth=3, topk=2, num_draft_tokens=7)


class LevelBlindNoise:
    """A plausible keying slip: the level left out of the key, so every level reuses the root's
    noise (forward f of a level reads the root's vector)."""

    def __init__(self, noise: KeyedNoise):
        self.noise = noise

    def uniform(self, level, forwards, draws):
        return self.noise.uniform(0, 1, draws).expand(-1, forwards, -1)

    def gumbel(self, level, forwards, draws, vocab):
        return self.noise.gumbel(0, 1, draws, vocab).expand(-1, forwards, -1, -1)


def _simulate(world, rule, method, seed, wrap_noise=None):
    def draft(q_fn, roots, gen):
        root_q = q_fn(roots.view(-1, 1, 1))[:, 0]
        noise = KeyedNoise.fresh(torch.zeros_like(roots), gen)
        noise = noise if wrap_noise is None else wrap_noise(noise)
        drafter = LevelDrafter(DraftPlan.build(CFG, rule), root_q, torch.zeros_like(roots, dtype=torch.bool), noise, validate=False)
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


def test_noise_reused_across_levels_fails():
    world = exact.random_world(3, PREFIX_LEN - 1 + CFG.depth, seed=7)
    result = _simulate(world, "spine_wide", "hsd", seed=11, wrap_noise=LevelBlindNoise)
    assert chi_square_p_value(result.prefix_counts(3), target_prefix_probs(world, PREFIX_LEN)) < REJECT_P_VALUE
