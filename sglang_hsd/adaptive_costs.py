"""Measured seconds of the server's decode rounds, per batch bucket and draft length, for the
adaptive controller (``sglang_hsd/adaptive.py``): estimates (lower medians, interpolated between
measured lengths) and floors (the least a round can be expected to cost, from what it, a shorter
round or the same round at a smaller batch measured); and what drafting must pay once before it
starts (:class:`DraftSetup`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Sequence

from sglang_hsd.adaptive_rates import expected_tokens

__all__ = ["NO_SETUP", "DraftSetup", "RoundCosts", "SetupHistory", "batch_bucket"]


def batch_bucket(batch: int) -> int:
    """The power of two at or above ``batch`` (>= 1): rounds of similar batch share costs."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    return 1 << (batch - 1).bit_length()


@dataclass
class RoundCosts:
    """Measured seconds of a decode round per (batch bucket, draft length).

    A key's estimate is the lower median of its last ``window`` measurements once it has
    ``min_samples``: the first round after a switch or a prefill can cost several times a steady
    one (a lazy initialisation, a cold cache), and one such outlier must not decide for the next
    64 rounds.
    """

    window: int = 5
    min_samples: int = 2
    samples: dict[tuple[int, int], list[float]] = field(default_factory=dict)
    last_run: dict[tuple[int, int], int] = field(default_factory=dict)

    def observe(self, bucket: int, length: int, seconds: float, round_index: int) -> None:
        key = (bucket, length)
        recent = self.samples.setdefault(key, [])
        recent.append(seconds)
        del recent[:-self.window]
        self.last_run[key] = round_index

    def restart(self, bucket: int, length: int) -> None:
        """Drop the key's samples (kept: when it last ran): its next rounds alone estimate it
        (``sglang_hsd/adaptive_recheck.py``)."""
        self.samples[(bucket, length)] = []

    def measured(self, bucket: int, length: int) -> float | None:
        """The lower median of the key's recent measurements (of two, the smaller: the first
        round of a length at a batch size can cost twenty times a steady one, oneDNN creating
        kernels for its new row count, and must not count half), None with fewer than
        ``min_samples``."""
        recent = self.samples.get((bucket, length), [])
        if len(recent) < self.min_samples:
            return None
        return sorted(recent)[(len(recent) - 1) // 2]

    @property
    def seconds(self) -> dict[tuple[int, int], float]:
        """Every key with an estimate -> its median seconds."""
        out = {}
        for bucket, length in self.samples:
            value = self.measured(bucket, length)
            if value is not None:
                out[(bucket, length)] = value
        return out

    def least(self, bucket: int, length: int) -> float | None:
        """The smallest of the key's recent measurements; None with fewer than ``min_samples``
        (one round may be a cold one and bounds nothing from below)."""
        recent = self.samples.get((bucket, length), [])
        return min(recent) if len(recent) >= self.min_samples else None

    def informed(self, bucket: int, length: int) -> bool:
        """Whether ``length`` has ``min_samples`` rounds at ``bucket`` or a smaller one, so that
        its floor there rests on its own measurements."""
        return any(b <= bucket and l == length and self.least(b, l) is not None
                   for (b, l) in self.samples)

    def floor(self, bucket: int, length: int) -> float | None:
        """The least a round drafting ``length`` can be expected to cost at ``bucket``: the
        largest of (a) its own least measurement here, (b) the least measurement here of a shorter
        length (a longer round does all a shorter one does, and more), (c) from the largest
        smaller bucket b where it and plain decoding ran: its least measurement there plus, for
        each of its L + 1 verify rows per request, what a request's row added to plain decoding's
        cost from b to here, and (d) that measurement scaled as plain decoding's cost grew from b
        to here; at most any round of it measured here. None without any. (c) and (d) are lower
        bounds only in the sense of a round's rows turning compute bound no later than plain
        decoding's: on the 2-core CPU a 1-draft round at batch 16 cost 3.4 plain rounds there but
        1.2 at batch 4. So each is scaled by the least ratio, at most 1, of what a shorter positive
        length measured here and at b cost here to what the rule says for it: at batch 4 on chat
        prompts (twenty-eighth run) (c) from batch 1 put 4 drafts at 1.12 s while 2 drafts
        measured 0.45 s there where (c) said 0.69 s, and 4, never explored, was the length the
        fixed chain ran faster with; at batch 16, 1 draft at 0.90 s against (c)'s 1.11 s scales
        8 drafts from 4.18 s to 3.39 s, where they cost 3.2 s.) Also (e) with two
        shorter positive lengths measured here, the line through the least of the shortest and
        of the longest of them, extended to ``length``: each further draft adds a draft step
        and a request's row to the verify and to the draft extend, and a row costs no less as
        rows grow (kernels turn compute bound), so beyond the first draft (which alone brings
        the drafter's fixed costs) a round's cost grows at least linearly with its length. At
        batch 16 the cross-bucket bounds put 4 and 8 drafts at 1.3 s and 2.3 s where they cost
        2.6 s and 4.4 s (eighth goodput run); 1 and 2 drafts there cost 0.95 s and 1.41 s
        (eleventh run), a line through 2.3 s and 4.1 s."""
        bounds = [v for v in (self.least(bucket, l) for l in range(length + 1)) if v is not None]
        shorter = [l for l in range(1, length) if self.least(bucket, l) is not None]
        if len(shorter) >= 2:
            low, high = shorter[0], shorter[-1]
            slope = (self.least(bucket, high) - self.least(bucket, low)) / (high - low)
            bounds.append(self.least(bucket, high) + (length - high) * max(slope, 0.0))
        plain_here = self.least(bucket, 0)
        if plain_here is not None and length > 0:
            smaller = [b for (b, l) in self.samples if l == length and b < bucket
                       and self.least(b, length) is not None and self.least(b, 0)]
            if smaller:
                b = max(smaller)
                plain_there = self.least(b, 0)
                rows = lambda l: self.least(b, l) + (l + 1) * max(plain_here - plain_there, 0.0)
                scaled = lambda l: self.least(b, l) * plain_here / plain_there
                # Shorter lengths measured at both buckets that cost less here than a rule says
                # show by how much it overstates here: it is scaled down by the least ratio.
                checks = [l for l in shorter if self.least(b, l) is not None]
                for rule in (rows, scaled):
                    ratio = min([1.0, *(self.least(bucket, l) / rule(l) for l in checks)])
                    bounds.append(rule(length) * ratio)
        if not bounds:
            return None
        # A round measured once here may be a cold one, but it was not cheaper than a steady
        # one: at batch 16 one 8-draft round took 3.2 s where the bounds from batch 4 said at
        # least 4.3 s, and 8 drafts (42 tok/s against 32 for 1) waited 21 rounds to be tried again.
        once = self.samples.get((bucket, length), [])
        return min(max(bounds), min(once)) if once else max(bounds)

    def estimate(self, bucket: int, length: int) -> float | None:
        """Seconds of a round of ``length`` at ``bucket``: measured, else linear between the
        nearest measured positive lengths (extrapolated from the two nearest), else None; at
        most what a longer length measured here (a round does all a shorter one does, and
        more: on the 2-core Xeon two slow rounds put 3 drafts at batch 4 at 1.25 s beside 0.82 s
        for 4, and 3 was not tried again for 64 rounds)."""
        own = self._own_estimate(bucket, length)
        longer = [s for (b, l), s in self.seconds.items() if b == bucket and l > length]
        if own is None or not longer:
            return own
        return min(own, min(longer))

    def line(self, bucket: int, length: int) -> float | None:
        """Seconds of ``length`` at ``bucket`` on the lowest line through a positive length
        measured there below it and one above it (its own measurements left out); None without a
        measured length on both sides. The lowest, not the nearest: the neighbours may be stale
        too (4, 5 and 6 drafts all measured in slow rounds put each other in line). Plain
        decoding is not a point: the first draft brings the drafter's fixed costs, so a line
        from 0 puts 1 draft too low."""
        points = [(l, s) for (b, l), s in self.seconds.items() if b == bucket and l > 0 and l != length]
        lines = [s0 + (s1 - s0) * (length - l0) / (l1 - l0)
                 for l0, s0 in points if l0 < length for l1, s1 in points if l1 > length]
        return min(lines) if lines else None

    def _own_estimate(self, bucket: int, length: int) -> float | None:
        measured = self.measured(bucket, length)
        if measured is not None:
            return measured
        if length == 0:
            return None
        points = sorted((l, s) for (b, l), s in self.seconds.items() if b == bucket and l > 0)
        if len(points) < 2:
            return None
        below = [p for p in points if p[0] < length]
        above = [p for p in points if p[0] > length]
        if below and above:
            (l0, s0), (l1, s1) = below[-1], above[0]
        elif above:
            (l0, s0), (l1, s1) = above[0], above[1]
        else:
            (l0, s0), (l1, s1) = below[-2], below[-1]
        return max(s0 + (s1 - s0) * (length - l0) / (l1 - l0), 0.0)


@dataclass(frozen=True)
class DraftSetup:
    """What a round that drafts must pay once before its drafts (``sglang_hsd/adaptive.py``).

    Fields:
        seconds: the one-time cost that scales with what is owed (the server's catch-up rows),
            spread over the rounds drafting would serve (0: none).
        remaining_tokens: the mean number of tokens the batch's requests may still generate.
        fixed_seconds: the part paid again each time drafting resumes, however little is owed
            (a catch-up's pass over the draft model's weights): drafting that stops for a round
            and resumes pays it every time (on the 2-core Xeon, 0 and 2 drafts alternating at
            batch 4 on chat prompts: 82 catch-ups of 729 rows in all took 8.4 s, where the
            per-row price gives 4.4 s;
            ``benchmarks/results/loaded_rounds_xeon_sharegpt_t1_c4_cycle02.md``), so it is
            spread only over ``fixed_rounds``.
        fixed_rounds: the drafting rounds one catch-up has served on this server (at most the
            rounds the remaining tokens take; ``BudgetController`` sets it from its history,
            1 before any: charged whole to the round that resumes, so a length that only just
            beats plain decoding does not take over until drafting has shown it lasts). Charged
            whole always, a batch that went plain on chat prompts at c = 4 stayed plain for 50
            rounds while 2 drafts were 13% faster: the 45 ms pass cost 7% of a round and the
            rows it owed grew with every plain round.
    """

    seconds: float = 0.0
    remaining_tokens: float = math.inf
    fixed_seconds: float = 0.0
    fixed_rounds: float = 1.0

    def __post_init__(self) -> None:
        if not self.seconds >= 0.0:
            raise ValueError(f"seconds must be >= 0, got {self.seconds}")
        if not self.remaining_tokens > 0.0:
            raise ValueError(f"remaining_tokens must be > 0, got {self.remaining_tokens}")
        if not self.fixed_seconds >= 0.0:
            raise ValueError(f"fixed_seconds must be >= 0, got {self.fixed_seconds}")
        if not self.fixed_rounds >= 1.0:
            raise ValueError(f"fixed_rounds must be >= 1, got {self.fixed_rounds}")

    @property
    def total_seconds(self) -> float:
        """All it costs, what a probe that loses wastes."""
        return self.seconds + self.fixed_seconds

    def share(self, rates: Sequence[float], length: int) -> float:
        """The seconds one round of ``length`` drafts carries: ``seconds`` over the rounds of
        that length the remaining tokens take (at least one), ``fixed_seconds`` over at most
        ``fixed_rounds`` of them."""
        if length <= 0 or self.total_seconds == 0.0:
            return 0.0
        per_round = sum(expected_tokens(r, length) for r in rates) / len(rates)
        rounds = max(self.remaining_tokens / per_round, 1.0)
        return self.fixed_seconds / min(self.fixed_rounds, rounds) + self.seconds / rounds


NO_SETUP = DraftSetup()


@dataclass
class SetupHistory:
    """How many drafting rounds a paid :class:`DraftSetup` has served, per batch bucket: what a
    setup's fixed part is spread over (``DraftSetup.fixed_rounds``)."""

    counts: dict[int, list[int]] = field(default_factory=dict)  # bucket -> [drafting rounds, setups paid]

    def observe(self, bucket: int, length: int, setup: DraftSetup) -> None:
        """A round of ``length`` was chosen at ``bucket`` owing ``setup``."""
        if length > 0:
            counts = self.counts.setdefault(bucket, [0, 0])
            counts[0] += 1
            counts[1] += setup.total_seconds > 0.0

    def rounds_per_setup(self, bucket: int) -> float:
        """Drafting rounds per paid setup at ``bucket``, counting one more of each (1 before any:
        the fixed part is charged whole until drafting has shown that it lasts)."""
        drafted, paid = self.counts.get(bucket, (0, 0))
        return (drafted + 1) / (paid + 1)

    def spread(self, bucket: int, setup: DraftSetup) -> DraftSetup:
        """``setup`` with its fixed part spread over this bucket's rounds per setup."""
        if setup.fixed_seconds == 0.0:
            return setup
        return dataclasses.replace(setup, fixed_rounds=self.rounds_per_setup(bucket))

    def as_dict(self) -> dict[str, float]:
        return {str(b): round(self.rounds_per_setup(b), 2) for b in sorted(self.counts)}
