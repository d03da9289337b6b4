"""What a prompt lookup copies along a recorded target continuation (the round planner's records).

``lookup_replay.py`` replays rounds with a lookup at the bottom from these records; the lookup is
``sglang_hsd/lookup_draft.py``'s, so the copies are the ones the engine makes wherever the context
is the record's own.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from sglang_hsd.lookup_draft import lookup_continuation

__all__ = ["LookupRecord", "lookup_record"]


@dataclass(frozen=True)
class LookupRecord:
    """What a lookup copies along one prompt's continuation.

    Fields:
        ngram: the longest n-gram matched when recording.
        copy_len: int64 [P]; tokens copied at start s (at most the recorded maximum; cut where the
            record ends).
        copy_p: float64 [P, M]; the target's probability of copied token i at position s + i
            (0 past ``copy_len``).
        copy_q: float64 [P, M]; the drafter's, likewise.
    """

    ngram: int
    copy_len: np.ndarray
    copy_p: np.ndarray
    copy_q: np.ndarray

    @property
    def max_copies(self) -> int:
        return int(self.copy_p.shape[1])


def lookup_record(context: torch.Tensor, prompt_len: int, p: torch.Tensor, q: torch.Tensor, ngram: int,
                  max_copies: int) -> LookupRecord:
    """Record the copies of one prompt's continuation.

    Args:
        context: int64 [prompt_len + P], the prompt then the target's continuation.
        p, q: float [P, V], the target's and the drafter's distributions at the continuation's
            positions (position i predicts continuation token i).
        ngram, max_copies: the lookup's longest n-gram and its most copied tokens.
    """
    length = p.shape[0]
    if context.shape[0] != prompt_len + length or q.shape != p.shape:
        raise ValueError(f"context {tuple(context.shape)}, p {tuple(p.shape)} and q {tuple(q.shape)} disagree "
                         f"with prompt_len {prompt_len}")
    copy_len = np.zeros(length, dtype=np.int64)
    copy_p = np.zeros((length, max_copies))
    copy_q = np.zeros((length, max_copies))
    for start in range(length):
        copied = lookup_continuation(context[: prompt_len + start], ngram, max_copies)[: length - start]
        count = copied.numel()
        if count == 0:
            continue
        positions = torch.arange(start, start + count)
        copy_len[start] = count
        copy_p[start, :count] = p[positions, copied].double().numpy()
        copy_q[start, :count] = q[positions, copied].double().numpy()
    return LookupRecord(ngram, copy_len, copy_p, copy_q)
