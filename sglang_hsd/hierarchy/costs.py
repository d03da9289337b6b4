"""A ``CostModel`` for early-exit levels of one target, from measured per-layer timings.

What each runtime operation costs (``engine.py`` with KV reuse, ``groups.py``), for exits
L_lo < L_hi (the target's "exit" is its depth N):

* a drafter step at exit L: layers [0, L) on 1 token + exit head and ``logits_to_probs`` on 1
  position + one draw (inverse CDF, as the runtime samples);
* a verification by the level at L_hi of D tokens drafted at L_lo: layers [L_lo, L_hi) on D + 1
  positions (the buffer and the position before it), layers [0, L_lo) on 1 position (the last
  drafted token, which no level has processed yet), the head on D + 1 positions, and
  ``verify_chain`` on D drafts;
* an autoregressive step: layers [0, N) on 1 token + head on 1 position + one draw.

A forward of layers [lo, hi) on n tokens is modelled as ``call(n) + (hi - lo) * layer(n)``: layers
of one model cost the same, and each ``forward_layers`` call pays a fixed setup (rotary, masks,
one host sync). Times for token counts between the measured ones are interpolated linearly, and
extrapolated linearly from the last two beyond them (never downwards).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


def _interp(grid: tuple[int, ...], values: tuple[float, ...], n: int) -> float:
    x, y = np.asarray(grid, dtype=float), np.asarray(values, dtype=float)
    if n <= x[-1]:
        return float(np.interp(n, x, y))
    slope = max((y[-1] - y[-2]) / (x[-1] - x[-2]), 0.0)
    return float(y[-1] + slope * (n - x[-1]))


@dataclass(frozen=True)
class LayerCosts:
    """Measured costs, in seconds, of the pieces of an early-exit hierarchy over one target.

    Fields:
        exits: candidate exit layers, increasing; level id i < len(exits) is exit ``exits[i]``,
            id ``len(exits)`` is the target.
        num_layers: the target's depth N.
        token_counts: the n at which the per-n tables below were measured (increasing, from 1).
        layer_seconds: time of one decoder layer on n new tokens (KV cache of realistic length).
        call_seconds: fixed time of one ``forward_layers`` call on n tokens.
        head_seconds: exit head + ``logits_to_probs`` on n positions.
        verify_seconds: ``verify_chain`` on a chain of n drafts.
        sample_seconds: one draw over the vocabulary (``measure.draw_seconds``).
    """

    exits: tuple[int, ...]
    num_layers: int
    token_counts: tuple[int, ...]
    layer_seconds: tuple[float, ...]
    call_seconds: tuple[float, ...]
    head_seconds: tuple[float, ...]
    verify_seconds: tuple[float, ...]
    sample_seconds: float

    def depth(self, level: int) -> int:
        return self.exits[level] if level < len(self.exits) else self.num_layers

    def forward(self, lo: int, hi: int, tokens: int) -> float:
        """Layers [lo, hi) on ``tokens`` new positions, seconds (0 for an empty range)."""
        if hi <= lo:
            return 0.0
        grid = self.token_counts
        return _interp(grid, self.call_seconds, tokens) + (hi - lo) * _interp(grid, self.layer_seconds, tokens)

    def head(self, tokens: int) -> float:
        return _interp(self.token_counts, self.head_seconds, tokens)

    def draft_step(self, level: int) -> float:
        return self.forward(0, self.depth(level), 1) + self.head(1) + self.sample_seconds

    def verify(self, lower: int, upper: int, draft_len: int) -> float:
        lo, hi = self.depth(lower), self.depth(upper)
        return (
            self.forward(lo, hi, draft_len + 1)
            + self.forward(0, lo, 1)
            + self.head(draft_len + 1)
            + _interp(self.token_counts, self.verify_seconds, draft_len)
        )

    def autoregressive_step(self) -> float:
        return self.forward(0, self.num_layers, 1) + self.head(1) + self.sample_seconds

    def as_dict(self) -> dict:
        return asdict(self)
