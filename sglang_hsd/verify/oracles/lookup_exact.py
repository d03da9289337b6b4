"""Exact law of the three-level lookup hierarchy: ``lookup`` drafts, a middle model verifies, the target verifies.

The runtime's round (``runtime/engine.py`` with levels ``lookup:<n>,model:<m>,target``), written
out over every outcome in float64:

* the middle level fills its buffer: while it holds fewer than N_1 tokens, the lookup copies up to
  N_d tokens after the latest earlier occurrence of the context's suffix
  (``sglang_hsd.lookup_draft.lookup_continuation``, the runtime's own function; the context is the
  prompt, the committed tokens and the buffer), and the middle verifies that copy with its chain rule
  against one-hot q rows (an empty copy: the middle samples one token from its own row); the
  accepted copies and the middle's next token join the buffer, each with the middle's row at its
  position;
* the target verifies the buffer with its chain rule, q being those middle rows, and commits the
  accepted tokens plus its own next one.

The world's ``draft`` table is the middle model's distribution and ``target`` the target's; rows
are indexed by the generated tokens (the prompt is fixed). ``middle_q="one-hot"`` is the plausible
slip this module exists to catch: the buffer hands a copied token up with the lookup's one-hot row
as its q (it *was* drafted deterministically) instead of the middle's row, which the token actually
follows after the middle's verification.
"""

from __future__ import annotations

import numpy as np
import torch

from sglang_hsd.lookup_draft import lookup_continuation
from sglang_hsd.verify.oracles.exact import OUTCOME_LAWS, TabularWorld, target_prefix_distribution, total_variation

MIDDLE_Q = ("middle", "one-hot")

# One buffered token: (token, came from an accepted copy).
Buffered = tuple[tuple[int, bool], ...]


def _copy(prompt: tuple[int, ...], generated: tuple[int, ...], ngram: int, num_draft: int) -> tuple[int, ...]:
    context = torch.tensor(prompt + generated, dtype=torch.long)
    return tuple(int(t) for t in lookup_continuation(context, ngram, num_draft))


def _one_hot(token: int, vocab: int) -> np.ndarray:
    row = np.zeros(vocab)
    row[token] = 1.0
    return row


def middle_buffer_law(world: TabularWorld, prompt: tuple[int, ...], committed: tuple[int, ...], ngram: int,
                      num_draft: int, buffer: int, method: str) -> dict[Buffered, float]:
    """Law of the middle level's buffer once it holds >= ``buffer`` tokens, from ``committed``."""
    law = OUTCOME_LAWS[method]
    done: dict[Buffered, float] = {}
    frontier: dict[Buffered, float] = {(): 1.0}
    while frontier:
        grown: dict[Buffered, float] = {}
        for buf, mass in frontier.items():
            context = committed + tuple(t for t, _ in buf)
            copy = _copy(prompt, context, ngram, num_draft)
            if copy:
                p_rows = np.stack([world.q(context + copy[:t]) for t in range(len(copy) + 1)])
                q_rows = np.stack([_one_hot(t, world.vocab_size) for t in copy])
                outcomes = law(p_rows, q_rows, copy)
            else:
                row = world.q(context)
                outcomes = {(0, int(t)): float(row[t]) for t in np.nonzero(row)[0]}
            for (n, token), prob in outcomes.items():
                new = buf + tuple((t, True) for t in copy[:n]) + ((token, False),)
                bucket = done if len(new) >= buffer else grown
                bucket[new] = bucket.get(new, 0.0) + mass * prob
        frontier = grown
    return done


def lookup_prefix_distribution(world: TabularWorld, prompt: tuple[int, ...], ngram: int, num_draft: int,
                               buffer: int, length: int, middle_method: str = "hsd", top_method: str = "hsd",
                               middle_q: str = "middle") -> dict[tuple[int, ...], float]:
    """Exact law of the first ``length`` committed tokens over as many target rounds as it takes.

    Args:
        prompt: the fixed tokens before the generated ones (what the lookup searches too).
        ngram, num_draft: the lookup level (longest n-gram, N_d).
        buffer: the middle level's N_1.
        middle_method, top_method: chain rules (keys of ``OUTCOME_LAWS``).
        middle_q: ``"middle"`` (the runtime's rule) or ``"one-hot"`` (the slip; module docstring).
    """
    if middle_q not in MIDDLE_Q:
        raise ValueError(f"middle_q must be one of {MIDDLE_Q}, got {middle_q!r}")
    law = OUTCOME_LAWS[top_method]
    done: dict[tuple[int, ...], float] = {}
    frontier: dict[tuple[int, ...], float] = {(): 1.0}
    while frontier:
        grown: dict[tuple[int, ...], float] = {}
        for committed, mass in frontier.items():
            buffers = middle_buffer_law(world, prompt, committed, ngram, num_draft, buffer, middle_method)
            for buf, buf_prob in buffers.items():
                tokens = tuple(t for t, _ in buf)
                contexts = [committed + tokens[:j] for j in range(len(tokens) + 1)]
                q_rows = np.stack([
                    _one_hot(t, world.vocab_size) if copied and middle_q == "one-hot" else world.q(contexts[j])
                    for j, (t, copied) in enumerate(buf)])
                p_rows = np.stack([world.p(c) for c in contexts])
                for (n, token), prob in law(p_rows, q_rows, tokens).items():
                    extended = (committed + tokens[:n] + (token,))[:length]
                    bucket = done if len(extended) == length else grown
                    bucket[extended] = bucket.get(extended, 0.0) + mass * buf_prob * prob
        frontier = grown
    return done


def lookup_prefix_tv(world: TabularWorld, prompt: tuple[int, ...], ngram: int, num_draft: int, buffer: int,
                     length: int, middle_method: str = "hsd", top_method: str = "hsd",
                     middle_q: str = "middle") -> float:
    """TV between ``lookup_prefix_distribution`` and the target's law of ``length`` tokens."""
    return total_variation(
        lookup_prefix_distribution(world, prompt, ngram, num_draft, buffer, length, middle_method, top_method,
                                   middle_q),
        target_prefix_distribution(world, length))
