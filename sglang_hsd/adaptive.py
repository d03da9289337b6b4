"""Adaptive speculation: how many tokens the next round drafts, chosen to maximise tokens per second.

Each round the server runs a batch of B requests with one draft length L for all of them (SGLang
swaps its speculative runtime state between pre-built lengths; L = 0 is plain decoding). The
:class:`BudgetController` picks L from

* each request's per-token acceptance rate, estimated from its own past rounds
  (:class:`AcceptanceEstimate`: a rejection ends a round, so a round that drafted L and accepted
  a < L tokens is a successes and one failure, a = L is L successes), shrunk towards the server-wide
  rate for requests with few rounds, older rounds discounted by every later round, plain ones
  included (a request that stopped drafting drifts back to the server rate); the server-wide
  rate pools the same counts over every request's recent rounds (discounted per request-round,
  so one request's bad rounds move it by their share, not by a fixed step each);
* the measured seconds of a round at this batch size (:class:`RoundCosts`: per power-of-two batch
  bucket and length, the median of the last few rounds; lengths not measured are interpolated
  linearly between measured ones, since each draft step adds about one small forward);

as ``argmax_L sum_i E_i(L) / cost(B, L)`` with ``E(L)`` the expected tokens of a chain of L drafts
(the bonus token included): ``1 + r + ... + r^L``, every round's tokens accepted at the
request's one rate r; or, with ``AdaptiveConfig.spread_trials`` finite, the Beta-geometric law
whose spread between rounds the server measures where its rounds stopped (:class:`RateSpread`:
one rate per round, drawn afresh; off by default, as its one A/B did not win). The cost of
a length that drafts priced at ``AdaptiveConfig.draft_margin`` times its estimate (drafting must
win by more than what the estimates miss). Before it can
compare, the controller measures each *anchor* length (0, the shortest and the longest positive one,
and one in between) twice per bucket, and again when one has not run there for ``refresh_rounds`` rounds, so a cost that
drifts (a machine getting busier) is re-measured; a length that lost the lead to its own slower
rounds is rechecked sooner, its stale samples dropped (``sglang_hsd/adaptive_recheck.py``). Exploring is not free: at batch 16 on a 2-core CPU
one 8-draft round costs twelve plain rounds, and a short benchmark row never earns that back. So a
positive anchor is explored only as far as it can pay (``BudgetController._due_anchor``): from its
*floor* (``RoundCosts.floor``: the least such a round can cost here, from what it, a shorter round
or the same round at a smaller batch measured) the controller bounds the speed it could reach with
the current rates; an anchor that could beat the best known speed is explored at once, one that
could only come within ``contention`` of it is explored from a budget (its expected extra seconds
over the best choice, paid out of ``explore_share`` of the seconds this bucket has run and the
current batch's remaining tokens will take at the best speed), and one
that cannot come that close is not explored while the rates say so. A probe of a batch that
decodes plainly and owes a :class:`DraftSetup` risks the whole setup (wasted if the probe loses):
it runs at once only when, at its floor, drafting would save a quarter of the setup again over
the batch's remaining tokens after paying it (``AdaptiveConfig.setup_payback``), else from the
budget, setup included. (Without that, a cold server at batch 4 with code prompts, 94% of drafts
accepted, decoded plainly in 189 of 200 rounds: each new batch owed its prompts' draft prefill,
about 2 s against 20 s of plain rounds, and the budget paid for a probe only after a minute.)
At large batches the verify of B (L + 1) rows costs more than the tokens it adds and the choice
falls to 0: speculation backs off to off.

Drafting may first owe a one-time cost (:class:`DraftSetup`: on the server, catching the draft
model's cache up over requests whose draft prefill and extends were skipped while they decoded
plainly). It is spread over the rounds drafting would serve (the batch's remaining tokens over the
tokens a round of L commits) and added to every positive length's seconds, so a batch near its end,
or one whose catch-up would be long, keeps decoding plainly unless drafting earns the catch-up back;
its fixed part (paid however little is owed) over the drafting rounds a setup has served here.

Why it is lossless: L for round n is a function of rounds 1..n-1 only (their drafted and accepted
counts and their timings), never of round n's drafts, so every round is a verification of a draft
whose length was fixed before it was drawn, and each such round is exact (``docs/verification.md``).
A controller that shortened a round's draft *after* seeing which of its tokens the verifier accepts
would not be (``verify/oracles/adaptive_rounds_exact.py`` checks both over several rounds).
"""

from __future__ import annotations

import math
from typing import Sequence

from sglang_hsd.adaptive_config import AdaptiveConfig
from sglang_hsd.adaptive_costs import NO_SETUP, DraftSetup, RoundCosts, SetupHistory, batch_bucket
from sglang_hsd.adaptive_rates import AcceptanceEstimate, RateSpread, expected_tokens
from sglang_hsd.adaptive_recheck import Rechecks

__all__ = ["NO_SETUP", "AcceptanceEstimate", "AdaptiveConfig", "BudgetController", "DraftSetup", "RateSpread", "RoundCosts",
           "batch_bucket", "expected_tokens"]


class BudgetController:
    """Chooses each round's draft length (module docstring). Not thread-safe: one per scheduler.

    Use: ``length = choose(rates, batch)`` before a round; ``observe_round(batch, length,
    seconds)`` after it; ``AcceptanceEstimate.observe`` per request with its drafted / accepted
    counts, ``observe_rates`` with the rates of the requests that drafted and ``observe_stops``
    with their (drafted, accepted) pairs. ``decide`` is
    ``choose`` without recording the choice (what the length would be, e.g. for an oracle).
    """

    def __init__(self, config: AdaptiveConfig) -> None:
        self.config = config
        self.costs = RoundCosts(window=config.cost_window)
        self.server_counts = AcceptanceEstimate()  # every request's rounds, pooled
        self.spread = RateSpread(config.spread_memory, config.spread_trials)
        self.rounds = 0
        self.bucket_rounds: dict[int, int] = {}
        self.bucket_seconds: dict[int, float] = {}  # seconds of all rounds run at a bucket
        self.explore_spent: dict[int, float] = {}  # seconds budgeted probes cost beyond the best
        self._probe: tuple[int, int, float] | None = None  # (bucket, length, best's seconds)
        self.choices: dict[tuple[int, int], int] = {}  # (bucket, length) -> rounds chosen
        self.request_rounds_by_length: dict[int, int] = {}
        # (bucket, length) -> [rounds, seconds] of every round observed: the medians decide, the
        # totals show what the rounds cost on average (a slow first round after a switch).
        self.totals: dict[tuple[int, int], list[float]] = {}
        self.rechecks = Rechecks(config.recheck_rounds, config.recheck_drift, config.refresh_rounds)
        self.setups = SetupHistory()

    @property
    def server_rate(self) -> float:
        """The server-wide per-token acceptance rate: the pooled counts of recent request-rounds,
        shrunk towards ``prior_rate`` with weight ``prior_rounds``, kept inside (0, 1)."""
        rate = self.server_counts.rate(self.config.prior_rate, self.config.prior_rounds)
        return min(max(rate, 1e-3), 1 - 1e-3)

    def request_rate(self, estimate: AcceptanceEstimate) -> float:
        return estimate.rate(self.server_rate, self.config.prior_rounds)

    def observe_stops(self, counts: Sequence[tuple[int, int]]) -> None:
        """Where a round's chains stopped, (drafted, accepted) per request: the server-wide
        counts per draft position that measure how acceptance varies between rounds (``spread``)."""
        self.spread.observe(counts)

    def tokens(self, rates: Sequence[float], length: int) -> float:
        """Tokens a round of ``length`` drafts is expected to commit over requests at ``rates``,
        with the measured spread between rounds (``RateSpread.expected_tokens``)."""
        return sum(self.spread.expected_tokens(r, length) for r in rates)

    def observe_rates(self, accepted: int, drafted_rounds: int, rejections: int) -> None:
        """A round in which ``drafted_rounds`` requests drafted, accepting ``accepted`` tokens in
        all, ``rejections`` of them ending on a rejection: the server-wide counts, discounted by
        ``server_memory`` per request-round."""
        if drafted_rounds == 0:
            return
        if not 0 <= rejections <= drafted_rounds:
            raise ValueError(f"rejections must be in [0, drafted_rounds={drafted_rounds}], got {rejections}")
        discount = self.config.server_memory ** drafted_rounds
        counts = self.server_counts
        counts.successes = counts.successes * discount + accepted
        counts.trials = counts.trials * discount + accepted + rejections

    def speeds(self, bucket: int, rates: Sequence[float], setup: DraftSetup = NO_SETUP) -> dict[int, float]:
        """Expected tokens per second of each candidate whose cost at ``bucket`` is known, at its
        price with ``setup``'s share, its fixed part spread as this bucket's history says (what
        the choice compares)."""
        setup = self.setups.spread(bucket, setup)
        speeds = {}
        for candidate in self.config.candidates:
            seconds = self.costs.estimate(bucket, candidate)
            if seconds is None or seconds <= 0:
                continue
            seconds = self.config.priced(candidate, seconds + setup.share(rates, candidate))
            speeds[candidate] = self.tokens(rates, candidate) / seconds
        return speeds

    def _fastest(self, bucket: int, rates: Sequence[float],
                 setup: DraftSetup = NO_SETUP) -> tuple[int, float]:
        """The candidate with the highest expected tokens per second at ``bucket`` from the costs
        known there (with ``setup``'s share), and that speed (-inf when no cost is known)."""
        best, best_speed = self.config.candidates[0], -math.inf
        for candidate, speed in self.speeds(bucket, rates, setup).items():
            if speed > best_speed:
                best, best_speed = candidate, speed
        return best, best_speed

    def _due_anchor(self, bucket: int, rates: Sequence[float], setup: DraftSetup,
                    fastest: tuple[int, float]) -> tuple[int, float | None] | None:
        """The anchor to measure now at ``bucket`` and, for a probe paid from the exploration
        budget, the best choice's seconds (what the probe's extra cost is counted against), given
        ``fastest`` (``_fastest`` at these rates and setup); None
        when no anchor is due or none can pay. An anchor is due with fewer than two measurements
        here or when it last ran ``refresh_rounds`` rounds ago; plain decoding (0) is always
        measured; a positive anchor as far as its best possible speed allows (module docstring)."""
        seen = self.bucket_rounds.get(bucket, 0)
        best, best_speed = fastest
        for length in self.config.anchors:
            last = self.costs.last_run.get((bucket, length))
            if not (last is None or self.costs.measured(bucket, length) is None
                    or seen - last >= self.config.refresh_rounds):
                continue
            floor = self.costs.floor(bucket, length) if length > 0 else None
            if floor is None or floor <= 0:
                return length, None  # plain decoding, or nothing bounds what it costs: measure
            floor += setup.share(rates, length)
            # Compared at its price (as _fastest prices the best); its extra seconds below are real.
            speed = self.tokens(rates, length) / self.config.priced(length, floor)
            if best_speed == -math.inf:
                return length, None  # nothing known to compare with: measure it now
            # A probe from plain decoding must pay the whole setup first, all of it wasted if
            # the probe shows drafting does not pay: risked at once only where the floor says
            # drafting would earn it back again, else explored from the budget.
            wasted = setup.total_seconds if best == 0 else 0.0
            if speed >= best_speed and (wasted == 0.0 or self._repays(bucket, length, rates, speed,
                                                                         best_speed, setup)):
                return length, None  # it may be the best: measure it now
            if speed < self.config.contention * best_speed:
                continue  # it cannot come close while the rates stay as they are
            best_seconds = self.costs.estimate(bucket, best) + setup.share(rates, best)
            extra = max(floor - best_seconds, 0.0) + wasted
            ahead = len(rates) * setup.remaining_tokens / best_speed  # the batch's work left
            budget = self.config.explore_share * (self.bucket_seconds.get(bucket, 0.0)
                                                  + (ahead if ahead < math.inf else 0.0))
            if self.explore_spent.get(bucket, 0.0) + extra <= budget:
                return length, best_seconds - wasted  # observe_round charges the setup too
        return None

    def _repays(self, bucket: int, length: int, rates: Sequence[float], speed: float,
                best_speed: float, setup: DraftSetup) -> bool:
        """Whether drafting ``length`` at ``speed`` (tokens per second at its floor, its setup
        share included) instead of plain decoding at ``best_speed`` would save ``setup_payback``
        times the setup's seconds over the batch's remaining tokens. Only on a floor from this
        length's own rounds (here or at a smaller batch): a length never run has no floor but
        plain decoding's and shorter lengths' costs, which at batch 16 put 4 drafts at a third
        of their cost."""
        if not self.costs.informed(bucket, length):
            return False
        saved_per_token = 1.0 / best_speed - 1.0 / speed
        owed = self.config.setup_payback * setup.total_seconds
        if saved_per_token <= 0.0:
            return owed <= 0.0
        return setup.remaining_tokens * len(rates) * saved_per_token >= owed

    def choose(self, rates: Sequence[float], batch: int, setup: DraftSetup = NO_SETUP) -> int:
        """The draft length of the next round for a batch whose requests have acceptance
        ``rates`` (one per request, ``len(rates) == batch``) and which must pay ``setup`` before
        it drafts; the choice is recorded."""
        length, probe_against, leader, line = self._plan(rates, batch, setup)
        bucket = batch_bucket(batch)
        if line is not None:
            self.rechecks.start_line(bucket, length, line, self.bucket_rounds.get(bucket, 0))
        self.setups.observe(bucket, length, setup)
        self.rechecks.lead(bucket, leader, self.costs, self.bucket_rounds.get(bucket, 0))
        self._probe = None if probe_against is None else (bucket, length, probe_against)
        self.choices[(bucket, length)] = self.choices.get((bucket, length), 0) + 1
        self.request_rounds_by_length[length] = self.request_rounds_by_length.get(length, 0) + batch
        return length

    def decide(self, rates: Sequence[float], batch: int, setup: DraftSetup = NO_SETUP) -> int:
        """The length ``choose`` would return now, recording nothing (no state changes)."""
        return self._plan(rates, batch, setup)[0]

    def _plan(self, rates: Sequence[float], batch: int,
              setup: DraftSetup) -> tuple[int, float | None, int, float | None]:
        """(the length to run, the best choice's seconds for a budgeted probe or None, the
        length ranked fastest on the known costs: the leader ``Rechecks`` tracks, and the line's
        seconds when the length is an out-of-line one to recheck from now, else None)."""
        if len(rates) != batch:
            raise ValueError(f"rates must have one entry per request ({batch}), got {len(rates)}")
        bucket = batch_bucket(batch)
        setup = self.setups.spread(bucket, setup)
        best, best_speed = self._fastest(bucket, rates, setup)
        due = self._due_anchor(bucket, rates, setup, (best, best_speed))
        if due is not None:
            return (*due, best, None)
        index = self.bucket_rounds.get(bucket, 0)
        recheck = self.rechecks.due(bucket, index)
        if recheck is not None and recheck.length != best:
            # Only while it would lead again at the cost it showed while leading (or at its line).
            if self._beats(recheck.length, recheck.baseline, rates, setup, best_speed) is not None:
                return recheck.length, None, best, None
        if recheck is None:
            lines = self.rechecks.out_of_line(bucket, self.costs, index)
            speeds = {length: speed for length, line in lines.items() if length != best
                      and (speed := self._beats(length, line, rates, setup, best_speed)) is not None}
            if speeds:
                length = max(speeds, key=speeds.__getitem__)
                return length, None, best, lines[length]
        return best, None, best, None

    def _beats(self, length: int, seconds: float, rates: Sequence[float], setup: DraftSetup,
               best_speed: float) -> float | None:
        """The expected tokens per second of ``length`` at ``seconds`` a round (priced, with
        ``setup``'s share) if it reaches ``best_speed``, else None."""
        speed = self.tokens(rates, length) / self.config.priced(length, seconds + setup.share(rates, length))
        return speed if speed >= best_speed else None

    def observe_round(self, batch: int, length: int, seconds: float) -> None:
        """A decode round of ``batch`` requests drafting ``length`` took ``seconds``."""
        bucket = batch_bucket(batch)
        index = self.bucket_rounds.get(bucket, 0)
        self.rechecks.observe(bucket, length, self.costs, index)
        self.costs.observe(bucket, length, seconds, index)
        self.bucket_rounds[bucket] = index + 1
        self.bucket_seconds[bucket] = self.bucket_seconds.get(bucket, 0.0) + seconds
        total = self.totals.setdefault((bucket, length), [0, 0.0])
        total[0] += 1
        total[1] += seconds
        if self._probe is not None and self._probe[:2] == (bucket, length):
            self.explore_spent[bucket] = (self.explore_spent.get(bucket, 0.0)
                                          + max(seconds - self._probe[2], 0.0))
        self._probe = None
        self.rounds += 1

    def mean_length(self) -> float | None:
        """Mean chosen length per request-round (None before any round)."""
        total = sum(self.request_rounds_by_length.values())
        if total == 0:
            return None
        return sum(l * n for l, n in self.request_rounds_by_length.items()) / total

    def as_dict(self) -> dict:
        """For ``/server_info``: the choices and measured costs (milliseconds) per bucket."""
        choices: dict[str, dict[str, int]] = {}
        for (bucket, length), n in sorted(self.choices.items()):
            choices.setdefault(str(bucket), {})[str(length)] = n
        costs: dict[str, dict[str, float]] = {}
        for (bucket, length), s in sorted(self.costs.seconds.items()):
            costs.setdefault(str(bucket), {})[str(length)] = round(1000 * s, 2)
        totals: dict[str, dict[str, list]] = {}
        for (bucket, length), (n, s) in sorted(self.totals.items()):
            totals.setdefault(str(bucket), {})[str(length)] = [int(n), round(1000 * s, 1)]
        mean = self.mean_length()
        return {"candidates": list(self.config.candidates), "rounds": self.rounds,
                "mean_steps": None if mean is None else round(mean, 3),
                "server_accept_rate": round(self.server_rate, 4), "rate_spread": self.spread.as_dict(),
                "recheck_rounds": self.rechecks.rounds,
                "line_recheck_rounds": self.rechecks.line_rounds,
                "rounds_per_setup_by_batch_bucket": self.setups.as_dict(),
                "explore_ms_by_batch_bucket": {str(b): round(1000 * v, 2)
                                               for b, v in sorted(self.explore_spent.items())},
                "choices_by_batch_bucket": choices, "round_ms_by_batch_bucket": costs,
                "rounds_and_total_ms_by_batch_bucket": totals}
