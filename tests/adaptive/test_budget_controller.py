"""``sglang_hsd.adaptive``: the controller's estimates, its exploration schedule and its choice.

The law of the output under the controller is checked by exact enumeration over rounds in
``tests/verify/oracles/test_adaptive_rounds_exact.py``; here the decisions themselves."""

from __future__ import annotations

import pytest

from sglang_hsd.adaptive import (AcceptanceEstimate, AdaptiveConfig, BudgetController, RoundCosts, batch_bucket,
                                 expected_tokens)


def test_config_checks_name_the_field():
    with pytest.raises(ValueError, match="candidates"):
        AdaptiveConfig((0,))
    with pytest.raises(ValueError, match="candidates"):
        AdaptiveConfig((2, 1))
    with pytest.raises(ValueError, match="prior_rate"):
        AdaptiveConfig((0, 1), prior_rate=1.0)
    with pytest.raises(ValueError, match="refresh_rounds"):
        AdaptiveConfig((0, 1), refresh_rounds=0)
    assert AdaptiveConfig.up_to(4).candidates == (0, 1, 2, 3, 4)
    assert AdaptiveConfig.up_to(4).anchors == (0, 1, 4)


def test_expected_tokens_is_the_truncated_geometric_sum():
    assert expected_tokens(0.5, 0) == 1.0
    assert expected_tokens(0.5, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert expected_tokens(1.0, 3) == 4.0


def test_acceptance_counts_a_rejection_as_one_failure():
    estimate = AcceptanceEstimate()
    estimate.observe(4, 4, memory=1.0)  # all accepted: 4 successes, no failure
    estimate.observe(4, 1, memory=1.0)  # 1 success, then a rejection
    assert (estimate.successes, estimate.trials) == (5, 6)
    assert estimate.rate(0.5, 2.0) == pytest.approx(6 / 8)
    with pytest.raises(ValueError, match="accepted"):
        estimate.observe(2, 3, memory=1.0)


def test_costs_interpolate_between_measured_lengths():
    costs = RoundCosts(window=3, min_samples=2)
    costs.observe(1, 1, 1.0, 0)
    assert costs.estimate(1, 1) is None  # one sample is not a measurement
    costs.observe(1, 1, 1.0, 1)
    costs.observe(1, 4, 9.0, 2)  # a cold first round ...
    costs.observe(1, 4, 2.5, 3)
    costs.observe(1, 4, 2.5, 4)  # ... outvoted by the median
    assert costs.estimate(1, 4) == pytest.approx(2.5)
    assert costs.estimate(1, 2) == pytest.approx(1.5)
    assert costs.estimate(1, 0) is None and costs.estimate(2, 2) is None
    assert batch_bucket(1) == 1 and batch_bucket(3) == 4 and batch_bucket(16) == 16


def _run(controller, rate, seconds, rounds, batch=1):
    chosen = []
    for _ in range(rounds):
        length = controller.choose([rate] * batch, batch)
        controller.observe_round(batch, length, seconds(batch, length))
        chosen.append(length)
    return chosen


def test_explores_the_anchors_then_maximises_tokens_per_second():
    controller = BudgetController(AdaptiveConfig.up_to(4, refresh_rounds=50))
    cheap_drafts = lambda batch, length: 1.0 + 0.1 * length
    chosen = _run(controller, 0.8, cheap_drafts, 10)
    assert chosen[:6] == [0, 0, 1, 1, 4, 4]  # the anchors, twice each
    assert set(chosen[6:]) == {4}  # high acceptance, cheap drafts: the longest
    controller = BudgetController(AdaptiveConfig.up_to(4, refresh_rounds=50))
    dear_drafts = lambda batch, length: 1.0 + 1.5 * length
    assert set(_run(controller, 0.3, dear_drafts, 10)[6:]) == {0}  # speculation backs off


def test_large_batches_back_off_independently_of_small_ones():
    controller = BudgetController(AdaptiveConfig.up_to(4, refresh_rounds=50))
    # verify rows cost little at batch 1, much at batch 16 (compute bound)
    seconds = lambda batch, length: 1.0 + (0.1 if batch == 1 else 1.2) * length
    assert set(_run(controller, 0.7, seconds, 10, batch=1)[6:]) == {4}
    assert set(_run(controller, 0.7, seconds, 10, batch=16)[6:]) == {0}
    state = controller.as_dict()
    assert set(state["choices_by_batch_bucket"]) == {"1", "16"}
    assert state["mean_steps"] is not None


def test_stale_anchors_are_measured_again():
    controller = BudgetController(AdaptiveConfig.up_to(2, refresh_rounds=5))
    chosen = _run(controller, 0.9, lambda b, l: 1.0 + 0.1 * l, 16)
    assert chosen.count(0) >= 2  # plain decoding re-measured after refresh_rounds
    with pytest.raises(ValueError, match="one entry per request"):
        controller.choose([0.5], 2)
