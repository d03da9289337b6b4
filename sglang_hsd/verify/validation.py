"""Input checks shared by every verifier.

Verifiers never clamp or renormalise their inputs: a probability row that is NaN, negative or
does not sum to one, or a drafted token its drafter gave probability zero, is a bug upstream
(a sampler that forgot a temperature, a vocabulary mismatch, ...) and silently "fixing" it would
bias the output distribution. These checks synchronise with the device, so callers on a hot path
validate once per configuration and then pass ``validate=False``.
"""

from __future__ import annotations

import torch

# float32 sums over a 150k-token vocabulary drift by ~1e-5; a real normalisation bug (a missing
# softmax, a dropped top-p renormalisation) is off by far more than 1e-3.
PROB_SUM_ATOL = 1e-3


def check_prob_rows(name: str, probs: torch.Tensor) -> None:
    """Raise ``ValueError`` naming ``name`` unless every row of ``probs`` [..., V] is a distribution."""
    if not torch.is_floating_point(probs):
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {probs.dtype}")
    if probs.numel() == 0:
        return
    if not bool(torch.isfinite(probs).all()):
        raise ValueError(f"{name} contains NaN or infinite values")
    if bool((probs < 0).any()):
        raise ValueError(f"{name} contains negative probabilities (min {probs.min().item():.3g})")
    row_sums = probs.sum(dim=-1, dtype=torch.float64)
    worst = (row_sums - 1.0).abs().max().item()
    if worst > PROB_SUM_ATOL:
        raise ValueError(
            f"{name} rows must sum to 1 (tolerance {PROB_SUM_ATOL}); worst row is off by {worst:.3g}"
        )


def check_token_ids(name: str, tokens: torch.Tensor, vocab_size: int) -> None:
    """Raise unless ``tokens`` is an integer tensor with values in [0, vocab_size)."""
    if tokens.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"{name} must be int64 (or int32), got dtype {tokens.dtype}")
    if tokens.numel() and bool(((tokens < 0) | (tokens >= vocab_size)).any()):
        raise ValueError(
            f"{name} has token ids outside [0, {vocab_size}) "
            f"(min {int(tokens.min())}, max {int(tokens.max())})"
        )


def check_drafted_tokens_have_mass(
    draft_tokens: torch.Tensor, draft_token_probs: torch.Tensor, name: str = "draft_probs"
) -> None:
    """Raise unless the drafter gave each drafted token positive probability.

    A drafted token with q = 0 cannot have been sampled from q: the ratio p/q is undefined and the
    verification math no longer describes what happened.
    """
    bad = draft_token_probs <= 0
    if bool(bad.any()):
        where = bad.nonzero()[0].tolist()
        raise ValueError(
            f"{name} gives probability 0 to a drafted token (first at index {where}, "
            f"token {int(draft_tokens[tuple(where)])}); drafts must be sampled from the q passed in"
        )


def check_uniforms(name: str, uniforms: torch.Tensor, shape: tuple[int, ...]) -> None:
    """Raise unless ``uniforms`` has ``shape`` and values in [0, 1)."""
    if tuple(uniforms.shape) != shape:
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(uniforms.shape)}")
    if not torch.is_floating_point(uniforms):
        raise ValueError(f"{name} must be floating point, got {uniforms.dtype}")
    if uniforms.numel() and bool(((uniforms < 0) | (uniforms >= 1)).any()):
        raise ValueError(f"{name} must lie in [0, 1)")
