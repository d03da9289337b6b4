"""Exit heads inside the SGLang server: logits of the target's stream at an exit layer.

    logits = lm_head(final_norm(h + A h + b))     (A = 0, b = 0: the logit lens)

``final_norm`` and ``lm_head`` are the SGLang model's own modules. The map (``apply_exit_map``)
and the folder format (``A`` [D, D], ``b`` [D] per exit layer) are ``sglang_hsd.runtime.exit_heads``'s,
shared with the runtime and the training code.
"""

from __future__ import annotations

import torch

from sglang_hsd.runtime import exit_heads
from sglang_hsd.sglang_plugin.layer_range import lm_head_logits

EXIT_HEADS_FLAG = "--hsd-exit-heads"


def load_exit_map(directory: str, layer: int, hidden_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The trained map of exit ``layer`` in the ``--hsd-exit-heads`` folder ``directory``:
    (A float32 [D, D], b float32 [D]).

    Raises ``FileNotFoundError`` / ``KeyError`` / ``ValueError`` naming the flag, the folder, the
    layer and what is wrong.
    """
    return exit_heads.load_exit_map(directory, layer, hidden_size, flag=EXIT_HEADS_FLAG)


class ExitHead:
    """hidden [T, D] -> float32 logits [T, V] at one exit layer of an SGLang causal LM.

    Args:
        model: the SGLang model (``model.model.norm``, ``model.lm_head``, ``model.logits_processor``).
        vocab_size: V, the target vocabulary (LM-head padding is cut off).
        A, b: the trained map (float32 [D, D], [D]) or None for the logit lens.
    """

    def __init__(self, model, vocab_size: int, A: torch.Tensor | None = None,
                 b: torch.Tensor | None = None) -> None:
        self.model = model
        self.vocab_size = vocab_size
        device = next(model.parameters()).device
        self.A = None if A is None else A.to(device)
        self.b = None if b is None else b.to(device)

    def transform(self, hidden: torch.Tensor) -> torch.Tensor:
        """h + A h + b in float32, cast back to ``hidden``'s dtype (identity for the logit lens)."""
        if self.A is None:
            return hidden
        return exit_heads.apply_exit_map(hidden, self.A, self.b)

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        normed = self.model.model.norm(self.transform(hidden))
        return lm_head_logits(self.model, normed, self.vocab_size)
