"""Exit heads inside the SGLang server: logits of the target's stream at an exit layer.

    logits = lm_head(final_norm(h + A h + b))     (A = 0, b = 0: the logit lens)

``final_norm`` and ``lm_head`` are the SGLang model's own modules. ``A`` [D, D] and ``b`` [D] come
from a directory written by ``eagle_heads.exit_heads.save_exit_heads`` (``manifest.json`` plus
``exit_heads.safetensors`` with ``layer<L>.A`` / ``layer<L>.b``); they are read here directly so
the server does not import the training code.
"""

from __future__ import annotations

import json
import os

import torch

from sglang_hsd.sglang_plugin.layer_range import lm_head_logits

MANIFEST = "manifest.json"
WEIGHTS = "exit_heads.safetensors"


def load_exit_map(directory: str, layer: int, hidden_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Read the trained map of exit ``layer`` from ``directory``: (A float32 [D, D], b float32 [D]).

    Raises ``FileNotFoundError`` / ``KeyError`` / ``ValueError`` naming the directory, the layer and
    what is wrong.
    """
    from safetensors.torch import load_file

    manifest_path = os.path.join(directory, MANIFEST)
    if not os.path.isfile(manifest_path):
        raise FileNotFoundError(f"--hsd-exit-heads {directory}: no {MANIFEST} (expected a folder "
                                "written by eagle_heads.exit_heads.save_exit_heads)")
    with open(manifest_path) as f:
        layers = json.load(f).get("layers", [])
    tensors = load_file(os.path.join(directory, WEIGHTS))
    if f"layer{layer}.A" not in tensors:
        raise KeyError(f"--hsd-exit-heads {directory} has no head for exit layer {layer} "
                       f"(it has layers {layers}); pick one of them or use --hsd-exit-heads none")
    A, b = tensors[f"layer{layer}.A"].float(), tensors[f"layer{layer}.b"].float()
    if A.shape != (hidden_size, hidden_size) or b.shape != (hidden_size,):
        raise ValueError(f"--hsd-exit-heads {directory}: layer {layer} map has shape "
                         f"{tuple(A.shape)}, the model's hidden size is {hidden_size}")
    return A, b


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
        h = hidden.float()
        return (h + h @ self.A.T + self.b).to(hidden.dtype)

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        normed = self.model.model.norm(self.transform(hidden))
        return lm_head_logits(self.model, normed, self.vocab_size)
