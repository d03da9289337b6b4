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
