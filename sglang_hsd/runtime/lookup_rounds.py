"""The engine's pieces for a ``lookup`` drafter (``runtime/engine.py``): its draft, and the
verification of drafts that may be empty.

A lookup (``sglang_hsd/lookup_draft.py``) copies up to N_d tokens per request, with one-hot rows
as their q, and may find nothing; the level above then has no draft to verify for that request and
samples its one token from its own row. Both work on the engine's ``_Run`` state (``tokens``,
``seq_len``, ``buf_start``, ``buf_probs``, ``caps``, ``stats``).
"""

from __future__ import annotations

import time

import torch

from sglang_hsd.lookup_draft import lookup_continuation
from sglang_hsd.verify import verify_chain

__all__ = ["lookup_draft", "verify_rows"]


def lookup_draft(run, rows: torch.Tensor) -> None:
    """Level 0 of ``run`` copies up to N_d tokens per row of ``rows`` (bool [B]) after the latest
    earlier occurrence of the row's suffix (``lookup_continuation``), q one-hot; a row may get
    none."""
    start_time = time.perf_counter()
    level, stats = run.levels[0], run.stats[0]
    for row in rows.nonzero().squeeze(-1).tolist():
        end = int(run.seq_len[row])
        offset = end - int(run.buf_start[0][row])
        room = run.caps[0] - offset
        if room <= 0:
            continue
        copied = lookup_continuation(run.tokens[row, :end], level.ngram, room)
        count = copied.numel()
        stats.drafts += 1  # a lookup is one drafting step, whatever it finds
        stats.rounds += 1
        stats.proposed += count
        if count == 0:
            continue
        run.tokens[row, end:end + count] = copied
        one_hot = run.buf_probs[0][row, offset:offset + count]
        one_hot.zero_()
        one_hot.scatter_(-1, copied.unsqueeze(-1), 1.0)
        run.seq_len[row] = end + count
    stats.seconds += time.perf_counter() - start_time


def verify_rows(run, k: int, idx, start, draft_len, width: int, p) -> tuple[torch.Tensor, torch.Tensor]:
    """Level k's chain rule on the drafts of rows ``idx`` (ragged: ``draft_len`` [R], at most
    ``width``; p [R, width + 1, V]). Returns (accepted drafts [R], the token after them [R]).
    A row with an empty draft (a lookup that found nothing) samples its token from p's first row:
    verifying nothing keeps nothing of the level below and draws from the level's own law."""
    empty = draft_len == 0
    if not bool(empty.any()):
        return _chain(run, k, idx, start, draft_len, width, p)
    accepted = torch.zeros_like(draft_len)
    emitted = torch.empty_like(draft_len)
    emitted[empty] = run._sample(p[empty, 0])
    drafted = (~empty).nonzero().squeeze(-1)
    if drafted.numel():
        accepted[drafted], emitted[drafted] = _chain(
            run, k, idx[drafted], start[drafted], draft_len[drafted], width, p[drafted])
    return accepted, emitted


def _chain(run, k, idx, start, draft_len, width, p) -> tuple[torch.Tensor, torch.Tensor]:
    """``verify_chain`` with level k's rule on rows ``idx`` (every draft non-empty)."""
    offsets = torch.arange(width, device=idx.device)
    draft_pos = (start.unsqueeze(-1) + offsets).clamp(max=run.max_len - 1)
    res = verify_chain(
        run.tokens[idx.unsqueeze(-1), draft_pos], run.buf_probs[k - 1][idx, :width], p,
        method=run.levels[k].method, generator=run.generator, validate=run.gen.validate,
        draft_lengths=draft_len,
    )
    return res.num_accepted, res.tokens.gather(1, res.num_accepted.unsqueeze(-1)).squeeze(-1)
