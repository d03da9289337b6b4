"""The trace report's replay reproduces a controller's rates, and its tables count what they say."""

from __future__ import annotations

import json
import math
import random

import pytest

from benchmarks.adaptive_trace_report import (first_draft_by_rate, log_likelihood, read_trace, replayed_rates,
                                              report, truncation_ratios)
from sglang_hsd.adaptive import AcceptanceEstimate, AdaptiveConfig, BudgetController


def _trace(tmp_path, memory=0.9, prior=2.0, rounds=120, seed=0):
    """Rounds of two requests at true rates 0.5 and 0.9, lengths 0-4, rates traced as a
    controller with (memory, prior) estimates them."""
    rng = random.Random(seed)
    config = AdaptiveConfig((0, 1, 2, 3, 4), memory=memory, prior_rounds=prior)
    controller = BudgetController(config)
    estimates = {"a": AcceptanceEstimate(), "b": AcceptanceEstimate()}
    truth = {"a": 0.5, "b": 0.9}
    lines = []
    for index in range(rounds):
        rids = ["a", "b"] if index % 3 else ["b"]
        length = index % 5
        rates = [controller.request_rate(estimates[rid]) for rid in rids]
        accepted = []
        for rid in rids:
            a = 0
            while a < length and rng.random() < truth[rid]:
                a += 1
            accepted.append(a)
            estimates[rid].observe(length, a, memory)
        if length > 0:
            controller.observe_rates(sum(accepted), len(rids), sum(a < length for a in accepted))
        lines.append({"batch": len(rids), "rids": rids, "rates": [round(r, 4) for r in rates],
                      "length": length, "seconds": 0.1, "accepted": accepted})
    lines.append({"batch": 1, "rids": ["a"], "rates": [0.5], "length": 2, "seconds": 0.1})  # never finished
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_the_replay_at_the_traced_setting_reproduces_the_traced_rates(tmp_path):
    path = _trace(tmp_path)
    rounds = read_trace(str(path))
    assert len(rounds) == 120  # the unfinished round is left out
    replay = replayed_rates(rounds, AdaptiveConfig((0, 1, 2, 3, 4), memory=0.9, prior_rounds=2.0))
    assert max(abs(a - b) for r, row in zip(rounds, replay) for a, b in zip(r["rates"], row)) < 1e-4
    other = replayed_rates(rounds, AdaptiveConfig((0, 1, 2, 3, 4), memory=0.9, prior_rounds=20.0))
    assert max(abs(a - b) for r, row in zip(rounds, other) for a, b in zip(r["rates"], row)) > 0.01
    assert "at most 0.0000" in report(str(path), [0.9], [2.0, 10.0])


def test_tables_count_truncated_tokens_first_drafts_and_likelihoods():
    rounds = [{"batch": 1, "rids": ["a"], "rates": [0.5], "length": 3, "accepted": [1]},
              {"batch": 1, "rids": ["a"], "rates": [0.9], "length": 1, "accepted": [1]},
              {"batch": 1, "rids": ["a"], "rates": [0.5], "length": 0, "accepted": [0]}]
    ratios = truncation_ratios(rounds, 3)
    assert ratios[1] == (2, pytest.approx((2 + 2) / (1.5 + 1.9)))
    assert ratios[3] == (1, pytest.approx(2 / (1 + 0.5 + 0.25 + 0.125)))
    bins = first_draft_by_rate(rounds)
    assert [(n, share) for _, n, _, share in bins] == [(1, 1.0), (1, 1.0)]
    expected = (math.log(0.5) + math.log(0.5) + math.log(0.9)) / 2  # 1 of 3 then a reject; 1 of 1
    assert log_likelihood(rounds, [[0.5], [0.9], [0.5]]) == pytest.approx(expected)
