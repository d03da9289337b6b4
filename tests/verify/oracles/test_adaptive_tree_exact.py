"""``BudgetController`` choosing each round's tree budget keeps the target's law over several rounds.

Exact: ``adaptive_rounds_exact.controlled_prefix_distribution`` with ``adaptive_tree_exact.tree_budget_round``
enumerates every branch of a request's rounds after a 3-token prompt: the real controller picks
each round's depth d in 0..D from the state its branch's earlier rounds left, d > 0 drafts the
budget tree ``budget_shapes(shape)[d]`` with the server's batched ``LevelDrafter`` (every drafting
outcome enumerated) and verifies it with the exact law of ``hsd`` / ``rrs``. The law of the first
emitted tokens equals the target's (TV < 1e-12) while d really varies with the branch (plain
decoding included), at two shapes and with the argmax-first sampler. Shortening a round after its
rejection (``truncated``) is biased at every case.

Statistical: the batched drafter and ``verify_tree`` with one controller per group of 8 requests
sharing one depth per round (``adaptive_tree_simulate.tree_round``), 20k sequences, chi-square of
the first 4 tokens against the exact target law; the shorten-after-rejection controller fails it.
"""

import pytest
import torch

from sglang_hsd.adaptive import AdaptiveConfig
from sglang_hsd.tree_draft import TreeShape, budget_shapes
from sglang_hsd.verify.oracles.adaptive_rounds_exact import (
    ControllerSetup, controlled_prefix_distribution, prompted_world, truncated)
from sglang_hsd.verify.oracles.adaptive_rounds_simulate import simulate_controlled_chain, target_law_probs
from sglang_hsd.verify.oracles.adaptive_tree_exact import tree_budget_round
from sglang_hsd.verify.oracles.adaptive_tree_simulate import tree_round
from sglang_hsd.verify.oracles.exact import target_prefix_distribution, total_variation
from sglang_hsd.verify.oracles.stats import chi_square_p_value

PROMPT = (2, 0, 1)
# Small memories and a short refresh so the depth moves within a few rounds (as in
# test_adaptive_rounds_exact.py), over the depths 0..2 of the shapes below.
CONFIG = AdaptiveConfig((0, 1, 2), prior_rate=0.7, prior_rounds=1.0, memory=0.8, cost_window=2, spread_trials=1.0,
                        refresh_rounds=6)
WARM = (0, 0, 1, 1, 2, 2)
HALF_WARM = (0, 1, 2)
CASES = [  # (shape, emitted tokens compared, world seed, draft kind, warm-up, child sampler)
    (TreeShape(2, 2, 4), 5, 0, "mixture", WARM, "inverse_cdf"),
    (TreeShape(2, 2, 4), 5, 2, "independent", HALF_WARM, "inverse_cdf"),
    (TreeShape(2, 3, 5), 4, 2, "independent", HALF_WARM, "inverse_cdf"),
    (TreeShape(2, 2, 4), 4, 0, "mixture", WARM, "argmax_first_cdf"),
]


def _law(case, method, wrong=False):
    shape, length, seed, draft, warmup, sampler = case
    world = prompted_world(PROMPT, length, shape.depth, seed=seed, draft=draft)
    policy = tree_budget_round(shape, sampler=sampler)
    law = controlled_prefix_distribution(world, method, ControllerSetup(CONFIG, warmup=warmup), length,
                                         truncated(policy) if wrong else policy)
    assert sum(law.emitted.values()) == pytest.approx(1.0, abs=1e-12)
    return law, total_variation(law.emitted, target_prefix_distribution(world, length))


def test_budgets_shrink_within_the_configured_shape():
    assert {d: str(s) for d, s in budget_shapes(TreeShape(4, 2, 8), "spine_wide").items()} == {
        1: "1:2:3", 2: "2:2:5", 3: "3:2:7", 4: "4:2:8"}
    assert {d: str(s) for d, s in budget_shapes(TreeShape(5, 4, 8), "spine_wide").items()} == {
        1: "1:4:3", 2: "2:4:4", 3: "3:4:6", 4: "4:4:7", 5: "5:4:8"}
    assert TreeShape(5, 4, 4).at_depth(5).longest_path == 3
    with pytest.raises(ValueError, match="depth must be an int in 1..4"):
        TreeShape(4, 2, 8).at_depth(5)


@pytest.mark.exact
@pytest.mark.parametrize("method", ["hsd", "rrs"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-seed{c[2]}-{c[5]}")
def test_controlled_tree_rounds_are_lossless(case, method):
    law, tv = _law(case, method)
    assert tv < 1e-12
    depths = {chosen for _, chosen in law.choices}
    assert 0 in depths and len(depths) >= 2  # the choice varies with the branch, plain decoding included
    by_round: dict[int, set[int]] = {}
    for round_index, chosen in law.choices:
        by_round.setdefault(round_index, set()).add(chosen)
    assert max(len(chosen) for chosen in by_round.values()) >= 2
    assert law.branches > 30


@pytest.mark.exact
@pytest.mark.parametrize("method", ["hsd", "rrs"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-seed{c[2]}-{c[5]}")
def test_shortening_a_tree_round_after_its_rejection_is_biased(case, method):
    _, tv = _law(case, method, wrong=True)
    assert tv > 1e-3


SIM_LENGTH = 4
NUM_GROUPS, BATCH = 2_500, 8  # 20k sequences
P_VALUE_FLOOR = 1e-4
REJECT_P_VALUE = 1e-6


def _simulate(truncate_on_reject=False, seed=3):
    shape = TreeShape(2, 2, 4)
    world = prompted_world(PROMPT, SIM_LENGTH, shape.depth, seed=0)
    result = simulate_controlled_chain(world, "hsd", ControllerSetup(CONFIG, warmup=WARM), SIM_LENGTH,
                                       NUM_GROUPS, BATCH, torch.Generator().manual_seed(seed),
                                       truncate_on_reject=truncate_on_reject, round_fn=tree_round(shape))
    p_value = chi_square_p_value(result.prefix_counts(world.vocab_size), target_law_probs(world, SIM_LENGTH))
    return result, p_value


@pytest.mark.statistical
def test_batched_controlled_tree_rounds_match_target():
    result, p_value = _simulate()
    assert p_value > P_VALUE_FLOOR
    assert set(result.request_rounds_by_length) == {0, 1, 2}  # every depth in use


@pytest.mark.statistical
def test_batched_tree_shortening_after_rejection_is_rejected():
    _, p_value = _simulate(truncate_on_reject=True)
    assert p_value < REJECT_P_VALUE
