"""Acceptance for the adaptive controller (``sglang_hsd/adaptive.py``): a request's discounted
per-token counts, how much acceptance varies from round to round (:class:`RateSpread`), and the
tokens a chain of a given length is expected to commit."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

__all__ = ["AcceptanceEstimate", "RateSpread", "expected_tokens"]

# Concentrations s = a + b of the Beta law tried by RateSpread's fit: 0.25 * 1.5^k up to ~2000;
# a fit at the largest is no spread at all (the geometric model).
_CONCENTRATIONS = tuple(0.25 * 1.5 ** k for k in range(23))


def expected_tokens(rate: float, length: int) -> float:
    """Tokens a chain of ``length`` drafts commits when each is accepted with probability
    ``rate`` until the first rejection, the verifier's own token included: ``sum_{i<=L} rate^i``."""
    if length <= 0:
        return 1.0
    if rate >= 1.0:
        return float(length + 1)
    return (1.0 - rate ** (length + 1)) / (1.0 - rate)


@dataclass
class AcceptanceEstimate:
    """One request's discounted acceptance counts (per drafted token)."""

    successes: float = 0.0
    trials: float = 0.0

    def observe(self, drafted: int, accepted: int, memory: float) -> None:
        """A round that drafted ``drafted`` tokens and accepted the first ``accepted``; earlier
        rounds are discounted by ``memory``. A round that drafted nothing (plain decoding) adds no
        count but discounts the earlier ones too: acceptance belongs to the stretch of text being
        written, and plain rounds move the text on. (Without it a request whose rate fell after
        a few rejected rounds decoded plainly for the rest of its output: its estimate could only
        change by drafting. On chat prompts at T = 1, batch 1, 435 of 690 rounds were plain, in
        runs of 60 at rates 0.33-0.46 against the server's 0.65.)"""
        if not 0 <= accepted <= drafted:
            raise ValueError(f"accepted must be in [0, drafted={drafted}], got {accepted}")
        self.successes = self.successes * memory + accepted
        self.trials = self.trials * memory + accepted + (1 if accepted < drafted else 0)

    def rate(self, prior_rate: float, prior_rounds: float) -> float:
        """Posterior-mean style estimate, shrunk towards ``prior_rate`` with weight ``prior_rounds``
        counted in trials (a round adds its accepted drafts and one more for a rejection, so a
        round of 4 drafts adds 1-4), not in rounds."""
        return (self.successes + prior_rate * prior_rounds) / (self.trials + prior_rounds)


@dataclass
class RateSpread:
    """How much a round's per-token acceptance varies from round to round, fitted server-wide from
    where drafted rounds stopped, and the tokens a chain is expected to commit under it.

    Model (Beta-geometric): each round's drafts are accepted independently at a rate R drawn
    afresh per round from Beta(a, b) (mean m = a / s, concentration s = a + b); a chain of L drafts
    then commits ``1 + sum_{i<=L} E[R^i]`` tokens, ``E[R^i] = prod_{j<i} (a + j) / (s + j)``. One
    rate for every round (``expected_tokens``) is the limit s -> inf. The chance that draft i is
    accepted given the ones before were is ``(a + i - 1) / (s + i - 1)``: it rises with i, as the
    rounds that got far are the easy stretches of text. The server measured exactly that: on
    ShareGPT at T = 1 (Qwen2.5-Coder 0.5B -> 1.5B, batch 1) the rates at draft positions 1-4 were
    0.70, 0.79, 0.80, 0.86, which a Beta with m = 0.70, s = 2.3 reproduces (0.70, 0.79, 0.79,
    0.84). One rate (their pooled 0.76) puts one draft 4% above what it commits and, in that law,
    eight drafts 8% below: it overvalues short drafts against long ones, the more so for a request
    whose rate reads low.

    The fit: maximum likelihood of (a, b) over the discounted counts per position (``trials[i]``:
    rounds that reached draft i + 1, ``successes[i]``: those that accepted it), on a grid of s, a
    by bisection; no spread (the geometric model) until position 1 has ``min_trials`` trials,
    when every draft was accepted or none, or when the fit prefers the largest s. A request's own
    rate r (its pooled estimate, ``AcceptanceEstimate``) moves the fitted mean by the odds ratio
    of r to the counts' pooled rate, the spread kept. Server-wide because the spread belongs to the
    workload and one request has too few rounds to measure it. Used only where
    ``AdaptiveConfig.spread_trials`` is finite (off by default: its one A/B did not win).
    """

    memory: float
    min_trials: float
    successes: list[float] = field(default_factory=list)  # index i: draft position i + 1
    trials: list[float] = field(default_factory=list)
    # Request-rounds between fits (a fit costs 2-4 ms): this many, or an eighth of the first
    # position's trials at the last fit if fewer (a fit on little data moves with every round).
    refit_every: int = 16
    _fitted: tuple[float, float, float] | None = None  # (mean, concentration, pooled rate)
    _since_fit: int | None = None  # request-rounds observed since the last fit; None: never fitted
    _fit_trials: float = 0.0  # trials at the first position when last fitted

    def observe(self, counts: Sequence[tuple[int, int]]) -> None:
        """Rounds that drafted: (drafted, accepted) per request; earlier counts are discounted by
        ``memory`` per request-round. Nothing is counted when the spread is off (``min_trials``
        inf): the counts would serve no fit, and this runs every round."""
        counts = [(d, a) for d, a in counts if d > 0]
        if not counts or math.isinf(self.min_trials):
            return
        longest = max(d for d, _ in counts)
        if len(self.trials) < longest:
            self.trials += [0.0] * (longest - len(self.trials))
            self.successes += [0.0] * (longest - len(self.successes))
        discount = self.memory ** len(counts)
        self.trials = [t * discount for t in self.trials]
        self.successes = [x * discount for x in self.successes]
        for drafted, accepted in counts:
            if not 0 <= accepted <= drafted:
                raise ValueError(f"accepted must be in [0, drafted={drafted}], got {accepted}")
            for i in range(min(accepted + 1, drafted)):
                self.trials[i] += 1.0
                self.successes[i] += 1.0 if i < accepted else 0.0
        if self._since_fit is not None:
            self._since_fit += len(counts)

    @property
    def fitted(self) -> tuple[float, float, float] | None:
        """(mean m, concentration s, the counts' pooled rate) of the fitted Beta, or None for no
        spread (the geometric model); refitted as ``refit_every`` says."""
        if self._since_fit is None or self._since_fit >= min(self.refit_every, max(1.0, self._fit_trials / 8)):
            self._fitted, self._since_fit = self._fit(), 0
            self._fit_trials = self.trials[0] if self.trials else 0.0
        return self._fitted

    def _fit(self) -> tuple[float, float, float] | None:
        if not self.trials or self.trials[0] < self.min_trials:
            return None
        total_s, total_t = sum(self.successes), sum(self.trials)
        failures = total_t - total_s
        if total_s <= 0.0 or failures <= 1e-12:
            return None
        best = (-math.inf, None)
        for s in _CONCENTRATIONS:
            a = self._best_a(s, failures)
            ll = sum(x * math.log(a + i) - t * math.log(s + i)
                     for i, (x, t) in enumerate(zip(self.successes, self.trials)))
            ll += failures * math.log(s - a)
            if ll > best[0]:
                best = (ll, (a / s, s))
        if best[1] is None or best[1][1] == _CONCENTRATIONS[-1]:
            return None
        return (*best[1], total_s / total_t)

    def _best_a(self, s: float, failures: float) -> float:
        """The a in (0, s) maximising the likelihood at concentration s: its derivative
        ``sum_i successes_i / (a + i) - failures / (s - a)`` falls from +inf to -inf."""
        lo, hi = 0.0, s
        for _ in range(40):
            a = 0.5 * (lo + hi)
            slope = sum(x / (a + i) for i, x in enumerate(self.successes)) - failures / (s - a)
            lo, hi = (a, hi) if slope > 0 else (lo, a)
        return min(max(0.5 * (lo + hi), 1e-9), s * (1 - 1e-9))

    def expected_tokens(self, rate: float, length: int) -> float:
        """Tokens a chain of ``length`` drafts is expected to commit for a request whose pooled
        rate is ``rate`` (the verifier's token included); ``expected_tokens`` without a fit."""
        fit = self.fitted
        if fit is None or length <= 0 or not 0.0 < rate < 1.0:
            return expected_tokens(rate, length)
        mean, s, pooled = fit
        odds = mean / (1.0 - mean) * (rate / (1.0 - rate)) / (pooled / (1.0 - pooled))
        a = s * odds / (1.0 + odds)
        total = survive = 1.0
        for j in range(length):
            survive *= (a + j) / (s + j)
            total += survive
        return total

    def as_dict(self) -> dict | None:
        fit = self.fitted
        return None if fit is None else {"mean": round(fit[0], 4), "concentration": round(fit[1], 3)}
