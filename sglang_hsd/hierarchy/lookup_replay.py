"""Replay rounds whose bottom level is a prompt lookup, over recorded target continuations.

Two shapes (``docs/hierarchy.md``, "A lookup drafter below a small model"):

* ``lookup:n,target`` (``LookupShape(copies=K)``): each round the lookup copies up to K tokens
  from earlier text and the target verifies them in one call of c + 1 rows (its own token from the
  last round, then the c copies); a round whose lookup finds nothing is a plain decoding step.
* ``lookup:n,model:D,target`` (``LookupShape(copies=N_d, model_buffer=N_1)``): sub-rounds fill the
  small model's buffer: the lookup copies up to N_d tokens, the small model verifies them in one
  call (the tokens it has not seen, then the copies) and appends the copies it accepts plus its
  own next token; once the buffer holds N_1 tokens (or more: the last sub-round may overshoot) the
  target verifies it in one call of buffer + 1 rows.

The records (``lookup_record.LookupRecord``, in ``AcceptanceRecord.lookup``) hold, for each start s
along the target's continuation, the copy the lookup makes there, with the target's and the
drafter's probability of each copied token at its position.

Greedy requests: exact for the accepted tokens and the target's rounds. Along the target's greedy
path every provisional token that matches it leaves the context on the record's path, so the target
accepts a copy up to the first copied token that differs from its own, and the small model accepts
a copied token that is its argmax there. Past the first provisional token the target will reject,
the small model and the lookup see text the record does not hold: the sub-rounds that finish
filling the buffer are priced as single-row small-model steps without copies (cost only, as
``replay.py`` prices an adaptive chain's stops past a rejection).

Sampled requests: an approximation, with every probability read along the recorded path and each
test independent. The target accepts a copied token x with p(x) (the copy's q is one-hot; the
token-wise rule); the small model accepts it with q(x); the target accepts a token the small model
kept from a copy with min(1, p(x) / q(x)) and one it drew itself with alpha = 1 - TV(p, q).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sglang_hsd.hierarchy.replay import AcceptanceRecord, ReplayStats, ReplayTotals, leading_passes, replay_records

__all__ = ["LookupShape", "replay_lookup"]


@dataclass(frozen=True)
class LookupShape:
    """A round with a lookup at the bottom.

    Fields:
        ngram: the longest n-gram the lookup matches (``lookup:<n>``).
        copies: the lookup's buffer: at most this many tokens copied per lookup (N_d, or K).
        model_buffer: the small model's buffer N_1 (``lookup:n,model:D,target``); None: the
            target verifies the copies itself (``lookup:n,target``).
    """

    ngram: int
    copies: int
    model_buffer: int | None = None

    def __post_init__(self) -> None:
        if self.ngram < 1 or self.copies < 1:
            raise ValueError(f"lookup ngram and copies must be >= 1, got {self.ngram}, {self.copies}")
        if self.model_buffer is not None and self.model_buffer < 1:
            raise ValueError(f"lookup model_buffer must be >= 1, got {self.model_buffer}")

    @property
    def uses_model(self) -> bool:
        return self.model_buffer is not None

    @property
    def longest(self) -> int:
        """Positions past a round's start the replay reads: the buffer's overshoot plus one copy."""
        return self.copies + (self.model_buffer or 0)

    @property
    def label(self) -> str:
        if self.model_buffer is None:
            return f"lookup:{self.ngram} {self.copies} -> target"
        return f"lookup:{self.ngram} {self.copies} -> model {self.model_buffer}"

    @classmethod
    def parse(cls, text: str, name: str = "lookup candidate") -> LookupShape:
        """``n:K`` (lookup -> target) or ``n:N_d:N_1`` (lookup -> model -> target)."""
        try:
            parts = [int(x) for x in text.split(":")]
        except ValueError:
            parts = []
        if len(parts) not in (2, 3) or min(parts) < 1:
            raise ValueError(f"{name} must be <ngram>:<copies> or <ngram>:<copies>:<model buffer> with every "
                             f"number >= 1, got {text!r}")
        return cls(parts[0], parts[1], parts[2] if len(parts) == 3 else None)


def replay_lookup(records: list[AcceptanceRecord], new_tokens: int, shape: LookupShape, samples: int = 32,
                  seed: int = 0) -> ReplayStats:
    """``shape``'s rounds until each record has emitted ``new_tokens`` tokens (module docstring).

    ``records`` need their ``lookup`` part (``record_acceptance(..., lookup=...)``), recorded
    with the shape's n-gram and at least its copies. Drafter calls are the small model's, counted
    by rows; ``drafted`` counts its draws (one per sub-round); ``lookups`` the lookups.
    """
    for record in records:
        found = record.lookup
        if found is None or found.ngram != shape.ngram or found.max_copies < shape.copies:
            raise ValueError(f"records need lookup copies of n-gram {shape.ngram} and up to {shape.copies} tokens, "
                             f"got {None if found is None else (found.ngram, found.max_copies)}")
    replay_one = _three_levels if shape.uses_model else _lookup_to_target
    return replay_records(records, new_tokens, shape.longest, shape.label,
                          lambda record, tokens, rng, totals: replay_one(record, tokens, shape, rng, totals),
                          samples, seed)


def _lookup_to_target(record: AcceptanceRecord, new_tokens: int, shape: LookupShape, rng, totals: ReplayTotals) -> None:
    found, t = record.lookup, 0
    while t < new_tokens:
        count = min(int(found.copy_len[t]), shape.copies)
        accepted = leading_passes(rng, found.copy_p[t, :count])
        totals.lookups += 1
        totals.call(totals.target_calls, count + 1)
        t = totals.emit(accepted, t, new_tokens)


def _three_levels(record: AcceptanceRecord, new_tokens: int, shape: LookupShape, rng, totals: ReplayTotals) -> None:
    found, t, unseen = record.lookup, 0, 1
    while t < new_tokens:
        # unseen: tokens the small model has not run before this round's first copies (the target's
        # token, and after a whole buffer was accepted also the buffer's last token).
        buffered, rejected_at = 0, None
        while buffered < shape.model_buffer:
            start = t + buffered
            totals.lookups += 1
            totals.drafted += 1
            if rejected_at is not None:  # off the recorded path: priced as a step without copies
                totals.call(totals.drafter_calls, unseen)
                buffered, unseen = buffered + 1, 1
                continue
            count = min(int(found.copy_len[start]), shape.copies)
            kept = leading_passes(rng, found.copy_q[start, :count])
            totals.call(totals.drafter_calls, unseen + count)
            q_kept = found.copy_q[start, :kept]
            ratio = np.divide(found.copy_p[start, :kept], q_kept, out=np.ones(kept), where=q_kept > 0)
            target_kept = leading_passes(rng, np.minimum(ratio, 1.0))
            if target_kept < kept:
                rejected_at = buffered + target_kept
            elif not rng.random() < record.alpha[start + kept]:
                rejected_at = buffered + kept
            buffered, unseen = buffered + kept + 1, 1
        accepted = buffered if rejected_at is None else rejected_at
        totals.call(totals.target_calls, buffered + 1)
        t = totals.emit(accepted, t, new_tokens)
        unseen = 2 if accepted == buffered else 1
