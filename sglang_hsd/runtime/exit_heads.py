"""Early-exit heads (tuned-lens style): their math and their file format, defined once.

    ExitHead(h) = lm_head(final_norm(h + A h + b))     (A = 0, b = 0: the logit lens)

``final_norm`` and ``lm_head`` are the target's own (shared, frozen); only the D x D matrix ``A``
and the bias ``b`` are trained (``eagle_heads.exit_heads``). Acceptance of an exit level by the
level above is alpha = 1 - TV(p_exit, p_above) (docs/hierarchy.md).

On disk, one folder per set of heads (``save_exit_heads``):

* ``manifest.json``: a JSON object with ``layers`` (the exit layers, sorted), ``format``
  (``FORMAT``) and whatever the writer adds (model, training budget, data, metrics);
* ``exit_heads.safetensors``: ``layer<L>.A`` [D, D] and ``layer<L>.b`` [D] per exit layer L.

Three parts share the format and the math: the training package writes it, the runtime runs
``ExitHead`` on a ``CausalLM`` (hence this module's place in the runtime, beside the model it
wraps), and the SGLang plugin (``sglang_plugin/exit_head.py``) reads the same files and runs
``apply_exit_map`` on an SGLang model. Both import it from here; it imports nothing of theirs.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from sglang_hsd.runtime.model import CausalLM

MANIFEST = "manifest.json"
WEIGHTS = "exit_heads.safetensors"
FORMAT = "h -> lm_head(norm(h + A h + b)); A [D, D], b [D]"


def apply_exit_map(hidden: torch.Tensor, A: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The corrected hidden state ``h + A h + b``.

    Args:
        hidden: [..., D] in any float dtype.
        A: [D, D]; b: [D]; the sum is computed in ``A``'s dtype (a float32 map on a bfloat16
            server model stays float32 inside).

    Returns:
        [..., D] in ``hidden``'s dtype.
    """
    h = hidden.to(A.dtype)
    return (h + h @ A.T + b).to(hidden.dtype)


class ExitHead(nn.Module):
    """hidden [..., D] -> logits [..., V] for one exit layer of a runtime ``CausalLM``.

    The target's final norm and LM head are referenced, not copied (read from the target at each
    call, so a packed LM head serves the exit too); they are excluded from
    ``trainable_parameters`` and from the state dict. ``A`` and ``b`` start at zero, so an
    untrained head *is* the logit lens (``CausalLM.exit_logits`` without a head), bit for bit.
    """

    def __init__(self, target: CausalLM, layer: int) -> None:
        super().__init__()
        dim = target.hidden_size
        self.layer = layer
        self.A = nn.Parameter(torch.zeros(dim, dim, dtype=target.embed_tokens.weight.dtype))
        self.b = nn.Parameter(torch.zeros(dim, dtype=target.embed_tokens.weight.dtype))
        # A plain attribute tuple keeps the target out of this module's state_dict and parameters.
        # Its norm and LM head are looked up at each call: ``CausalLM.pack_linears`` swaps the LM
        # head for a packed one, and a head that kept the old module ran its vocabulary product
        # outside the packed kernel (an exit call then cost more than the target's whole call).
        self._target = (target,)

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [self.A, self.b]

    def transform(self, hidden: torch.Tensor) -> torch.Tensor:
        """The corrected hidden state ``h + A h + b``, same shape as ``hidden``."""
        return apply_exit_map(hidden, self.A, self.b)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        target = self._target[0]
        return target.lm_head(target.norm(self.transform(hidden)))


def save_exit_heads(directory: str, heads: dict[int, ExitHead], manifest: dict | None = None) -> str:
    """Write the heads' A, b and a JSON manifest (``manifest`` plus ``layers`` and ``format``)
    into ``directory``; returns it."""
    from safetensors.torch import save_file

    os.makedirs(directory, exist_ok=True)
    tensors = {}
    for layer, head in heads.items():
        tensors[f"layer{layer}.A"] = head.A.detach().contiguous().cpu()
        tensors[f"layer{layer}.b"] = head.b.detach().contiguous().cpu()
    save_file(tensors, os.path.join(directory, WEIGHTS))
    info = dict(manifest or {})
    info["layers"] = sorted(heads)
    info["format"] = FORMAT
    with open(os.path.join(directory, MANIFEST), "w") as f:
        json.dump(info, f, indent=2)
    return directory


def read_manifest(directory: str) -> dict:
    """The manifest of a heads folder; ``FileNotFoundError`` naming the folder if it has none."""
    path = os.path.join(directory, MANIFEST)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{directory}: no {MANIFEST} (expected a folder written by "
                                "sglang_hsd.runtime.exit_heads.save_exit_heads)")
    with open(path) as f:
        return json.load(f)


def read_exit_maps(directory: str, flag: str | None = None) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Every trained map in ``directory``: {exit layer: (A [D, D], b [D])} in the stored dtype,
    by increasing layer.

    ``flag`` (e.g. ``--hsd-exit-heads``) is named in the error message when the folder has no
    manifest.
    """
    from safetensors.torch import load_file

    try:
        read_manifest(directory)
    except FileNotFoundError as err:
        raise FileNotFoundError(f"{flag} {err}" if flag else str(err)) from None
    tensors = load_file(os.path.join(directory, WEIGHTS))
    layers = sorted(int(name[len("layer"):-len(".A")]) for name in tensors if name.endswith(".A"))
    return {layer: (tensors[f"layer{layer}.A"], tensors[f"layer{layer}.b"]) for layer in layers}


def load_exit_map(directory: str, layer: int, hidden_size: int,
                  flag: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Read the trained map of exit ``layer`` from ``directory``: (A float32 [D, D], b float32 [D]).

    Raises ``FileNotFoundError`` / ``KeyError`` / ``ValueError`` naming the folder (and ``flag``,
    when given), the layer and what is wrong.
    """
    maps = read_exit_maps(directory, flag)
    source = f"{flag} {directory}" if flag else directory
    if layer not in maps:
        hint = f" or use {flag} none" if flag else ""
        raise KeyError(f"{source} has no head for exit layer {layer} (it has layers {sorted(maps)}); "
                       f"pick one of them{hint}")
    A, b = maps[layer][0].float(), maps[layer][1].float()
    if A.shape != (hidden_size, hidden_size) or b.shape != (hidden_size,):
        raise ValueError(f"{source}: layer {layer} map has shape {tuple(A.shape)}, the model's "
                         f"hidden size is {hidden_size}")
    return A, b


def load_exit_heads(directory: str, target: CausalLM, layers: list[int] | None = None) -> dict[int, ExitHead]:
    """Load heads saved by ``save_exit_heads`` onto ``target``: {exit layer: ExitHead}.

    ``layers`` selects a subset (default: all in the manifest). Raises ``KeyError`` for a layer
    without a head and ``ValueError`` if the hidden size of a stored map does not match ``target``.
    """
    maps = read_exit_maps(directory)
    heads = {}
    for layer in layers or sorted(maps):
        if layer not in maps:
            raise KeyError(f"no exit head for layer {layer} in {directory} (has {sorted(maps)})")
        head = ExitHead(target, layer)
        A, b = maps[layer]
        if A.shape != head.A.shape:
            raise ValueError(f"exit head for layer {layer} has shape {tuple(A.shape)}, target needs {tuple(head.A.shape)}")
        with torch.no_grad():
            head.A.copy_(A)
            head.b.copy_(b)
        heads[layer] = head.eval().requires_grad_(False)
    return heads
