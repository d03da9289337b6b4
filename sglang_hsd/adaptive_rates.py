"""Acceptance for the adaptive controller (``sglang_hsd/adaptive.py``): a request's discounted
per-token counts and the tokens a chain of a given length is expected to commit."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["AcceptanceEstimate", "expected_tokens"]


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
        """Posterior-mean style estimate, shrunk towards ``prior_rate`` with weight ``prior_rounds``."""
        return (self.successes + prior_rate * prior_rounds) / (self.trials + prior_rounds)
