"""``AdaptiveRounds``: the server's per-round bookkeeping around ``BudgetController`` (no SGLang)."""

from __future__ import annotations

import time
from types import SimpleNamespace

from sglang_hsd.adaptive import AdaptiveConfig, BudgetController
from sglang_hsd.sglang_plugin.adaptive_spec import BUDGET_KEY, AdaptiveRounds


def _reqs(n):
    return [SimpleNamespace(customized_info=None) for _ in range(n)]


def test_a_round_is_timed_without_the_catch_up_inside_it():
    """The catch-up's seconds (one-time work that depends on the plain rounds before) are not a
    cost of the round's length; a round without one is observed whole."""
    rounds = AdaptiveRounds(BudgetController(AdaptiveConfig.up_to(2)))
    reqs = _reqs(3)
    length = rounds.begin(reqs)
    time.sleep(0.02)
    rounds.end()
    whole = rounds.controller.costs.samples[(4, length)][-1]
    assert whole >= 0.02
    length = rounds.begin(reqs)
    time.sleep(0.02)
    rounds.end(excluded=0.015)
    assert rounds.controller.costs.samples[(4, length)][-1] < whole - 0.01
    assert [len(req.customized_info[BUDGET_KEY]) for req in reqs] == [2, 2, 2]


def test_a_pending_catch_up_is_priced_per_row_plus_a_fixed_part():
    """``DraftCatchUp.pending_seconds``: the rows the batch's marked requests miss at the cost
    per row of past large catch-ups, and what small ones cost beyond their rows at that price
    (the pass over the draft model's weights every catch-up makes); nothing owed costs nothing."""
    import pytest
    import torch

    from sglang_hsd.sglang_plugin.draft_cache_rows import STALE_ATTR
    from sglang_hsd.sglang_plugin.draft_catch_up import DraftCatchUp

    catch_up = DraftCatchUp(torch.device("cpu"))
    reqs = [SimpleNamespace(**{STALE_ATTR: 95}), SimpleNamespace(**{STALE_ATTR: None}),
            SimpleNamespace(**{STALE_ATTR: 98})]
    batch = SimpleNamespace(reqs=reqs, seq_lens=torch.tensor([100, 50, 100]))
    assert catch_up.pending_seconds(batch) == (0.0, 0.0)  # nothing priced yet
    catch_up.record(200, 0.8)  # 4 ms a row
    rows_part, fixed = catch_up.pending_seconds(batch)
    assert rows_part == pytest.approx(7 * 0.004) and fixed == 0.0
    catch_up.record(8, 0.132)
    catch_up.record(4, 0.116)  # 100 ms each beyond their rows
    rows_part, fixed = catch_up.pending_seconds(batch)
    assert rows_part == pytest.approx(7 * 0.004) and fixed == pytest.approx(0.1)
    current = SimpleNamespace(reqs=[SimpleNamespace(**{STALE_ATTR: None})], seq_lens=torch.tensor([10]))
    assert catch_up.pending_seconds(current) == (0.0, 0.0)
    state = catch_up.as_dict()
    assert state["small_catch_ups"] == 2 and state["catch_ups"] == 3


def test_the_trace_writes_one_line_per_round_with_what_the_controller_compared():
    """``--hsd-adaptive-trace``: each decode round appends a JSON line with the batch, the ids and
    rates, the owed catch-up (remaining tokens null when unbounded), the speeds compared, the
    chosen length, the round's seconds and, once verified, each request's accepted drafts (a
    round never verified is written without them when the next one begins); a cycle of forced
    lengths writes none (nothing was chosen)."""
    import io
    import json

    from sglang_hsd.adaptive import DraftSetup

    trace = io.StringIO()
    rounds = AdaptiveRounds(BudgetController(AdaptiveConfig.up_to(2)), trace=trace)
    reqs = _reqs(2)
    for _ in range(6):
        rounds.begin(reqs)
        rounds.end(excluded=0.0)
    reqs = [SimpleNamespace(customized_info=None, rid=f"r{i}",
                            sampling_params=SimpleNamespace(max_new_tokens=40), output_ids=[0] * 10)
            for i in range(2)]
    length = rounds.begin(reqs, setup_seconds=0.05, fixed_seconds=0.01)
    rates = [rounds.controller.request_rate(req.hsd_acceptance) for req in reqs]
    expected = rounds.controller.speeds(2, rates, DraftSetup(0.05, 30.0, 0.01))  # before end() observes
    rounds.end(excluded=0.004)
    assert len(trace.getvalue().splitlines()) == 6  # the last round waits for its accepted counts
    rounds.verified([length, 0])
    lines = [json.loads(line) for line in trace.getvalue().splitlines()]
    assert len(lines) == 7
    assert lines[0]["remaining"] is None and lines[0]["speeds"] == {} and "accepted" not in lines[0]
    last = lines[-1]
    assert (last["batch"], last["length"], last["remaining"]) == (2, length, 30.0)
    assert last["rids"] == ["r0", "r1"] and last["accepted"] == [length, 0]
    assert last["setup_s"] == 0.05 and last["fixed_s"] == 0.01 and last["excluded"] == 0.004
    assert last["speeds"] == {str(k): round(v, 3) for k, v in expected.items()}
    forced = io.StringIO()
    cycled = AdaptiveRounds(BudgetController(AdaptiveConfig.up_to(2)), lengths_cycle=(0, 1), trace=forced)
    cycled.begin(_reqs(1))
    cycled.end()
    assert forced.getvalue() == ""


def test_a_plain_round_ages_each_requests_acceptance_counts():
    """``verified`` after an L = 0 round discounts each request's counts by ``memory`` (plain
    rounds move the text on) and leaves the server-wide counts and the per-length histogram
    alone (nothing was drafted)."""
    rounds = AdaptiveRounds(BudgetController(AdaptiveConfig.up_to(2)), lengths_cycle=(2, 0))
    reqs = _reqs(2)
    assert rounds.begin(reqs) == 2
    rounds.end()
    rounds.verified([0, 2])
    before = [(req.hsd_acceptance.successes, req.hsd_acceptance.trials) for req in reqs]
    assert before == [(0.0, 1.0), (2.0, 2.0)]
    server = (rounds.controller.server_counts.successes, rounds.controller.server_counts.trials)
    assert rounds.begin(reqs) == 0
    rounds.end()
    rounds.verified([0, 0])
    memory = rounds.controller.config.memory
    assert [(req.hsd_acceptance.successes, req.hsd_acceptance.trials) for req in reqs] == [
        (s * memory, t * memory) for s, t in before]
    assert (rounds.controller.server_counts.successes, rounds.controller.server_counts.trials) == server
    assert set(rounds.accepted_counts) == {2}
