"""The adaptive controller's settings (``sglang_hsd/adaptive.py``): the lengths it chooses from,
how it estimates acceptance and prices rounds, and how far it explores. Every field has a
default measured on the Qwen2.5-Coder 0.5B -> 1.5B pair on 2-core CPUs (``benchmarks/README.md``);
the server sets them with ``--hsd-adaptive-tuning name=value,...``."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["AdaptiveConfig"]


@dataclass(frozen=True)
class AdaptiveConfig:
    """Fields:
        candidates: the draft lengths the server can switch between (0 = plain decoding), sorted,
            distinct, each >= 0, at least one positive.
        prior_rate: per-token acceptance assumed before any round was observed, in (0, 1).
        prior_rounds: weight of the server-wide rate in a request's estimate, in token trials (> 0).
            10 by default: a request's recent rounds say less about its next one than their
            counts suggest (on ShareGPT, rounds whose request's rate read below 0.55 accepted
            their first draft at about 0.74), and scored by the log-likelihood of each next
            round's outcome, 10-20 trials predicted better than 2 in the three traces of the
            twenty-eighth and twenty-ninth goodput runs; in one A/B on ShareGPT at c = 1 it served
            1.09-1.10x the tok/s of 2 (``benchmarks/README.md``, "A/B: the request's rate").
        memory: factor by which a request's earlier rounds are discounted each round, in (0, 1].
        cost_window: a round cost's estimate is the median of this many recent rounds (>= 2).
        refresh_rounds: an anchor length not run at a batch bucket for this many rounds there is
            run again (>= 1), as far as exploring it can pay (``sglang_hsd/adaptive.py``).
        contention: an anchor whose best possible speed at a bucket is below this fraction of the
            best known speed there is not explored there, in (0, 1].
        explore_share: exploration rounds of anchors that can only come close to the best
            (within ``contention``) may cost, beyond the best choice, at most this share of the
            seconds the bucket has run and the current batch's remaining tokens will take, in
            [0, 1). (Counting only the past, the first batch at batch 4 on a cold server decoded
            63 rounds plainly: the rows its catch-up owed grew faster than the budget.)
        draft_margin: a round that drafts is priced at this factor times its estimated seconds
            when lengths are compared (>= 1): what the medians of its rounds do not show. On the
            2-core Xeon at batch 4, rounds drafting 2 tokens cost on average 13% more than the
            median of their recent rounds (707 vs 625 ms, a tail of slow rounds whose cause was
            not isolated), and the draft model's prefill (deferred to the first drafting round)
            cost 34 s over 350 rounds; drafting that the medians put 20-40% ahead of plain
            decoding ran at 0.94-0.98x (``benchmarks/README.md``, "Server goodput, thirteenth
            run"). So drafting is chosen only where it is expected to win by more than this
            factor. Exploration budgets count a probe's real (unpriced) seconds.
        server_memory: factor by which the server-wide counts are discounted per request-round
            that drafted, in (0, 1]: 0.97 keeps about the last 30 request-rounds. (An average
            moving a tenth of the way per round let one request's four rejected rounds take the
            server rate from 0.92 to 0.58, and the next batch's new requests started there.)
        setup_payback: a probe from plain decoding that owes a setup runs at once when, at its
            floor and the current rates, drafting the batch's remaining tokens would save at
            least this many times the setup's seconds beyond paying it (>= 0); otherwise it
            waits for the exploration budget. At batch 16 on the 2-core Xeon the floors of 2, 4
            and 8 drafts were 1.35, 1.92, 3.5 s where their rounds took 1.33-1.48, 2.26-2.29,
            3.05-3.96 s; asking for the whole setup again (1.0) kept a cold batch of 16 code
            prompts plain for 8 rounds while its 3.3 s catch-up waited, 0.25 probes after the
            two rounds that measure plain decoding (``benchmarks/README.md``, nineteenth run).
        recheck_rounds: a length that lost the lead after its median rose more than
            ``recheck_drift`` above the least it showed while leading is run again this many
            rounds later, its old samples dropped, then after twice as many, while that stays
            below ``refresh_rounds`` (``sglang_hsd/adaptive_recheck.py``; >= 1, and
            ``>= refresh_rounds`` turns rechecks off).
        recheck_drift: see ``recheck_rounds`` (>= 0).
        spread_memory: factor by which the server-wide counts of where rounds stopped (per draft
            position, ``RateSpread``) are discounted per request-round that drafted, in (0, 1]:
            0.995 keeps about the last 200. The spread they measure belongs to the workload
            (prompts, temperature), so it is kept longer than the rate itself.
        spread_trials: the discounted trials at the first draft position before the spread is
            fitted and used (>= 1; ``inf``, the default: never, every round's tokens are taken
            as accepted at the request's one rate, the geometric model). In one ShareGPT run on
            a 2-core AVX2 EPYC, fitting from 32 trials served 0.96-1.11 the one-rate model's tok/s
            at T = 0 and 0.87-0.96 at T = 1 (c = 1 and 4; ``benchmarks/README.md``, twenty-first
            run): not better overall, so it stays off until a run says otherwise.
    """

    candidates: tuple[int, ...]
    prior_rate: float = 0.6
    prior_rounds: float = 10.0
    memory: float = 0.9
    cost_window: int = 5
    refresh_rounds: int = 64
    contention: float = 0.9
    explore_share: float = 0.03
    draft_margin: float = 1.1
    server_memory: float = 0.97
    setup_payback: float = 0.25
    recheck_rounds: int = 8
    recheck_drift: float = 0.1
    spread_memory: float = 0.995
    spread_trials: float = float("inf")

    def __post_init__(self) -> None:
        c = tuple(self.candidates)
        if not c or list(c) != sorted(set(c)) or c[0] < 0 or c[-1] < 1:
            raise ValueError(f"candidates must be sorted distinct lengths >= 0 with a positive one, got {c}")
        if not 0.0 < self.prior_rate < 1.0:
            raise ValueError(f"prior_rate must be in (0, 1), got {self.prior_rate}")
        if not self.prior_rounds > 0:
            raise ValueError(f"prior_rounds must be > 0, got {self.prior_rounds}")
        if not 0.0 < self.memory <= 1.0:
            raise ValueError(f"memory must be in (0, 1], got {self.memory}")
        if self.cost_window < 2:
            raise ValueError(f"cost_window must be >= 2, got {self.cost_window}")
        if self.refresh_rounds < 1:
            raise ValueError(f"refresh_rounds must be >= 1, got {self.refresh_rounds}")
        if not 0.0 < self.contention <= 1.0:
            raise ValueError(f"contention must be in (0, 1], got {self.contention}")
        if not 0.0 <= self.explore_share < 1.0:
            raise ValueError(f"explore_share must be in [0, 1), got {self.explore_share}")
        if not self.draft_margin >= 1.0:
            raise ValueError(f"draft_margin must be >= 1, got {self.draft_margin}")
        if not 0.0 < self.server_memory <= 1.0:
            raise ValueError(f"server_memory must be in (0, 1], got {self.server_memory}")
        if not self.setup_payback >= 0.0:
            raise ValueError(f"setup_payback must be >= 0, got {self.setup_payback}")
        if self.recheck_rounds < 1:
            raise ValueError(f"recheck_rounds must be >= 1, got {self.recheck_rounds}")
        if not self.recheck_drift >= 0.0:
            raise ValueError(f"recheck_drift must be >= 0, got {self.recheck_drift}")
        if not 0.0 < self.spread_memory <= 1.0:
            raise ValueError(f"spread_memory must be in (0, 1], got {self.spread_memory}")
        if not self.spread_trials >= 1.0:
            raise ValueError(f"spread_trials must be >= 1 (inf: never fitted), got {self.spread_trials}")

    def priced(self, length: int, seconds: float) -> float:
        """The seconds a round of ``length`` is compared at: ``draft_margin`` times ``seconds``
        for a round that drafts, ``seconds`` for plain decoding."""
        return seconds * self.draft_margin if length > 0 else seconds

    @classmethod
    def up_to(cls, longest: int, **kwargs) -> "AdaptiveConfig":
        """Every length 0..``longest`` (the configured draft length)."""
        if longest < 1:
            raise ValueError(f"longest must be >= 1, got {longest}")
        return cls(tuple(range(longest + 1)), **kwargs)

    @property
    def anchors(self) -> tuple[int, ...]:
        """The lengths measured at every bucket before costs are compared: the shortest, the
        shortest and longest positive ones and, with at least four positive ones, the second
        shortest and the one in between (the first draft costs more than each later one, since
        it brings the draft model's extend and the verify's fixed costs, so a line from the
        shortest to the longest overestimates the lengths between them by 15-20% on the Qwen
        pair; the two shortest give the slope that bounds longer rounds from below,
        ``RoundCosts.floor``)."""
        positive = [c for c in self.candidates if c > 0]
        more = [positive[1], positive[(len(positive) - 1) // 2]] if len(positive) >= 4 else []
        return tuple(sorted({self.candidates[0], positive[0], *more, positive[-1]}))
