"""Replay rounds with an exit of the target between the drafter and the target.

The shape ``model:D,exit:L,target`` (``MiddleShape(layer=L, draft=N_d, buffer=N_1)``), as the
runtime runs it with KV reuse (``runtime/engine.py``, ``docs/hierarchy.md``): sub-rounds fill the
exit's buffer. In each, the drafter drafts N_d tokens (its first call on the tokens it has not
seen, then one row per token), the exit verifies them in one call of N_d + 1 rows (the target's
first L layers and the exit head) and appends the drafts it accepts plus its own next token
(correction or bonus). Once the buffer holds N_1 tokens or more (the last sub-round may overshoot by
up to N_d), the target verifies it in one call: its layers [L, N) on buffer + 1 rows and layers
[0, L) on the one row no level has processed (the exit's last token).

The records (``middle_record.MiddleRecord``, in ``AcceptanceRecord.middles``) hold, at each
position of the target's continuation, how likely the exit accepts the drafter's token and how
likely the target accepts the exit's.

Greedy requests: exact for the accepted tokens and the target's rounds. Each provisional token the
exit emits at position i is its own argmax there (an accepted draft equals it; a correction is it),
so along the target's greedy path the target accepts the buffer up to the first position where the
exit's argmax is not the target's token: the drafter changes how many sub-rounds a fill takes,
never what the target accepts. Past that position the levels see text the record does not hold;
the sub-rounds that finish the buffer are priced from the record's numbers at their positions
(cost only, as ``lookup_replay.py`` prices its sub-rounds past a rejection).

Sampled requests: an approximation with every test independent: the exit accepts the drafter's
token at i with 1 - TV(q_i, e_i) (token-wise; ``hsd`` accepts at least as much) and the target
accepts a buffered token with 1 - TV(e_i, p_i) (a token the exit verified is distributed as e_i).
"""

from __future__ import annotations

from dataclasses import dataclass

from sglang_hsd.hierarchy.replay import AcceptanceRecord, ReplayStats, ReplayTotals, leading_passes, replay_records

__all__ = ["MiddleShape", "replay_middle"]


@dataclass(frozen=True)
class MiddleShape:
    """A round with the target's exit at ``layer`` between a separate drafter and the target.

    Fields:
        layer: the exit layer L (1 <= L < the target's depth).
        draft: the drafter's buffer N_d (drafts per sub-round).
        buffer: the exit's buffer N_1 (tokens it gathers before the target verifies).
    """

    layer: int
    draft: int
    buffer: int

    def __post_init__(self) -> None:
        if min(self.layer, self.draft, self.buffer) < 1:
            raise ValueError(f"middle layer, draft and buffer must be >= 1, got {self.layer}, {self.draft}, "
                             f"{self.buffer}")

    @property
    def longest(self) -> int:
        """Positions past a round's start the replay reads: the buffer's overshoot and one more."""
        return self.buffer + self.draft + 1

    @property
    def label(self) -> str:
        return f"model {self.draft} -> exit:{self.layer} {self.buffer} -> target"

    @classmethod
    def parse(cls, text: str, name: str = "middle candidate") -> MiddleShape:
        """``L:N_d:N_1``."""
        try:
            parts = [int(x) for x in text.split(":")]
        except ValueError:
            parts = []
        if len(parts) != 3 or min(parts) < 1:
            raise ValueError(f"{name} must be <exit layer>:<drafts>:<exit buffer> with every number >= 1, "
                             f"got {text!r}")
        return cls(*parts)


def replay_middle(records: list[AcceptanceRecord], new_tokens: int, shape: MiddleShape, samples: int = 32,
                  seed: int = 0) -> ReplayStats:
    """``shape``'s rounds until each record has emitted ``new_tokens`` tokens (module docstring).

    ``records`` need a ``middles`` entry for ``shape.layer`` (``record_acceptance(...,
    middle_layers=...)``). Drafter calls are the drafter's, by rows; ``middle_calls`` the exit's;
    ``target_calls`` the target's (layers above the exit); ``drafted`` the drafter's draws.
    """
    for record in records:
        if record.middle(shape.layer) is None:
            raise ValueError(f"records need the exit at layer {shape.layer} (recorded: "
                             f"{[m.layer for m in record.middles]})")
    return replay_records(records, new_tokens, shape.longest, shape.label,
                          lambda record, tokens, rng, totals: _rounds(record, tokens, shape, rng, totals),
                          samples, seed)


def _rounds(record: AcceptanceRecord, new_tokens: int, shape: MiddleShape, rng, totals: ReplayTotals) -> None:
    middle = record.middle(shape.layer)
    t, unseen = 0, 1
    while t < new_tokens:
        # unseen: rows of the drafter's first call (its last token if the exit corrected it, plus the
        # exit's bonus token after a sub-round that accepted every draft).
        buffered, rejected_at = 0, None
        while buffered < shape.buffer:
            start = t + buffered
            kept = leading_passes(rng, middle.draft_pass[start : start + shape.draft])
            totals.call(totals.drafter_calls, unseen)
            if shape.draft > 1:
                totals.call(totals.drafter_calls, 1, shape.draft - 1)
            totals.drafted += shape.draft
            totals.call(totals.middle_calls, shape.draft + 1)
            if rejected_at is None:
                passed = leading_passes(rng, middle.target_pass[start : start + kept + 1])
                if passed <= kept:
                    rejected_at = buffered + passed
            buffered += kept + 1
            unseen = 2 if kept == shape.draft else 1
        accepted = buffered if rejected_at is None else rejected_at
        totals.call(totals.target_calls, buffered + 1)
        t = totals.emit(accepted, t, new_tokens)
        unseen = 2 if accepted == buffered else 1
