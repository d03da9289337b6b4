"""``RateSpread``: the round-to-round spread of acceptance (Beta-geometric model), its fit from
where chains stopped, and what it changes in the controller's choice."""

from __future__ import annotations

import math
import random

import pytest

from sglang_hsd.adaptive import AdaptiveConfig, BudgetController, RateSpread, expected_tokens


def _beta_rounds(a: float, b: float, length: int, rounds: int, seed: int = 0) -> list[tuple[int, int]]:
    """(drafted, accepted) of ``rounds`` chains of ``length`` drafts, each round's rate drawn from
    Beta(a, b) and its drafts accepted independently at that rate until the first rejection."""
    rng = random.Random(seed)
    out = []
    for _ in range(rounds):
        rate = rng.betavariate(a, b)
        accepted = 0
        while accepted < length and rng.random() < rate:
            accepted += 1
        out.append((length, accepted))
    return out


def _beta_tokens(a: float, b: float, length: int) -> float:
    total = survive = 1.0
    for j in range(length):
        survive *= (a + j) / (a + b + j)
        total += survive
    return total


def _fed(counts, memory=1.0, min_trials=32.0) -> RateSpread:
    spread = RateSpread(memory, min_trials)
    for i in range(0, len(counts), 4):  # rounds of four requests
        spread.observe(counts[i:i + 4])
    return spread


def test_the_fit_recovers_a_spread_and_its_expected_tokens():
    """Rounds whose rate is Beta(2.1, 0.9) (mean 0.7, s = 3): the fit finds the mean and a
    concentration within one grid step, and at the counts' pooled rate the expected tokens are the
    Beta law's, not the geometric sum's."""
    counts = _beta_rounds(2.1, 0.9, 8, 6000)
    spread = _fed(counts)
    mean, s, pooled = spread.fitted
    assert mean == pytest.approx(0.7, abs=0.02)
    assert 3.0 / 1.6 < s < 3.0 * 1.6
    for length in (1, 2, 4, 8):
        assert spread.expected_tokens(pooled, length) == pytest.approx(_beta_tokens(2.1, 0.9, length), rel=0.03)
    # One rate at the pooled estimate misses by more than the fit does (the rounds that got far
    # weigh in the pooled rate more than in the first draft's).
    for length in (1, 8):
        assert expected_tokens(pooled, length) > 1.04 * _beta_tokens(2.1, 0.9, length)
    # What the chains actually committed, per length, agrees with the fitted law.
    for length in (1, 4):
        observed = 1 + sum(min(a, length) for _, a in counts) / len(counts)
        assert spread.expected_tokens(pooled, length) == pytest.approx(observed, rel=0.03)


def test_one_rate_for_every_round_fits_no_spread():
    """Rounds at one fixed rate: the fit prefers no spread, or one so small that the expected
    tokens stay within 2% of the geometric sum."""
    rng = random.Random(1)
    counts = []
    for _ in range(6000):
        accepted = 0
        while accepted < 8 and rng.random() < 0.7:
            accepted += 1
        counts.append((8, accepted))
    spread = _fed(counts)
    for length in (1, 4, 8):
        assert spread.expected_tokens(0.7, length) == pytest.approx(expected_tokens(0.7, length), rel=0.02)


def test_no_spread_until_the_first_position_has_enough_trials_or_when_degenerate():
    spread = RateSpread(1.0, 32.0)
    spread.observe([(4, 0), (4, 4)] * 8)  # 16 trials at position 1
    assert spread.fitted is None
    assert spread.expected_tokens(0.6, 4) == expected_tokens(0.6, 4)
    everything = RateSpread(1.0, 1.0)
    everything.observe([(4, 4)] * 40)  # no rejection: nothing to fit
    assert everything.fitted is None
    with pytest.raises(ValueError, match="accepted"):
        spread.observe([(2, 3)])
    off = RateSpread(1.0, math.inf)  # the default: no fit, so nothing is counted
    off.observe(_beta_rounds(2.1, 0.9, 4, 100))
    assert off.fitted is None and off.trials == []


def test_a_requests_rate_moves_the_mean_by_its_odds_and_keeps_the_spread():
    """At the counts' pooled rate a request gets the fitted mean; above it more, below it less,
    always inside (0, 1); plain rounds (length 0) commit one token."""
    spread = _fed(_beta_rounds(2.1, 0.9, 8, 3000))
    mean, s, pooled = spread.fitted
    assert spread.expected_tokens(pooled, 1) == pytest.approx(1 + mean)
    low, high = spread.expected_tokens(0.4, 4), spread.expected_tokens(0.9, 4)
    assert 1.0 < low < spread.expected_tokens(pooled, 4) < high < 5.0
    odds = mean / (1 - mean) * (0.9 / 0.1) / (pooled / (1 - pooled))
    assert spread.expected_tokens(0.9, 1) == pytest.approx(1 + odds / (1 + odds))
    assert spread.expected_tokens(0.9, 0) == 1.0


def test_memory_discounts_old_rounds_per_request_round():
    spread = RateSpread(0.5, 1.0)
    spread.observe([(2, 2)])
    spread.observe([(2, 0), (2, 1)])  # two request-rounds: the first round's counts x 0.25
    assert spread.trials == [pytest.approx(0.25 + 2), pytest.approx(0.25 + 1)]
    assert spread.successes == [pytest.approx(0.25 + 1), pytest.approx(0.25)]


def test_with_the_spread_the_controller_drafts_what_commits_most_per_second():
    """A workload like ShareGPT at T = 1 on one request, in the Beta-geometric model: the server's
    rounds have rates Beta(1.63, 0.7) (the per-position rates the server measured), round seconds
    as it measured them (plain 0.26 s, then 0.32-0.71 s for 1-8 drafts). A request whose rounds
    run at a lower mean (0.6, same spread), read through its pooled rate as the server estimates
    it: the controller with the fitted spread picks the length whose tokens per second under the
    request's law are highest (within 1%); the geometric one (``spread_trials=inf``) a shorter one,
    more than 1.5% slower."""
    costs = {0: 0.26, 1: 0.323, 2: 0.404, 3: 0.462, 4: 0.505, 5: 0.565, 6: 0.62, 7: 0.663, 8: 0.709}
    population = _beta_rounds(1.63, 0.7, 4, 4000, seed=2)
    a, b = 0.6 * 2.33, 0.4 * 2.33
    request = _beta_rounds(a, b, 4, 4000, seed=3)
    rate = sum(k for _, k in request) / sum(k + (k < d) for d, k in request)  # its pooled rate
    truth = {length: _beta_tokens(a, b, length) / seconds for length, seconds in costs.items()}
    chosen = {}
    for name, trials in (("spread", 32.0), ("geometric", math.inf)):
        controller = BudgetController(AdaptiveConfig.up_to(8, spread_trials=trials, draft_margin=1.0))
        for _ in range(3):
            for length, seconds in costs.items():
                controller.observe_round(1, length, seconds)
        for i in range(0, len(population), 4):
            controller.observe_stops(population[i:i + 4])
        chosen[name] = controller.decide([rate], 1)
    best = max(truth.values())
    assert truth[chosen["spread"]] >= 0.99 * best
    assert chosen["geometric"] < chosen["spread"]
    assert truth[chosen["geometric"]] < 0.985 * best


def test_the_spread_is_reported_and_configured():
    controller = BudgetController(AdaptiveConfig.up_to(4, spread_trials=1.0))
    assert controller.as_dict()["rate_spread"] is None
    controller.observe_stops(_beta_rounds(2.1, 0.9, 4, 200))
    reported = controller.as_dict()["rate_spread"]
    assert set(reported) == {"mean", "concentration"} and 0 < reported["mean"] < 1
    with pytest.raises(ValueError, match="spread_memory"):
        AdaptiveConfig.up_to(4, spread_memory=0.0)
    with pytest.raises(ValueError, match="spread_trials"):
        AdaptiveConfig.up_to(4, spread_trials=0.5)
