"""``sglang_hsd.adaptive``: the controller's estimates, its exploration schedule and its choice.

The law of the output under the controller is checked by exact enumeration over rounds in
``tests/verify/oracles/test_adaptive_rounds_exact.py``; here the decisions themselves."""

from __future__ import annotations

import math

import pytest

from sglang_hsd.adaptive import (NO_SETUP, AcceptanceEstimate, AdaptiveConfig, BudgetController, DraftSetup,
                                 RoundCosts, batch_bucket, expected_tokens)


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
    assert AdaptiveConfig.up_to(4).anchors == (0, 1, 2, 4)
    assert AdaptiveConfig.up_to(8).anchors == (0, 1, 2, 4, 8)
    assert AdaptiveConfig.up_to(3).anchors == (0, 1, 3)


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


def test_plain_rounds_age_a_requests_counts_back_towards_the_server_rate():
    """A round that drafted nothing adds no count but discounts the earlier ones: a request
    whose rate fell after rejected rounds drifts back to the server's rate while it decodes
    plainly (its estimate is not frozen at its worst stretch), and drafts again."""
    estimate = AcceptanceEstimate()
    for _ in range(3):
        estimate.observe(3, 0, memory=0.9)  # three rejected rounds
    low = estimate.rate(0.65, 2.0)
    assert low < 0.4
    rates = [low]
    for _ in range(20):
        estimate.observe(0, 0, memory=0.9)
        rates.append(estimate.rate(0.65, 2.0))
    assert all(a < b for a, b in zip(rates, rates[1:]))
    assert rates[-1] > 0.55  # 0.9^20 of three rejections left: 0.57
    frozen = AcceptanceEstimate()
    frozen.observe(3, 0, memory=1.0)
    frozen.observe(0, 0, memory=1.0)  # memory 1: nothing forgotten
    assert (frozen.successes, frozen.trials) == (0, 1)


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
    assert chosen[:8] == [0, 0, 1, 1, 2, 2, 4, 4]  # the anchors, twice each
    assert set(chosen[8:]) == {4}  # high acceptance, cheap drafts: the longest
    controller = BudgetController(AdaptiveConfig.up_to(4, refresh_rounds=50))
    dear_drafts = lambda batch, length: 1.0 + 1.5 * length
    assert set(_run(controller, 0.3, dear_drafts, 12)[8:]) == {0}  # speculation backs off


def test_large_batches_back_off_independently_of_small_ones():
    controller = BudgetController(AdaptiveConfig.up_to(4, refresh_rounds=50))
    # verify rows cost little at batch 1, much at batch 16 (compute bound)
    seconds = lambda batch, length: 1.0 + (0.1 if batch == 1 else 1.2) * length
    assert set(_run(controller, 0.7, seconds, 12, batch=1)[8:]) == {4}
    assert set(_run(controller, 0.7, seconds, 12, batch=16)[8:]) == {0}
    state = controller.as_dict()
    assert set(state["choices_by_batch_bucket"]) == {"1", "16"}
    assert state["mean_steps"] is not None


def test_stale_anchors_are_measured_again():
    controller = BudgetController(AdaptiveConfig.up_to(2, refresh_rounds=5))
    chosen = _run(controller, 0.9, lambda b, l: 1.0 + 0.1 * l, 16)
    assert chosen.count(0) >= 2  # plain decoding re-measured after refresh_rounds
    with pytest.raises(ValueError, match="one entry per request"):
        controller.choose([0.5], 2)


def test_config_checks_the_exploration_knobs():
    with pytest.raises(ValueError, match="contention must be in"):
        AdaptiveConfig.up_to(4, contention=0.0)
    with pytest.raises(ValueError, match="explore_share must be in"):
        AdaptiveConfig.up_to(4, explore_share=1.0)


def test_floor_takes_the_largest_lower_bound():
    costs = RoundCosts(window=5, min_samples=2)
    costs.observe(4, 0, 1.0, 0)
    costs.observe(4, 0, 1.0, 1)
    costs.observe(4, 8, 9.0, 2)  # the first round of a length may be cold: it bounds nothing ...
    assert costs.floor(4, 8) == 1.0  # ... plain decoding here does
    costs.observe(4, 8, 3.0, 3)
    assert costs.floor(4, 8) == 3.0  # the least of its own measurements
    costs.observe(16, 0, 2.0, 0)
    costs.observe(16, 0, 2.0, 1)
    # from batch 4: 3.0 plus 9 verify rows per request, each adding what a plain row added (1.0)
    assert costs.floor(16, 8) == 12.0
    costs.observe(16, 1, 14.0, 2)  # one round bounds nothing
    assert costs.floor(16, 8) == 12.0
    costs.observe(16, 1, 15.0, 3)
    assert costs.floor(16, 8) == 14.0  # a shorter round here cost more than that
    costs.observe(16, 8, 90.0, 4)  # a cold first round ...
    costs.observe(16, 8, 20.0, 5)
    assert costs.floor(16, 8) == 20.0 and costs.measured(16, 8) == 20.0  # ... does not count half
    assert costs.floor(2, 8) is None and costs.floor(16, 0) == 2.0


def _batch_costs(batch: int, length: int) -> float:
    """Seconds of a round on a machine like the 2-core CPU the server runs on: the target's
    forward is flat up to ~14 rows, then compute bound; each draft step and the draft extend
    cost more with the batch."""
    target = max(0.27, 0.02 * batch * (length + 1))
    drafting = 0.0 if length == 0 else length * (0.04 + 0.004 * batch) + 0.01 * batch * (length + 1) + 0.03
    return target + drafting


def test_a_large_batch_does_not_pay_for_long_exploration_rounds():
    """After batches 1 and 4 measured their anchors, batch 16 (where drafting cannot pay) never
    runs the 8-draft anchor, and runs the 1-draft one at most once, from its exploration budget:
    what its rounds cost beyond plain decoding stays within a few percent. The controller that
    explored every anchor twice, as before, spent the equivalent of dozens of plain rounds there."""
    config = AdaptiveConfig.up_to(8, draft_margin=1.0)
    controller = BudgetController(config)
    _run(controller, 0.8, _batch_costs, 30, batch=1)
    _run(controller, 0.8, _batch_costs, 40, batch=4)
    chosen = _run(controller, 0.6, _batch_costs, 64, batch=16)
    assert 8 not in chosen and chosen.count(1) <= 1
    plain = 64 * _batch_costs(16, 0)
    assert sum(_batch_costs(16, l) for l in chosen) <= 1.05 * plain

    def explore_everything(bucket, rates, setup, fastest):  # the wrong variant: every due anchor runs
        ones = [1.0] * len(rates)
        return BudgetController._due_anchor(wrong, bucket, ones, setup, wrong._fastest(bucket, ones, setup))

    wrong = BudgetController(config)
    wrong._due_anchor = explore_everything
    _run(wrong, 0.8, _batch_costs, 30, batch=1)
    _run(wrong, 0.8, _batch_costs, 40, batch=4)
    wrong_chosen = _run(wrong, 0.6, _batch_costs, 64, batch=16)
    assert sum(_batch_costs(16, l) for l in wrong_chosen) > 1.2 * plain


def test_an_anchor_close_to_the_best_is_explored_from_the_budget_and_comes_back():
    """An anchor that could come within ``contention`` of the best is measured once the bucket
    has run long enough to pay for it, and then rarely; one out of contention is not measured
    until the rates make it a contender again. A single slow first round does not rule a length
    out: its floor needs two measurements."""
    share = 0.05
    controller = BudgetController(AdaptiveConfig.up_to(4, contention=0.5, explore_share=share, draft_margin=1.0))
    seconds = lambda batch, length: 1.0 + 0.5 * length
    chosen = _run(controller, 0.4, seconds, 220, batch=4)
    # 4 can only come close: its floor, the line through 1 and 2, gives it 0.55 of plain's speed
    assert chosen[:6] == [0, 0, 1, 1, 2, 2]
    assert chosen.index(4) >= 8  # measured once the budget has filled
    assert chosen.count(4) <= 4
    assert controller.explore_spent[4] <= share * controller.bucket_seconds[4] + seconds(4, 4)
    assert 4 in _run(controller, 0.99, seconds, 30, batch=4)  # a clear contender: at once

    out = BudgetController(AdaptiveConfig.up_to(4, refresh_rounds=16, draft_margin=1.0))
    _run(out, 0.9, seconds, 12, batch=4)  # every anchor measured
    assert 4 not in _run(out, 0.15, seconds, 200, batch=4)  # no refresh while it cannot come close
    assert 4 in _run(out, 0.99, seconds, 30, batch=4)

    cold = BudgetController(AdaptiveConfig.up_to(4, draft_margin=1.0))
    first = {}

    def cold_first(batch, length):
        first[length] = first.get(length, 0) + 1
        return (10.0 if first[length] == 1 else 1.0) + 0.1 * length

    assert _run(cold, 0.9, cold_first, 8) == [0, 0, 1, 1, 2, 2, 4, 4]  # every anchor measured twice


def test_a_pending_catch_up_is_spread_over_the_remaining_tokens():
    """Drafting that must first pay a one-time cost (the server's deferred draft-cache catch-up)
    carries its share per round: worth it with many tokens left, not near the end."""
    from sglang_hsd.adaptive import DraftSetup

    config = AdaptiveConfig.up_to(4)
    controller = BudgetController(config)
    costs = {0: 0.25, 1: 0.30, 2: 0.34, 3: 0.38, 4: 0.42}  # seconds per round at batch 1
    for index in range(6):
        for length, seconds in costs.items():
            controller.costs.observe(1, length, seconds, index)
    controller.bucket_rounds[1] = 6
    rates = [0.8]
    assert controller.decide(rates, 1) == 4
    # 0.7 s (a 150-token prompt's draft prefill) over 500 tokens: drafting still wins.
    assert controller.decide(rates, 1, DraftSetup(0.7, 500.0)) == 4
    # The same over the 3 tokens left: one round of 4 drafts would carry all of it.
    assert controller.decide(rates, 1, DraftSetup(0.7, 3.0)) == 0
    share = DraftSetup(0.7, 3.0).share(rates, 4)
    assert share == pytest.approx(0.7)  # 3.36 expected tokens >= 3 left: one round
    assert DraftSetup(0.7, 3.0).share(rates, 0) == 0.0
    with pytest.raises(ValueError, match="seconds"):
        DraftSetup(-1.0)
    with pytest.raises(ValueError, match="remaining_tokens"):
        DraftSetup(1.0, 0.0)


def test_a_probe_from_plain_decoding_pays_its_setup_from_the_budget():
    """At a bucket where plain decoding is the best known choice, an anchor whose floor could
    beat it is measured at once when drafting owes nothing first, but not when the batch would
    first have to catch its draft cache up: that setup is wasted if the probe loses, so the
    probe waits until the exploration budget covers it, setup included."""
    from sglang_hsd.adaptive import DraftSetup

    def controller():
        made = BudgetController(AdaptiveConfig.up_to(4, draft_margin=1.0))
        for index in range(4):
            made.costs.observe(4, 0, 0.25, index)
            made.costs.observe(4, 1, 0.30, index)
            made.costs.observe(16, 0, 0.45, index)
        made.bucket_rounds[16] = 4
        made.bucket_seconds[16] = 40.0  # a budget of 1.2 s
        return made

    rates = [0.9] * 16
    assert controller().decide(rates, 16) == 1  # its floor could beat plain: measured at once
    assert controller().decide(rates, 16, DraftSetup(0.5, 60.0)) == 1  # setup within budget
    assert controller().decide(rates, 16, DraftSetup(6.0, 60.0)) == 0  # 6 s of catch-up: waits
    rich = controller()
    rich.bucket_seconds[16] = 400.0  # a budget of 12 s
    assert rich.choose(rates, 16, DraftSetup(6.0, 60.0)) == 1
    rich.observe_round(16, 1, 0.9)
    assert rich.explore_spent[16] > 6.0  # charged the setup as well as the round's extra


def test_a_compute_bound_batch_bounds_long_rounds_by_its_short_ones():
    """Batch 16 at high acceptance (a code prompt set at T = 0), rounds costed as the server
    measured them (each draft adds ~0.52 s there, ~0.05 s at batch 1): the cross-bucket floors
    alone put 4 drafts at 1.5 s, so a controller without the line through the two shortest
    lengths runs the 4- and 8-draft anchors (2.6 s and 4.7 s rounds, against 0.47 s plain); with
    it, 4 and 8 are bounded at their true cost and never run."""
    def seconds(batch, length):
        if batch == 1:
            return 0.27 + (0.03 + 0.05 * length if length else 0.0)
        return 0.47 + (0.05 + 0.52 * length if length else 0.0)

    class FirstDraftsOnly(AdaptiveConfig):
        anchors = property(lambda self: (0, 1, 4, 8))  # the wrong variant: no second-shortest

    for config, wrong in ((AdaptiveConfig.up_to(8), False), (FirstDraftsOnly(tuple(range(9))), True)):
        controller = BudgetController(config)
        _run(controller, 0.96, seconds, 40, batch=1)
        chosen = _run(controller, 0.96, seconds, 64, batch=16)
        assert (4 in chosen) == wrong and (wrong or 8 not in chosen)
        if not wrong:
            assert sum(seconds(16, l) for l in chosen) <= 1.12 * 64 * seconds(16, 0)


def test_floor_extends_the_line_through_two_shorter_lengths():
    costs = RoundCosts(window=5, min_samples=2)
    for index, (length, seconds) in enumerate([(1, 1.0), (1, 1.2), (2, 1.5), (2, 1.6)]):
        costs.observe(8, length, seconds, index)
    assert costs.floor(8, 4) == pytest.approx(2.5)  # 1.5 + 2 * (1.5 - 1.0)
    assert costs.floor(8, 2) == 1.5  # needs two shorter lengths: only 1 is shorter
    costs.observe(8, 3, 0.9, 4)
    costs.observe(8, 3, 0.9, 5)  # a line that falls (1 to 3) bounds nothing beyond 3's cost
    assert costs.floor(8, 6) == pytest.approx(1.5)  # 2's own cost still bounds 6 from below


def test_drafting_must_win_by_the_margin():
    """A length measured 5% ahead of plain decoding is not chosen under the default margin (what
    the rounds' medians do not show), one 20% ahead is; without a margin the 5% wins."""
    def settled(margin, draft_seconds):
        controller = BudgetController(AdaptiveConfig((0, 2), draft_margin=margin))
        for length, seconds in ((0, 1.0), (0, 1.0), (2, draft_seconds), (2, draft_seconds)):
            controller.observe_round(4, length, seconds)
        return controller.decide([0.5] * 4, 4)  # a round of 2 commits 1.75 tokens a request

    assert settled(AdaptiveConfig((0, 2)).draft_margin, 1.75 / 1.05) == 0
    assert settled(AdaptiveConfig((0, 2)).draft_margin, 1.75 / 1.2) == 2
    assert settled(1.0, 1.75 / 1.05) == 2
    with pytest.raises(ValueError, match="draft_margin"):
        AdaptiveConfig((0, 2), draft_margin=0.9)


# Seconds of a round measured on the 2-core Xeon server (Qwen2.5-Coder 0.5B int4 drafting for the
# 1.5B in float32; fifteenth goodput run, results/goodput15_xeon_c4_t0.json), by batch and length.
_XEON_ROUNDS = {1: {0: 0.260, 1: 0.312, 2: 0.421, 4: 0.510, 8: 0.714},
                4: {0: 0.315, 1: 0.492, 2: 0.644, 4: 0.954, 8: 1.563}}


def _xeon_seconds(batch: int, length: int) -> float:
    known = _XEON_ROUNDS[batch]
    if length in known:
        return known[length]
    low = max(l for l in known if l < length)
    high = min(l for l in known if l > length)
    return known[low] + (known[high] - known[low]) * (length - low) / (high - low)


def _serve_batch(controller, rate: float, prompt_rows: int, tokens: int = 64, batch: int = 4,
                 row_seconds: float = 0.0035) -> tuple[float, list[int]]:
    """A batch of new requests, ``tokens`` each, served to the end: each round's length chosen
    with the draft-cache catch-up it owes (the prompts' deferred draft prefill, then the
    positions of every plain round since), requests accepting drafts at ``rate`` each (their
    expected tokens committed). Returns the seconds spent (catch-ups included) and the lengths."""
    remaining, owed_rows, spent, chosen = float(tokens), prompt_rows, 0.0, []
    while remaining > 0:
        setup = DraftSetup(owed_rows * row_seconds, remaining) if owed_rows else NO_SETUP
        length = controller.choose([rate] * batch, batch, setup)
        seconds = _xeon_seconds(batch, length)
        if length > 0:
            spent += setup.seconds
            owed_rows = 0
            accepted = min(round(rate * length), length)  # a typical round at this rate
            controller.observe_rates(accepted * batch, batch, batch if accepted < length else 0)
        else:
            owed_rows += batch
        controller.observe_round(batch, length, seconds)
        spent += seconds
        remaining -= expected_tokens(rate, length)
        chosen.append(length)
    return spent, chosen


def test_a_new_batch_risks_its_catch_up_where_drafting_would_repay_it():
    """Batch 4 on a server that has run its anchors at batch 1: a new batch of code requests
    (94% of drafts accepted) owes its prompts' draft prefill (600 rows, 2.1 s) against 20 s of
    plain rounds. The controller risks it at once (the floor from batch 1 says drafting would
    save it twice over) and serves the batch well ahead of plain decoding; the wrong variant that
    takes every setup from the exploration budget, as the server did before, decodes plainly.
    Chat requests (60% accepted), where drafting cannot pay at batch 4, stay plain; so does a
    batch 16 whose 16 prompts' catch-up would cost 13 s."""
    def warmed(wrong: bool = False) -> BudgetController:
        controller = BudgetController(AdaptiveConfig.up_to(8))
        if wrong:
            controller._repays = lambda *args: False
        for _ in range(10):
            for length in _XEON_ROUNDS[1]:
                controller.observe_round(1, length, _XEON_ROUNDS[1][length])
        controller.observe_rates(80, 10, 0)  # the batch-1 rounds accepted their drafts
        return controller

    plain = 64 * _xeon_seconds(4, 0)
    spent, chosen = _serve_batch(warmed(), 0.94, prompt_rows=600)
    assert spent <= 0.87 * plain and max(chosen) > 0  # 1.19x here; the catch-up is a tenth
    wrong_spent, wrong_chosen = _serve_batch(warmed(wrong=True), 0.94, prompt_rows=600)
    assert wrong_spent >= 0.97 * plain and max(wrong_chosen[2:]) == 0
    chat_spent, chat_chosen = _serve_batch(warmed(), 0.6, prompt_rows=600)
    assert chat_spent <= 1.05 * plain
    controller = warmed()
    for _ in range(4):
        controller.observe_round(16, 0, 0.6)
    setup = DraftSetup(16 * 230 * 0.0035, 64.0)
    assert controller.decide([0.6] * 16, 16, setup) == 0


def test_server_rate_pools_request_rounds():
    """One request's rejected rounds move the server-wide rate by their share of the recent
    request-rounds: four rounds of 0 of 8 accepted after 30 rounds of 8 of 8 leave it high."""
    controller = BudgetController(AdaptiveConfig.up_to(8))
    assert controller.server_rate == pytest.approx(0.6)  # the prior before any round
    for _ in range(30):
        controller.observe_rates(8, 1, 0)
    high = controller.server_rate
    assert high > 0.97
    for _ in range(4):
        controller.observe_rates(0, 1, 1)
    assert 0.9 < controller.server_rate < high
    with pytest.raises(ValueError, match="rejections"):
        controller.observe_rates(0, 1, 2)
    with pytest.raises(ValueError, match="server_memory"):
        AdaptiveConfig.up_to(4, server_memory=0.0)
    with pytest.raises(ValueError, match="setup_payback"):
        AdaptiveConfig.up_to(4, setup_payback=-1.0)


def test_a_fixed_catch_up_cost_is_charged_to_the_round_that_resumes():
    """Resuming drafting after a plain round pays the catch-up's fixed part however little is
    owed: it is charged whole to that round, not spread over the remaining tokens, so a length
    that only just beats plain decoding does not take over from it (no switching back and forth,
    each switch paying it again); one that clearly wins still does."""
    controller = BudgetController(AdaptiveConfig.up_to(2))
    for length, seconds in ((0, 0.32), (0, 0.32), (1, 0.45), (1, 0.45), (2, 0.55), (2, 0.55)):
        controller.observe_round(4, length, seconds)
    rates = [0.64] * 4  # 2 drafts: 4 x 2.05 tokens at 0.55 s x 1.1, 14.9 tok/s against 12.5
    assert controller.decide(rates, 4) == 2
    owed = DraftSetup(0.016, 500.0, fixed_seconds=0.1)  # one plain round's 4 rows, and the pass
    assert owed.share(rates, 2) == pytest.approx(0.1 + 0.016 / (500.0 / expected_tokens(0.64, 2)))
    assert owed.total_seconds == pytest.approx(0.116)
    assert controller.decide(rates, 4, owed) == 0
    spread = DraftSetup(0.116, 500.0)  # the wrong pricing: all of it spread over 240 rounds
    assert controller.decide(rates, 4, spread) == 2
    assert controller.decide([0.9] * 4, 4, owed) == 2  # a clear win resumes at once
    with pytest.raises(ValueError, match="fixed_seconds"):
        DraftSetup(0.0, 10.0, fixed_seconds=-0.1)
    with pytest.raises(ValueError, match="fixed_rounds"):
        DraftSetup(0.0, 10.0, fixed_seconds=0.1, fixed_rounds=0.5)


def test_the_fixed_catch_up_cost_is_spread_over_the_rounds_a_setup_has_served():
    """Once drafting at a batch size has run 20 rounds per paid setup, the fixed part counts a
    twentieth per round: the same marginal win that stayed plain above resumes (a batch that
    went plain stays plain while 2 drafts are 13% faster otherwise); the rows owed still count
    over the remaining tokens, and a batch near its end stays plain. The history is per bucket."""
    controller = BudgetController(AdaptiveConfig.up_to(2))
    for length, seconds in ((0, 0.32), (0, 0.32), (1, 0.45), (1, 0.45), (2, 0.55), (2, 0.55)):
        controller.observe_round(4, length, seconds)
    rates = [0.64] * 4
    owed = DraftSetup(0.016, 500.0, fixed_seconds=0.1)
    assert controller.decide(rates, 4, owed) == 0
    assert controller.choose(rates, 4, owed) == 0  # a plain round records no setup
    controller.setups.observe(4, 2, owed)  # resumed once, then 40 rounds without a setup
    for _ in range(40):
        controller.setups.observe(4, 2, NO_SETUP)
    assert controller.setups.rounds_per_setup(4) == pytest.approx(42 / 2)
    assert controller.setups.rounds_per_setup(8) == 1.0
    assert controller.decide(rates, 4, owed) == 2
    assert controller.decide(rates, 4, DraftSetup(0.016, 3.0, fixed_seconds=0.1)) == 0  # 1.5 rounds left
    assert controller.as_dict()["rounds_per_setup_by_batch_bucket"] == {"4": 21.0}


def test_a_shorter_length_is_never_estimated_dearer_than_a_longer_one():
    """Two slow rounds of 3 drafts do not make 3 look dearer than 4 (a round of 3 does a subset
    of a round of 4's work): its estimate is capped at 4's."""
    costs = RoundCosts()
    for length, seconds in ((2, 0.61), (2, 0.61), (3, 1.93), (3, 1.25), (4, 0.82), (4, 0.80)):
        costs.observe(4, length, seconds, 0)
    assert costs.measured(4, 3) == pytest.approx(1.25)
    assert costs.estimate(4, 3) == pytest.approx(0.80)
    assert costs.estimate(4, 2) == pytest.approx(0.61)
    assert costs.estimate(4, 4) == pytest.approx(0.80)


def _run_in_time(controller, rate, seconds, rounds, start=0):
    """``_run`` with ``seconds(round_index, length)``: costs that change over time."""
    chosen = []
    for index in range(start, start + rounds):
        length = controller.choose([rate], 1)
        controller.observe_round(1, length, seconds(index, length))
        chosen.append(length)
    return chosen


def test_a_leader_displaced_by_a_slow_burst_is_measured_again_soon():
    """Batch 1 on the Xeon's round costs at 98% acceptance: 8 drafts lead until six slow rounds
    of theirs (1.5x) fill their window and hand the lead to 4, measured before the burst. 8 is
    rechecked 8 rounds later, its stale samples dropped, and leads again; the wrong variant (no
    rechecks: the delay at the refresh interval) holds 4 until the refresh."""
    def burst(index, length):
        return _xeon_seconds(1, length) * (1.5 if 30 <= index < 36 and length == 8 else 1.0)

    def served(config):
        controller = BudgetController(config)
        chosen = _run_in_time(controller, 0.98, burst, 100)
        return controller, chosen[36:]

    controller, after = served(AdaptiveConfig.up_to(8))
    assert after.count(4) <= 10 and after[10:].count(8) >= len(after[10:]) - 1  # one refresh of 0
    assert controller.as_dict()["recheck_rounds"] >= 1
    _, wrong = served(AdaptiveConfig.up_to(8, recheck_rounds=64))
    assert wrong.count(4) >= 50

    def speed(chosen):  # expected tokens per second over the rounds after the burst
        return (sum(expected_tokens(0.98, l) for l in chosen)
                / sum(burst(36 + i, l) for i, l in enumerate(chosen)))

    assert speed(after) > 1.15 * speed(wrong)
    with pytest.raises(ValueError, match="recheck_rounds"):
        AdaptiveConfig.up_to(8, recheck_rounds=0)
    with pytest.raises(ValueError, match="recheck_drift"):
        AdaptiveConfig.up_to(8, recheck_drift=-0.1)


def test_rechecks_back_off_and_skip_leads_lost_to_the_rates():
    """8 drafts slowing down for good (1.5x from round 30): rechecked after 8, 16 and 32 rounds,
    two rounds each, then left to the refresh (64 rounds). A lead lost because the requests accept fewer
    drafts (costs unchanged) is not rechecked at all."""
    slower = lambda index, length: _xeon_seconds(1, length) * (1.5 if index >= 30 and length == 8 else 1.0)
    controller = BudgetController(AdaptiveConfig.up_to(8))
    chosen = _run_in_time(controller, 0.98, slower, 150)
    assert chosen[40:].count(8) == 6 and controller.rechecks.rounds == 6
    assert controller.rechecks.due(1, 10 ** 6) is None

    rates = BudgetController(AdaptiveConfig.up_to(8))
    _run_in_time(rates, 0.98, lambda index, length: _xeon_seconds(1, length), 30)
    chosen = _run_in_time(rates, 0.5, lambda index, length: _xeon_seconds(1, length), 60, start=30)
    assert 8 not in chosen[2:] and rates.rechecks.rounds == 0


def test_the_first_batch_at_a_bucket_explores_from_the_work_ahead_of_it():
    """A cold server's first batch of 4 (plain decoding measured there, drafting only at batch
    1; each plain round adds 4 rows to the catch-up it owes): the exploration budget counts the
    seconds its remaining tokens will take, so it probes a draft length in its first rounds
    instead of decoding its 63 tokens plainly while the owed rows outgrow a budget counted from
    the past alone; a batch with 3 tokens left does not."""
    controller = BudgetController(AdaptiveConfig.up_to(8))
    for index in range(2):
        for length, seconds in ((0, 0.25), (1, 0.344), (8, 0.728)):
            controller.observe_round(1, length, seconds)
        controller.observe_round(4, 0, 0.30)
    rates = [0.62] * 4
    owed = DraftSetup(0.23, 63.0, fixed_seconds=0.048)
    assert controller.decide(rates, 4, DraftSetup(0.23, 3.0, fixed_seconds=0.048)) == 0
    probe = controller.choose(rates, 4, owed)
    assert probe > 0
    controller.observe_round(4, probe, 0.45 + owed.total_seconds)
    assert controller.explore_spent[4] > owed.total_seconds  # the setup is charged to the budget


def test_a_floor_is_never_above_a_round_measured_there():
    """At batch 16 the bounds from batch 4 put 8 drafts at >= 4.3 s; one 8-draft round measured
    there took 3.2 s, so its floor is 3.2 s and the controller, seeing it could beat 1 draft,
    measures it again at once instead of waiting for the exploration budget."""
    controller = BudgetController(AdaptiveConfig.up_to(8))
    for index in range(2):
        for length, seconds in ((0, 0.30), (1, 0.47), (2, 0.61), (4, 0.85), (8, 1.30)):
            controller.observe_round(4, length, seconds)
    for seconds in (0.63, 0.62):
        controller.observe_round(16, 0, seconds)
    for _ in range(6):
        controller.observe_round(16, 1, 0.90)
    for _ in range(2):  # the eleventh run's 2 drafts there (an anchor, else explored first)
        controller.observe_round(16, 2, 1.41)
    assert controller.costs.floor(16, 8) == pytest.approx(1.41 + 6 * (1.41 - 0.90))  # the line (e)
    controller.observe_round(16, 8, 3.2)
    assert controller.costs.floor(16, 8) == pytest.approx(3.2)
    assert controller.decide([0.98] * 16, 16) == 8
    controller.costs.samples[(16, 8)] = []  # without that round: 1 draft, 8 waits for the budget
    assert controller.decide([0.98] * 16, 16) == 1


def test_a_length_whose_median_sits_above_its_neighbours_line_is_measured_again():
    """Batch 1 as on the AVX-512 EPYC (twenty-eighth goodput run): the few rounds of 4-7 drafts
    ran slowly (1.6x their steady cost), so their medians sat far above the line through 3 and
    8 drafts, and 3 and 8 were chosen while 5 serves the most tokens per second. The controller
    rechecks the out-of-line length that would win at its line's cost, finds it steady, and
    drafts 4-7 from then on; the wrong variant (no rechecks) keeps 3 or 8 until the refresh."""
    steady = lambda index, length: 0.263 if length == 0 else 0.30 + 0.04 * length

    def served(config):
        controller = BudgetController(config)
        for length in range(9):
            for _ in range(2):
                controller.observe_round(1, length, steady(0, length) * (1.6 if 4 <= length <= 7 else 1.0))
        assert controller.rechecks.out_of_line(1, controller.costs, 18) if config.recheck_rounds < 64 else True
        return controller, _run_in_time(controller, 0.8, steady, 40)

    controller, chosen = served(AdaptiveConfig.up_to(8))
    assert sum(4 <= l <= 7 for l in chosen) >= 36
    assert controller.as_dict()["line_recheck_rounds"] >= 2
    assert 5 not in controller.rechecks.out_of_line(1, controller.costs, 10 ** 6)  # in line now
    _, wrong = served(AdaptiveConfig.up_to(8, recheck_rounds=64))
    assert not any(4 <= l <= 7 for l in wrong)

    def speed(lengths):
        return sum(expected_tokens(0.8, l) for l in lengths) / sum(steady(0, l) for l in lengths)

    assert speed(chosen) > 1.03 * speed(wrong)


def test_an_out_of_line_length_that_stays_out_of_line_waits_longer_each_time():
    """2 drafts truly cost more than the line through 1 and 3 (and would win at the line): it is
    rechecked at once, then after waits of 8, 16 and 32 rounds, two rounds each, then no more
    (the refresh takes over); a length out of line
    that could not win at its line's cost is never rechecked."""
    seconds = {0: 0.26, 1: 0.30, 2: 0.45, 3: 0.50, 4: 0.60}

    def measured(rate, rounds):
        controller = BudgetController(AdaptiveConfig((0, 1, 2, 3, 4)))
        for length in seconds:
            for _ in range(2):
                controller.observe_round(1, length, seconds[length])
        return controller, _run_in_time(controller, rate, lambda index, length: seconds[length], rounds)

    controller, chosen = measured(0.8, 100)  # before the refresh measures 2 again (round 127)
    rechecked = [i for i, l in enumerate(chosen) if l == 2]
    assert controller.rechecks.line_rounds == 8 and rechecked == [0, 1, 10, 11, 28, 29, 62, 63]
    assert controller.rechecks.line_waits[(1, 2)][0] == math.inf
    slow, _ = measured(0.2, 60)  # out of line too, but too slow to win even on the line
    assert slow.rechecks.line_rounds == 0


def test_a_cross_bucket_floor_is_scaled_by_what_shorter_lengths_cost_here():
    """Batch 4 on chat prompts (twenty-eighth run): from batch 1 (4 drafts measured there in slow
    rounds, plain decoding in a fast one) the row rule put 4 drafts at batch 4 at >= 1.12 s, and
    4 was never explored. But shorter lengths cost less at batch 4 than the same rule says (2
    drafts 0.45 s against 0.69 s), so it is scaled by the least such ratio, the floor of 4 falls
    to batch 4's own line through 1 and 3 drafts, and 4 is explored. The wrong variant (the rule
    unscaled) keeps 4 unexplored."""
    def controller_at(batch4):
        controller = BudgetController(AdaptiveConfig.up_to(8))
        for length, seconds in {0: (0.228, 0.26), 1: (0.357, 0.36), 2: (0.394, 0.40), 3: (0.40, 0.41),
                                4: (0.633, 0.667), 8: (0.55, 0.56)}.items():
            for value in seconds:
                controller.observe_round(1, length, value)
        for length, seconds in batch4.items():
            for value in seconds:
                controller.observe_round(4, length, value)
        return controller

    chat = {0: (0.326, 0.33), 1: (0.40, 0.45), 2: (0.45, 0.53, 0.53), 3: (0.62, 0.63)}
    controller = controller_at(chat)
    row_rule = 0.633 + 5 * (0.326 - 0.228)
    ratio = min(0.40 / (0.357 + 2 * 0.098), 0.45 / (0.394 + 3 * 0.098), 0.62 / (0.40 + 4 * 0.098))
    assert controller.costs.floor(4, 4) == pytest.approx(max(row_rule * ratio, 0.40 + 3 * (0.62 - 0.40) / 2))
    assert controller.decide([0.8] * 4, 4, DraftSetup(0.0, 60.0)) == 4
    wrong = controller_at(chat)
    floor = wrong.costs.floor
    wrong.costs.floor = lambda bucket, length: row_rule if (bucket, length) == (4, 4) else floor(bucket, length)
    assert wrong.decide([0.8] * 4, 4, DraftSetup(0.0, 60.0)) == 3
    # Where every shorter length costs at least what the rules say, they stand unscaled.
    dear = controller_at({0: (0.326, 0.33), 1: (0.60, 0.61), 2: (0.70, 0.71), 3: (0.80, 0.81)})
    assert dear.costs.floor(4, 4) == pytest.approx(row_rule)
