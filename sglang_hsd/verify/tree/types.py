"""Types shared by the tree verifiers: pre-drawn uniforms, the batch every rule reads, the result."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class TreeUniforms:
    """Pre-drawn uniforms in [0, 1) for one tree verification (same uniforms, same tokens).

    Fields:
        accept: float [B, N]. ``hsd``: column n is the coin that tests node n as a leaf (column 0
            unused, the root always accepts). ``rrs``: the coin that tests child n against its
            parent. ``target-only``: the coin that walks the children of node n (as SGLang's
            ``uniform_samples[b, n]``).
        sample: float [B], the inverse-CDF draw of the corrected or bonus token.
    """

    accept: torch.Tensor
    sample: torch.Tensor

    @classmethod
    def draw(cls, batch_size: int, num_nodes: int, device="cpu", generator=None) -> "TreeUniforms":
        accept = torch.rand(batch_size, num_nodes, device=device, generator=generator)
        return cls(accept=accept, sample=torch.rand(batch_size, device=device, generator=generator))


@dataclass
class TreeVerifyResult:
    """Outcome of verifying one draft tree per request (D = the deepest node's depth).

    Fields:
        accept_index: int64 [B, D + 1], node indices of the accepted path, root at column 0,
            then -1 padding.
        num_accepted: int64 [B], accepted draft tokens (the root is not counted), in [0, D].
        tokens: int64 [B, D + 1], the accepted draft tokens, then the corrected/bonus token, then
            ``PLACEHOLDER_TOKEN_ID``. Row b emits ``num_accepted[b] + 1`` tokens.
    """

    accept_index: torch.Tensor
    num_accepted: torch.Tensor
    tokens: torch.Tensor


@dataclass
class TreeBatch:
    """Tensors every tree method reads (links as ``tree/layout.py`` describes).

    Fields:
        candidates, first_child, next_sibling, parents: int64 [B, N].
        draft_probs: float [B, N, V] or ``None`` (methods that do not read q).
        target_probs: float [B, N, V].
        remove_rejected: without-replacement drafting: drop a rejected child's token from q.
        argmax_first: ``draft_mode="argmax-first"``: a node's first child is deterministic (q's
            argmax) and is tested against a one-hot proposal; its later siblings as without
            replacement (implies ``remove_rejected``).
    """

    candidates: torch.Tensor
    first_child: torch.Tensor
    next_sibling: torch.Tensor
    parents: torch.Tensor
    draft_probs: torch.Tensor | None
    target_probs: torch.Tensor
    remove_rejected: bool
    argmax_first: bool = False
