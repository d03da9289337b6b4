"""How well the adaptive controller's per-request acceptance rates predicted the rounds that
followed, from a server's ``--hsd-adaptive-trace`` file (one JSON line per decode round:
``batch``, ``rids``, ``rates``, ``length``, ``accepted`` per request, ...).

Three tables, every request-round that drafted counted once:

* per draft length l: the tokens a round would have committed had it drafted l (its accepted
  drafts truncated at l, plus one; rounds that drafted at least l) over what the one-rate
  formula ``expected_tokens(rate, l)`` predicted at the request's traced rate;
* the same at l = 1 binned by the traced rate: how often the first draft was accepted, per bin;
* the mean log-likelihood of each round's outcome (a accepted of L drafted: ``r^a (1 - r)``,
  or ``r^L`` when all were) under the rates a controller with each ``(memory, prior_rounds)``
  of a grid would have estimated from the same rounds (``BudgetController.request_rate``,
  replayed request by request; the replay at the traced server's own setting, ``--traced``,
  is checked against the traced rates).

Truncation is exact for token-wise verification and an approximation for block verification,
whose accepted prefix may depend on drafts beyond l. The rates are scored on the rounds the
traced controller chose, so a setting that would have chosen other lengths is judged on these.

    python benchmarks/adaptive_trace_report.py benchmarks/results/goodput29_sharegpt_avx2.chain.trace.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterable, Sequence

from sglang_hsd.adaptive import AcceptanceEstimate, AdaptiveConfig, BudgetController
from sglang_hsd.adaptive_rates import expected_tokens

RATE_BINS = (0.0, 0.55, 0.65, 0.75, 0.85, 1.0)


def read_trace(path: str) -> list[dict]:
    """The trace's rounds that have their accepted counts, in order."""
    with open(path) as handle:
        rounds = [json.loads(line) for line in handle if line.strip()]
    return [r for r in rounds if isinstance(r.get("accepted"), list) and len(r["accepted"]) == r["batch"]]


def drafted(rounds: Iterable[dict]) -> Iterable[tuple[float, int, int]]:
    """(traced rate, drafted, accepted) of every request-round that drafted."""
    for r in rounds:
        if r["length"] > 0:
            for rate, accepted in zip(r["rates"], r["accepted"]):
                yield rate, r["length"], accepted


def truncation_ratios(rounds: Sequence[dict], longest: int) -> dict[int, tuple[int, float]]:
    """l -> (request-rounds that drafted >= l, observed over predicted tokens at l)."""
    out = {}
    for length in range(1, longest + 1):
        rows = [(rate, a) for rate, d, a in drafted(rounds) if d >= length]
        if rows:
            observed = sum(min(a, length) + 1 for _, a in rows)
            out[length] = (len(rows), observed / sum(expected_tokens(rate, length) for rate, _ in rows))
    return out


def first_draft_by_rate(rounds: Sequence[dict], bins: Sequence[float] = RATE_BINS) -> list[tuple[str, int, float, float]]:
    """(bin, request-rounds, mean traced rate, share whose first draft was accepted) per bin."""
    out = []
    for low, high in zip(bins, bins[1:]):
        rows = [(rate, a) for rate, _, a in drafted(rounds) if low <= rate < high or (high == bins[-1] and rate == high)]
        if rows:
            out.append((f"[{low:.2f}, {high:.2f})", len(rows), sum(r for r, _ in rows) / len(rows),
                        sum(a > 0 for _, a in rows) / len(rows)))
    return out


def replayed_rates(rounds: Sequence[dict], config: AdaptiveConfig) -> list[list[float]]:
    """The rates a controller with ``config`` estimates before each round, per request, from the
    same rounds (the server's bookkeeping: a plain round discounts a request's counts too)."""
    controller = BudgetController(config)
    estimates: dict[str, AcceptanceEstimate] = {}
    out = []
    for r in rounds:
        reqs = [estimates.setdefault(rid, AcceptanceEstimate()) for rid in r["rids"]]
        out.append([controller.request_rate(e) for e in reqs])
        length = r["length"]
        for estimate, accepted in zip(reqs, r["accepted"]):
            estimate.observe(length, accepted if length > 0 else 0, config.memory)
        if length > 0:
            controller.observe_rates(sum(r["accepted"]), len(reqs), sum(a < length for a in r["accepted"]))
    return out


def log_likelihood(rounds: Sequence[dict], rates: Sequence[Sequence[float]]) -> float:
    """Mean log-likelihood per drafting request-round of the outcomes under ``rates``."""
    total, count = 0.0, 0
    for r, row in zip(rounds, rates):
        if r["length"] == 0:
            continue
        for rate, accepted in zip(row, r["accepted"]):
            rate = min(max(rate, 1e-6), 1 - 1e-6)
            total += accepted * math.log(rate) + (math.log(1 - rate) if accepted < r["length"] else 0.0)
            count += 1
    return total / count if count else math.nan


def report(path: str, memories: Sequence[float], priors: Sequence[float],
           traced: tuple[float, float] = (0.9, 2.0)) -> str:
    """The three tables (module docstring) for one trace, Markdown; ``traced``: the (memory,
    prior_rounds) its server ran with."""
    rounds = read_trace(path)
    longest = max((r["length"] for r in rounds), default=0)
    candidates = tuple(range(max(longest, 1) + 1))
    replay = replayed_rates(rounds, AdaptiveConfig(candidates, memory=traced[0], prior_rounds=traced[1]))
    worst = max((abs(a - b) for r, row in zip(rounds, replay) for a, b in zip(r["rates"], row)), default=0.0)
    lines = [f"{path}: {len(rounds)} rounds; rates replayed at memory {traced[0]:g}, prior_rounds "
             f"{traced[1]:g} differ from the traced ones by at most {worst:.4f} (the trace rounds "
             "them to 4 digits; more means the server ran another setting)", "",
             "| drafts l | request-rounds | observed / predicted tokens |", "|---|---|---|"]
    lines += [f"| {l} | {n} | {ratio:.3f} |" for l, (n, ratio) in truncation_ratios(rounds, longest).items()]
    lines += ["", "| traced rate | request-rounds | mean rate | first draft accepted |", "|---|---|---|---|"]
    lines += [f"| {b} | {n} | {mean:.3f} | {share:.3f} |" for b, n, mean, share in first_draft_by_rate(rounds)]
    lines += ["", "| memory \\ prior_rounds | " + " | ".join(f"{p:g}" for p in priors) + " |",
              "|---|" + "---|" * len(priors)]
    for memory in memories:
        cells = [log_likelihood(rounds, replayed_rates(rounds, AdaptiveConfig(candidates, memory=memory,
                                                                                prior_rounds=prior)))
                 for prior in priors]
        lines.append(f"| {memory:g} | " + " | ".join(f"{c:.4f}" for c in cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", nargs="+", help="--hsd-adaptive-trace files")
    parser.add_argument("--memories", default="0.8,0.9,0.95,1.0", help="comma-separated memory values")
    parser.add_argument("--priors", default="2,5,10,20,50", help="comma-separated prior_rounds values")
    parser.add_argument("--traced", default="0.9,2", help="memory,prior_rounds the traced server ran with")
    args = parser.parse_args(argv)
    memories = [float(x) for x in args.memories.split(",")]
    priors = [float(x) for x in args.priors.split(",")]
    traced = tuple(float(x) for x in args.traced.split(","))
    if len(traced) != 2:
        parser.error(f"--traced must be memory,prior_rounds, got {args.traced!r}")
    for path in args.traces:
        print(report(path, memories, priors, traced), end="\n\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
