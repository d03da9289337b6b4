"""Monte-Carlo reference of the runtime's hierarchy in the i.i.d.-acceptance model.

A literal transcription of ``engine._Run`` (``_fill`` / ``_verify``) with coin flips instead of
models: the closed forms of ``latency.py`` are checked against it.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from sglang_hsd.hierarchy.latency import CostModel


def simulate_hierarchy(
    levels: Sequence[int],
    buffers: Sequence[int],
    alphas: Sequence[float],
    costs: CostModel,
    target_rounds: int,
    seed: int = 0,
) -> tuple[float, float]:
    """Run ``target_rounds`` target verifications.

    Returns:
        (mean cost per emitted token, mean tokens per target round).
    """
    rng = np.random.default_rng(seed)
    top = len(levels) - 1
    spent = 0.0

    def verify(k: int, draft_len: int) -> int:
        nonlocal spent
        spent += costs.verify(levels[k - 1], levels[k], draft_len)
        accepted = 0
        while accepted < draft_len and rng.random() < alphas[k - 1]:
            accepted += 1
        return accepted + 1  # accepted prefix + corrected/bonus token

    def fill(k: int) -> int:
        nonlocal spent
        if k == 0:
            spent += buffers[0] * costs.draft_step(levels[0])
            return buffers[0]
        held = 0
        while held < buffers[k]:
            held += verify(k, fill(k - 1))
        return held

    tokens = 0
    for _ in range(target_rounds):
        tokens += verify(top, fill(top - 1))
    return spent / tokens, tokens / target_rounds
