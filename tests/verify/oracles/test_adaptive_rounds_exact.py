"""``BudgetController`` (``sglang_hsd/adaptive.py``) keeps the target's law over several rounds.

Exact: ``adaptive_rounds_exact.controlled_prefix_distribution`` enumerates every branch of a request's
rounds after a 3-token prompt, with the real controller choosing each round's L from the state its
branch's earlier rounds left (deep-copied per branch), drafting up to L tokens from q (with and
without the within-round stopping rule), the exact ``hsd`` / ``tokenwise`` outcome laws, and the
controller's updates (fake seconds ``1 + 0.3 L``). The law of the first 6 emitted tokens equals
the target's (TV < 1e-12) while L really depends on the branch (several lengths in one round, L = 0
included), so the choice of L from past rounds is what the equality covers. Two plausible
controllers that let a round's own drafts decide its length are biased (TV > 1e-3).

Statistical: the batched ``verify_chain`` with one controller per group of 8 requests sharing one L
per round (``adaptive_rounds_simulate``), 40k sequences, chi-square of the first 5 tokens against
the exact target law; the shorten-after-rejection controller fails it.
"""

import pytest
import torch

from sglang_hsd.adaptive import AdaptiveConfig, BudgetController
from sglang_hsd.draft_length import DraftLengthKind, DraftLengthRule
from sglang_hsd.verify.oracles.adaptive_rounds_exact import (
    ControllerSetup,
    budget_round,
    controlled_prefix_distribution,
    peeking_round,
    prompted_world,
    truncating_round,
)
from sglang_hsd.verify.oracles.adaptive_rounds_simulate import simulate_controlled_chain, target_law_probs
from sglang_hsd.verify.oracles.exact import target_prefix_distribution, total_variation
from sglang_hsd.verify.oracles.stats import chi_square_p_value

PROMPT = (2, 0, 1)
LENGTH = 6
# Small memories and a short refresh so that L moves within a few rounds: anchors (0, 1, 3) are
# re-run every 6 rounds, and one round's outcome moves the request's rate across the thresholds
# of the speed comparison (about 0.3 / 0.63 / 0.76 for costs 1 + 0.3 L). ``spread_trials=1`` fits
# the rate spread from the first rounds on, so the enumeration covers choices made with it.
CONFIG = AdaptiveConfig((0, 1, 2, 3), prior_rate=0.7, prior_rounds=1.0, memory=0.8, cost_window=2, spread_trials=1.0,
                        refresh_rounds=6)
WARM = (0, 0, 1, 1, 3, 3)  # the controller has measured the anchors before the request arrives
HALF_WARM = (0, 1, 3)  # one measurement each: the request's own first rounds finish the exploration
RULES = {"no-stop": DraftLengthRule(),
         "stop": DraftLengthRule(DraftLengthKind.ADAPTIVE, threshold=0.45, min_length=1, max_length=3, grow=1)}


def _law(world, method, rule, policy=budget_round, warmup=WARM, length=LENGTH):
    law = controlled_prefix_distribution(world, method, ControllerSetup(CONFIG, RULES[rule], warmup), length, policy)
    assert sum(law.emitted.values()) == pytest.approx(1.0, abs=1e-12)
    return law, total_variation(law.emitted, target_prefix_distribution(world, length))


@pytest.mark.exact
@pytest.mark.parametrize("method", ["hsd", "tokenwise"])
@pytest.mark.parametrize("rule", sorted(RULES))
@pytest.mark.parametrize("seed,draft,warmup", [(0, "mixture", WARM), (1, "mixture", WARM), (2, "independent", HALF_WARM)])
def test_controlled_rounds_are_lossless(method, rule, seed, draft, warmup):
    world = prompted_world(PROMPT, LENGTH, CONFIG.candidates[-1], seed=seed, draft=draft)
    law, tv = _law(world, method, rule, warmup=warmup)
    assert tv < 1e-12
    # Guard: the controller's choice really varies with the branch, L = 0 (plain decoding) included.
    lengths = {chosen for _, chosen in law.choices}
    assert 0 in lengths and len(lengths) >= 3
    by_round: dict[int, set[int]] = {}
    for round_index, chosen in law.choices:
        by_round.setdefault(round_index, set()).add(chosen)
    assert max(len(chosen) for chosen in by_round.values()) >= 2
    assert law.branches > 100


@pytest.mark.exact
@pytest.mark.parametrize("method", ["hsd", "tokenwise"])
@pytest.mark.parametrize("rule", sorted(RULES))
def test_shortening_a_round_after_its_rejection_is_biased(method, rule):
    world = prompted_world(PROMPT, LENGTH, CONFIG.candidates[-1], seed=0)
    _, tv = _law(world, method, rule, truncating_round)
    assert tv > 1e-3


@pytest.mark.exact
@pytest.mark.parametrize("method", ["hsd", "tokenwise"])
@pytest.mark.parametrize("rule", sorted(RULES))
def test_choosing_the_length_from_the_round_s_own_drafts_is_biased(method, rule):
    world = prompted_world(PROMPT, 5, CONFIG.candidates[-1], seed=0)
    _, tv = _law(world, method, rule, peeking_round, length=5)
    assert tv > 1e-3


def test_decide_is_choose_without_recording():
    controller = ControllerSetup(CONFIG, warmup=WARM).new_controller(batch=4)
    for rate, expected in ((0.1, 0), (0.5, 1), (0.7, 2), (0.9, 3)):
        before = (dict(controller.choices), dict(controller.request_rounds_by_length))
        assert controller.decide([rate] * 4, 4) == expected
        assert (controller.choices, controller.request_rounds_by_length) == before
        assert controller.choose([rate] * 4, 4) == expected
    assert controller.request_rounds_by_length == {0: 4, 1: 4, 2: 4, 3: 4}
    with pytest.raises(ValueError, match="rates"):
        BudgetController(CONFIG).decide([0.5], 2)


SIM_LENGTH = 5
NUM_GROUPS, BATCH = 5_000, 8  # 40k sequences, under a second per run
P_VALUE_FLOOR = 1e-4  # fixed seeds: deterministic runs; the floor leaves room for draw-order changes
REJECT_P_VALUE = 1e-6


def _simulate(method, rule, truncate_on_reject=False, seed=1):
    world = prompted_world(PROMPT, SIM_LENGTH, CONFIG.candidates[-1], seed=0)
    setup = ControllerSetup(CONFIG, RULES[rule], WARM)
    result = simulate_controlled_chain(world, method, setup, SIM_LENGTH, NUM_GROUPS, BATCH,
                                       torch.Generator().manual_seed(seed), truncate_on_reject=truncate_on_reject)
    p_value = chi_square_p_value(result.prefix_counts(world.vocab_size), target_law_probs(world, SIM_LENGTH))
    return result, p_value


@pytest.mark.statistical
@pytest.mark.parametrize("method", ["hsd", "tokenwise"])
@pytest.mark.parametrize("rule", sorted(RULES))
def test_batched_controlled_rounds_match_target(method, rule):
    result, p_value = _simulate(method, rule)
    assert p_value > P_VALUE_FLOOR
    lengths = result.request_rounds_by_length
    # every length in use, three of them often
    assert set(lengths) == {0, 1, 2, 3} and sorted(lengths.values())[1] > 100


@pytest.mark.statistical
@pytest.mark.parametrize("method", ["hsd", "tokenwise"])
@pytest.mark.parametrize("rule", sorted(RULES))
def test_batched_shortening_after_rejection_is_rejected(method, rule):
    _, p_value = _simulate(method, rule, truncate_on_reject=True)
    assert p_value < REJECT_P_VALUE


@pytest.mark.statistical
def test_target_law_probs_order_matches_prefix_counts():
    world = prompted_world(PROMPT, 3, 1, seed=0)
    probs = target_law_probs(world, 3)
    assert probs.sum().item() == pytest.approx(1.0, abs=1e-12)
    # Prefix (a, b, c) sits at a * 9 + b * 3 + c.
    assert probs[1 * 9 + 2 * 3 + 0].item() == pytest.approx(
        world.p(())[1] * world.p((1,))[2] * world.p((1, 2))[0], abs=1e-15)
