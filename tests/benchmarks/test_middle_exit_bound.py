"""The middle exit's bound: under one cost table, a perfect head beats the measured one, the bound
reads the run's own costs and agreement, and a cheap perfect exit beats the chain where a costly
one cannot."""

from __future__ import annotations

import json

from benchmarks import middle_exit_bound
from sglang_hsd.hierarchy.round_costs import KernelSetting, RoundCosts


def _costs(middle_share: float, tail_share: float) -> RoundCosts:
    rows = (1, 2, 4, 8, 17, 33)
    verify = tuple(1.0 + 0.05 * (n - 1) for n in rows)
    return RoundCosts(KernelSetting(2, "onednn-packed", "int4"), rows, tuple(0.1 * (1 + 0.01 * n) for n in rows),
                      verify, 0.0, middle_layers=(3,), middle_seconds=(tuple(middle_share * v for v in verify),),
                      tail_seconds=(tuple(tail_share * v for v in verify),))


AGREEMENT = {"drafter_target": 0.6, "drafter_exit3": 0.6, "exit3_target": 0.5}


def test_a_perfect_cheap_exit_beats_the_chain_and_a_costly_one_cannot():
    cheap = middle_exit_bound.bounds(_costs(0.25, 0.75), AGREEMENT)["layers"]["3"]
    assert cheap["perfect"]["vs_best_chain"] > 1.0 > cheap["measured"]["vs_best_chain"]
    # The target's call above the exit costing a whole target call (its first L layers on the
    # exit's last token read those layers' weights anyway): no head helps.
    costly = middle_exit_bound.bounds(_costs(0.85, 1.0), AGREEMENT)["layers"]["3"]
    assert costly["perfect"]["vs_best_chain"] < 1.0


def test_the_bound_reads_a_round_planner_run(tmp_path, monkeypatch):
    monkeypatch.setattr(middle_exit_bound, "RESULTS_DIR", tmp_path)
    source = {"costs": [_costs(0.25, 0.75).as_dict()], "agreement": {"int4": AGREEMENT}}
    (tmp_path / "run.json").write_text(json.dumps(source))
    middle_exit_bound.main(["--results", "run"])
    payload = json.loads((tmp_path / "run_middle_bound.json").read_text())
    assert payload["settings"][0]["layers"]["3"]["measured_agreement"] == {"drafter_exit": 0.6, "exit_target": 0.5}
    assert "| 2 threads, onednn-packed, drafter int4 | 0.600 |" in (tmp_path / "run_middle_bound.md").read_text()
