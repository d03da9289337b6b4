"""Prompt-lookup drafts: the continuation of the latest earlier occurrence of the last n tokens.

A ``lookup`` level (``sglang_hsd.levels``) drafts without a network: code and chat answers re-type
spans of their prompt and of what they wrote before (names, signatures, quoted text), so the tokens
that followed the last earlier occurrence of the current suffix are a cheap guess at what comes
next. The guess is a deterministic function of the context, so its proposal distribution is
one-hot at each drafted token, and any lossless chain rule that verifies it against the level above
(with that one-hot q) keeps the level above's law.

The n-gram tried first is the longest (``max_ngram``); shorter ones are tried while none matches,
down to one token. Among matches the latest wins (recent text predicts best); a match needs at
least one token after it. Nothing matches: the draft is empty, and the level above then samples
its own token (``runtime/engine.py``).
"""

from __future__ import annotations

import torch

__all__ = ["lookup_continuation"]


def lookup_continuation(context: torch.Tensor, max_ngram: int, max_tokens: int) -> torch.Tensor:
    """The draft for one request.

    Args:
        context: int64 [L], the request's tokens so far (prompt, committed and provisional ones).
        max_ngram: the longest suffix matched (>= 1).
        max_tokens: the most tokens drafted (>= 1).

    Returns:
        int64 [m], 0 <= m <= max_tokens: the tokens after the latest earlier occurrence of the
        longest suffix (n <= max_ngram) that occurs earlier; empty when none does.
    """
    if max_ngram < 1 or max_tokens < 1:
        raise ValueError(f"max_ngram and max_tokens must be >= 1, got {max_ngram}, {max_tokens}")
    length = context.shape[0]
    for n in range(min(max_ngram, length - 1), 0, -1):
        # windows[i] = context[i : i + n] for the starts i whose match leaves a token after it
        # and is not the suffix itself: i + n < length.
        windows = context[: length - 1].unfold(0, n, 1)
        hits = (windows == context[length - n:]).all(dim=-1).nonzero()
        if hits.numel():
            start = int(hits[-1]) + n
            return context[start: start + max_tokens].clone()
    return context.new_empty(0)
