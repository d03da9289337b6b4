"""The tests' reference for penalties: plain decoding's penalised logits, written token by token.

Independent of ``sglang_hsd.penalties`` (which is vectorised and sparse): each test that checks
per-path penalties (exact enumeration, the verify hooks, the servers' greedy text) compares with
this one function.
"""

from __future__ import annotations

import numpy as np


def penalised_logits(logits, output, *, frequency: float = 0.0, presence: float = 0.0,
                     repetition: float = 1.0, min_new_tokens: int = 0, stop_tokens=()) -> np.ndarray:
    """The logits plain decoding samples from after ``output`` (the tokens generated so far).

    Frequency subtracts ``frequency`` per occurrence and presence ``presence`` once per seen
    token; the stop tokens are forbidden while the output is shorter than ``min_new_tokens``; then
    a seen token's logit is divided by ``repetition`` when positive and multiplied when negative.

    Args:
        logits: float numpy [V], the model's raw next-token logits.
        output: the generated token ids so far (the prompt is not penalised).
    Returns:
        float64 numpy [V].
    """
    out = np.array(logits, dtype=np.float64)
    output = list(output)
    for token in set(output):
        out[token] -= frequency * output.count(token) + presence
    if len(output) < min_new_tokens:
        out[list(stop_tokens)] = -np.inf
    for token in set(output):
        out[token] = out[token] * repetition if out[token] < 0 else out[token] / repetition
    return out
