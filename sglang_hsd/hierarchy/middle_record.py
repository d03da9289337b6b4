"""An exit of the target between the drafter and the target, recorded along a target continuation.

``middle_replay.py`` replays rounds of ``model:D,exit:L,target`` from these records (one per exit
layer in ``AcceptanceRecord.middles``). Every number is read on the record's own context (the
target's continuation), where the drafter, the exit and the target all see the same prefix.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["MiddleRecord", "check_middle_layers", "middle_record"]


@dataclass(frozen=True)
class MiddleRecord:
    """The exit at ``layer`` against the drafter below it and the target above it.

    Position i predicts the continuation's token i (as ``AcceptanceRecord``).

    Fields:
        layer: the exit layer L (the target's first L layers and the exit head).
        draft_pass: float64 [P]; 1 - TV(q_i, e_i): the probability that the exit accepts the
            drafter's token (greedy rows are one-hot: 1.0 where the two argmaxes agree, else 0.0).
        target_pass: float64 [P]; 1 - TV(e_i, p_i): the probability that the target accepts the
            exit's token (greedy: 1.0 where the exit's argmax is the target's token).
    """

    layer: int
    draft_pass: np.ndarray
    target_pass: np.ndarray

    def __post_init__(self) -> None:
        if self.layer < 1:
            raise ValueError(f"middle record layer must be >= 1, got {self.layer}")
        if self.draft_pass.shape != self.target_pass.shape or self.draft_pass.ndim != 1:
            raise ValueError(f"middle record arrays disagree: draft_pass {self.draft_pass.shape}, "
                             f"target_pass {self.target_pass.shape}")

    @property
    def length(self) -> int:
        return int(self.draft_pass.shape[0])


def check_middle_layers(layers, num_layers: int, separate_drafter: bool) -> tuple[int, ...]:
    """``layers`` sorted without repeats, each checked to lie in [1, num_layers); a middle exit
    needs a separate drafter model below it (ValueError naming ``middle_layers`` otherwise)."""
    layers = tuple(sorted(set(int(layer) for layer in layers)))
    if layers and not separate_drafter:
        raise ValueError("middle_layers: an exit between the drafter and the target needs a separate drafter model")
    if any(not 1 <= layer < num_layers for layer in layers):
        raise ValueError(f"middle_layers must lie in [1, {num_layers}), got {layers}")
    return layers


def middle_record(layer: int, p: torch.Tensor, q: torch.Tensor, e: torch.Tensor) -> MiddleRecord:
    """Record the exit at ``layer`` from three levels' rows at the continuation's positions.

    Args:
        p, q, e: float [P, V]; the target's, the drafter's and the exit's distributions under the
            request's sampling transform (``logits_to_probs``; one-hot at temperature 0).
    """
    if not p.shape == q.shape == e.shape or p.ndim != 2:
        raise ValueError(f"p {tuple(p.shape)}, q {tuple(q.shape)} and e {tuple(e.shape)} must be the same [P, V]")
    p, q, e = p.double(), q.double(), e.double()
    draft_pass = torch.minimum(q, e).sum(-1)
    target_pass = torch.minimum(e, p).sum(-1)
    return MiddleRecord(layer, draft_pass.numpy(), target_pass.numpy())
