"""A draft length that lost the lead to its own slower rounds is measured again soon.

The adaptive controller (``sglang_hsd/adaptive.py``) compares lengths by the medians of their
recent rounds (:class:`~sglang_hsd.adaptive_costs.RoundCosts`). The leading length runs every
round, so a burst of slow rounds (the machine busy for a while) fills its window and hands the
lead to a length whose samples are older, taken while the machine was calm; the displaced length
is then not run again until the controller's refresh, ``refresh_rounds`` later. On the 2-core Xeon
at concurrency 1 (HumanEval, T = 0, sixteenth goodput run) 8 drafts lost the lead to 4 for 46
rounds although over the whole run 8's rounds averaged 721 ms and 4's 504 ms: at 98% acceptance
8 was about 20% faster.

So when the lead changes and the old leader's median has risen more than ``drift`` above the
least median it showed while it led, a recheck is scheduled: after ``first_delay`` rounds at that
batch bucket the old leader runs again, its window restarted (its old samples dropped) so that
its next ``min_samples`` rounds alone make its estimate. If it still does not lead, it is
rechecked after twice the delay, and so on while the delay stays below ``last_delay`` (the
controller's refresh takes over from there). A recheck runs only while the length, at the cost it
showed while it led, would beat the current choice: a lead lost to the rates (requests accepting
fewer drafts) is not rechecked.

A length can also starve without ever leading: its few rounds ran while they were slow (the
first rounds at a length after a switch, a busy spell) and, its median too high, it is not chosen
again, so its samples never age out. On the 2-core AVX-512 EPYC at batch 1 (ShareGPT, T = 0,
twenty-eighth goodput run) 4 and 5 drafts kept medians of 636 and 724 ms while their later
steady rounds cost 408 and 385 ms, beside 360 ms for 3 and 554 ms for 8: the controller drafted 3
in most rounds. So a length whose median sits more than ``drift`` above the line through its
measured neighbours on either side (:meth:`RoundCosts.line`: a round's cost grows about
linearly with its drafts) is *out of line*; the controller rechecks it (``line=True``: its
window restarted, ``min_samples`` rounds) when, at the line's cost, it would beat the current
choice. A recheck that finds it out of line again waits ``first_delay`` rounds before the next,
then twice as long, and so on up to ``last_delay``.

Lossless as every choice of the controller: a recheck is decided from past rounds' timings only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sglang_hsd.adaptive_costs import RoundCosts

__all__ = ["Recheck", "Rechecks"]


@dataclass
class Recheck:
    """A scheduled recheck at one batch bucket.

    Fields:
        length: the displaced draft length.
        due_round: the bucket's round index from which it runs (inf: no more rechecks).
        delay: the rounds this recheck waited (the next one waits twice as long).
        baseline: the least median (seconds) the length showed while it led.
        fresh: rounds measured since its window restarted (the recheck ends at ``min_samples``).
        line: a recheck of a length out of line (``baseline``: the line's seconds), not of a
            displaced leader.
    """

    length: int
    due_round: float
    delay: int
    baseline: float
    fresh: int = 0
    line: bool = False


class Rechecks:
    """The leaders per batch bucket, their baselines and the pending rechecks (module docstring).

    Args:
        first_delay: rounds after the lead changes before the first recheck (>= 1).
        drift: relative rise of the old leader's median above its baseline that counts as its
            own rounds slowing down (>= 0).
        last_delay: rechecks stop once the delay reaches this (the controller's refresh).
    """

    def __init__(self, first_delay: int, drift: float, last_delay: int) -> None:
        self.first_delay = first_delay
        self.drift = drift
        self.last_delay = last_delay
        self.leaders: dict[int, int] = {}  # bucket -> the length the last choice ranked fastest
        self.baselines: dict[tuple[int, int], float] = {}  # (bucket, length) -> least median
        self.pending: dict[int, Recheck] = {}  # bucket -> its recheck
        self.rounds = 0  # recheck rounds run
        self.line_rounds = 0  # of them, rounds of rechecks of lengths out of line
        # (bucket, length) -> (the bucket's round from which it may be rechecked out of line
        # again, the delay the next wait will have)
        self.line_waits: dict[tuple[int, int], tuple[float, int]] = {}

    def lead(self, bucket: int, length: int, costs: RoundCosts, round_index: int) -> None:
        """The choice at ``bucket`` ranked ``length`` fastest before round ``round_index``."""
        previous = self.leaders.get(bucket)
        self.leaders[bucket] = length
        measured = costs.measured(bucket, length)
        if measured is not None:
            key = (bucket, length)
            self.baselines[key] = min(self.baselines.get(key, measured), measured)
        pending = self.pending.get(bucket)
        if pending is not None and pending.length == length and measured is not None:
            del self.pending[bucket]  # it leads again on its own fresh rounds
            pending = None
        if previous is None or previous == length or self.first_delay >= self.last_delay:
            return
        if pending is not None and pending.length == previous:
            return  # a recheck that just ended: its next one keeps its (doubled) delay
        was = costs.measured(bucket, previous)
        baseline = self.baselines.get((bucket, previous))
        if was is not None and baseline is not None and was > (1.0 + self.drift) * baseline:
            self.pending[bucket] = Recheck(previous, round_index + self.first_delay,
                                           self.first_delay, baseline)

    def out_of_line(self, bucket: int, costs: RoundCosts, round_index: int) -> dict[int, float]:
        """The lengths at ``bucket`` out of line now (module docstring) -> their line's seconds;
        lengths waiting after a recheck that found them out of line are left out, and none while
        another recheck is pending there."""
        if bucket in self.pending or self.first_delay >= self.last_delay:
            return {}
        out = {}
        for (b, length), seconds in costs.seconds.items():
            if b != bucket or length <= 0 or self.line_waits.get((b, length), (0, 0))[0] > round_index:
                continue
            line = costs.line(bucket, length)
            if line is not None and line > 0 and seconds > (1.0 + self.drift) * line:
                out[length] = line
        return out

    def start_line(self, bucket: int, length: int, line: float, round_index: int) -> None:
        """Recheck ``length``, out of line at ``bucket`` (its line at ``line`` seconds), from
        round ``round_index``."""
        delay = self.line_waits.get((bucket, length), (0, self.first_delay))[1]
        self.pending[bucket] = Recheck(length, round_index, delay, line, line=True)

    def due(self, bucket: int, round_index: int) -> Recheck | None:
        """The recheck due at ``bucket`` before round ``round_index``, None if none is."""
        pending = self.pending.get(bucket)
        return pending if pending is not None and round_index >= pending.due_round else None

    def observe(self, bucket: int, length: int, costs: RoundCosts, round_index: int) -> None:
        """Round ``round_index`` at ``bucket`` drafted ``length``; call before ``costs`` records
        it. A due recheck's first round restarts the length's window; its last one schedules the
        next recheck (cancelled if the length leads by then)."""
        pending = self.due(bucket, round_index)
        if pending is None or pending.length != length:
            return
        if pending.fresh == 0:
            costs.restart(bucket, length)
        pending.fresh += 1
        self.rounds += 1
        self.line_rounds += pending.line
        if pending.line and pending.fresh >= costs.min_samples:
            # Measured afresh; if it is still out of line, the next recheck waits longer.
            del self.pending[bucket]
            wait = round_index + 1 + pending.delay if pending.delay < self.last_delay else math.inf
            self.line_waits[(bucket, length)] = (wait, 2 * pending.delay)
        elif pending.fresh >= costs.min_samples:
            pending.delay *= 2
            pending.fresh = 0
            pending.due_round = round_index + 1 + pending.delay
            if pending.delay >= self.last_delay:
                # No more rechecks (the refresh takes over), but the entry stays until the
                # length leads again, so that losing the lead it took on interpolated costs
                # after this recheck's first round does not start a new series.
                pending.due_round = math.inf
