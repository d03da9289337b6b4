"""What an exit of the target between the drafter and the target could buy at best, priced with a
``bench_round_planner.py`` run's own measured call costs.

    PYTHONPATH=. python benchmarks/middle_exit_bound.py --results hier35_humaneval_t0

The run's JSON holds the measured ``RoundCosts`` (with the middle exits' and the target's calls
above them, ``--middles``) and the mean acceptance between levels on its planning records. This
script replays synthetic records of independent acceptances (``middle_replay.py``'s sampled mode)
at the measured drafter -> target rate a, and prices, with the same costs:

* the best fixed chain (the two-level baseline) at rate a;
* every middle shape L:N_d:N_1 at the exit's *measured* agreement (drafter -> exit, exit -> target);
* the same shapes with a *perfect* exit head (the target accepts every token the exit emits, the
  exit accepts the drafter's as often as the target does): an upper bound for any head at L.

Independent acceptances smooth over the runs of agreement that real text has, so the absolute
figures are approximate; the point is the ratio under one cost table. Prefill is left out (every
row here runs the drafter). Writes ``benchmarks/results/<name>.json`` and ``.md``.
"""

from __future__ import annotations

import json

import numpy as np

from benchmarks.common import RESULTS_DIR, benchmark_parser, start_run, write_results
from sglang_hsd.hierarchy.middle_record import MiddleRecord
from sglang_hsd.hierarchy.middle_replay import MiddleShape
from sglang_hsd.hierarchy.replay import STOP_THRESHOLDS, AcceptanceRecord
from sglang_hsd.hierarchy.round_costs import RoundCosts
from sglang_hsd.hierarchy.round_planner import RoundShape, predict

LENGTH = 400
NEW_TOKENS = 128
DRAFTS = (1, 2, 3, 4, 6, 8, 12, 16)
BUFFERS = (2, 4, 8, 12, 16, 24)


def parse_args(argv=None):
    parser = benchmark_parser(__doc__)
    parser.add_argument("--results", required=True, help="a bench_round_planner result name (in benchmarks/results)")
    parser.add_argument("--name", help="output name (default <results>_middle_bound)")
    return parser.parse_args(argv)


def synthetic(alpha: float, middles: dict[int, tuple[float, float]]) -> AcceptanceRecord:
    """A record of independent acceptances: drafter -> target ``alpha``; per middle layer
    (drafter -> exit, exit -> target)."""
    return AcceptanceRecord(
        False, np.full(LENGTH, alpha), np.zeros(LENGTH, dtype=np.int64), np.zeros((len(STOP_THRESHOLDS), LENGTH)),
        middles=tuple(MiddleRecord(layer, np.full(LENGTH, d), np.full(LENGTH, t))
                      for layer, (d, t) in sorted(middles.items())))


def bounds(costs: RoundCosts, agreement: dict) -> dict:
    """Predicted ms/token of the best chain and of the best middle shape per layer, measured and perfect."""
    alpha = agreement["drafter_target"]
    chains = [predict(RoundShape(fixed=k), costs, [synthetic(alpha, {})], NEW_TOKENS) for k in range(1, 17)]
    best_chain = min(chains, key=lambda p: p.seconds_per_token)
    out = {"alpha": alpha, "best_chain": {"shape": best_chain.shape.label,
                                          "ms_per_token": best_chain.seconds_per_token * 1e3,
                                          "tokens_per_round": best_chain.tokens_per_round}, "layers": {}}
    for layer in costs.middle_layers:
        measured = (agreement[f"drafter_exit{layer}"], agreement[f"exit{layer}_target"])
        entry = {"measured_agreement": {"drafter_exit": measured[0], "exit_target": measured[1]}}
        for kind, pair in (("measured", measured), ("perfect", (alpha, 1.0))):
            record = [synthetic(alpha, {layer: pair})]
            preds = [predict(RoundShape(middle=MiddleShape(layer, d, b)), costs, record, NEW_TOKENS)
                     for d in DRAFTS for b in BUFFERS]
            best = min(preds, key=lambda p: p.seconds_per_token)
            entry[kind] = {"shape": best.shape.label, "ms_per_token": best.seconds_per_token * 1e3,
                           "tokens_per_round": best.tokens_per_round,
                           "vs_best_chain": best_chain.seconds_per_token / best.seconds_per_token}
        entry["call_ms"] = {"target_9_rows": costs.verify(9) * 1e3, "exit_9_rows": costs.middle(layer, 9) * 1e3,
                            "target_above_exit_9_rows": costs.tail(layer, 9) * 1e3,
                            "target_1_row": costs.verify(1) * 1e3, "exit_1_row": costs.middle(layer, 1) * 1e3,
                            "target_above_exit_1_row": costs.tail(layer, 1) * 1e3}
        out["layers"][str(layer)] = entry
    return out


def main(argv=None) -> None:
    args = parse_args(argv)
    run = start_run(__file__, argv)
    source = json.loads((RESULTS_DIR / f"{args.results}.json").read_text())
    lines = [f"# A middle exit's bound: {args.results}", "",
             "Best fixed chain against the best `model:D,exit:L,target` shape (N_d in "
             f"{DRAFTS}, N_1 in {BUFFERS}), independent acceptances, {NEW_TOKENS} tokens, the run's measured "
             "call costs; 'perfect' = a head at L that the target always accepts.", "",
             "| setting | drafter -> target | best chain ms/tok | layer | call ms: target / exit / target above exit (9 rows) | "
             "agreement drafter->exit, exit->target | best middle, measured agreement | best middle, perfect head |",
             "|---|---|---|---|---|---|---|---|"]
    payload = {"source": args.results, "settings": []}
    for cost_dict in source["costs"]:
        costs = RoundCosts.from_dict(cost_dict)
        if not costs.middle_layers:
            continue
        agreement = source["agreement"][costs.setting.drafter_precision]
        result = {"setting": costs.setting.label, **bounds(costs, agreement)}
        payload["settings"].append(result)
        chain = result["best_chain"]
        for layer, entry in result["layers"].items():
            calls, agree = entry["call_ms"], entry["measured_agreement"]
            lines.append(
                f"| {costs.setting.label} | {result['alpha']:.3f} | {chain['ms_per_token']:.1f} ({chain['shape']}) | "
                f"{layer} | {calls['target_9_rows']:.0f} / {calls['exit_9_rows']:.0f} / "
                f"{calls['target_above_exit_9_rows']:.0f} | {agree['drafter_exit']:.3f}, {agree['exit_target']:.3f} | "
                f"{entry['measured']['ms_per_token']:.1f} ({entry['measured']['shape']}), "
                f"{entry['measured']['vs_best_chain']:.2f}x | {entry['perfect']['ms_per_token']:.1f} "
                f"({entry['perfect']['shape']}), {entry['perfect']['vs_best_chain']:.2f}x |")
    write_results(RESULTS_DIR / (args.name or f"{args.results}_middle_bound"), payload, "\n".join(lines), run)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
