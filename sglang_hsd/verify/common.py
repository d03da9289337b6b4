"""Small pieces every verifier shares: placeholder ids, uniforms, inverse-CDF sampling, output
assembly, and the choice between the torch reference and a Triton kernel."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Protocol

import torch

# Emitted-token slots after the corrected/bonus token are filled with this id (as in SGLang / vLLM).
PLACEHOLDER_TOKEN_ID = -1


@dataclass
class ChainUniforms:
    """Pre-drawn uniforms in [0, 1) for one chain verification.

    Passing the same uniforms to two implementations (torch reference, Triton kernel) must give the
    same tokens, which is how the kernel is tested.

    Fields:
        accept: float [B, K]. Column ``k`` is the coin of draft position ``k + 1``: the accept test
            ``u < p/q`` of token ``k + 1`` for ``tokenwise``, the Bernoulli(h_{k+1}) coin of the
            backward scan for ``hsd`` (column ``K - 1`` is the accept-everything coin h_K).
        sample: float [B]. Drives the single inverse-CDF draw of the corrected or bonus token.
    """

    accept: torch.Tensor
    sample: torch.Tensor

    @classmethod
    def draw(
        cls,
        batch_size: int,
        num_draft: int,
        device: torch.device | str = "cpu",
        generator: torch.Generator | None = None,
    ) -> "ChainUniforms":
        accept = torch.rand(batch_size, num_draft, device=device, generator=generator)
        sample = torch.rand(batch_size, device=device, generator=generator)
        return cls(accept=accept, sample=sample)


def inverse_cdf_sample(weights: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Sample one index per row from non-negative, unnormalised ``weights`` with given uniforms.

    Args:
        weights: float [B, V], non-negative, each row with positive total.
        uniform: float [B] in [0, 1).
    Returns:
        int64 [B]: the first index whose running sum exceeds ``uniform * total``. Zero-weight
        indices are never returned, even when rounding pushes the threshold to the row total.
    """
    cdf = torch.cumsum(weights, dim=-1)
    threshold = (uniform * cdf[:, -1]).unsqueeze(-1)
    index = torch.searchsorted(cdf, threshold, right=True).squeeze(-1)
    vocab = torch.arange(weights.shape[-1], device=weights.device)
    last_positive = torch.where(weights > 0, vocab, -1).amax(dim=-1)
    return torch.minimum(index, last_positive)


def assemble_emitted(
    draft_tokens: torch.Tensor, num_accepted: torch.Tensor, next_token: torch.Tensor
) -> torch.Tensor:
    """Build the emitted-token rows: accepted drafts, then ``next_token``, then placeholders.

    Args:
        draft_tokens: int64 [B, K]; num_accepted: int64 [B] in [0, K]; next_token: int64 [B].
    Returns:
        int64 [B, K + 1].
    """
    batch, num_draft = draft_tokens.shape
    slot = torch.arange(num_draft + 1, device=draft_tokens.device).unsqueeze(0)
    padded = torch.cat([draft_tokens, draft_tokens.new_full((batch, 1), PLACEHOLDER_TOKEN_ID)], 1)
    n = num_accepted.unsqueeze(-1)
    out = torch.where(slot < n, padded, torch.full_like(padded, PLACEHOLDER_TOKEN_ID))
    return torch.where(slot == n, next_token.unsqueeze(-1).to(out.dtype), out)


BACKENDS = ("auto", "torch", "triton")


class _HasTritonKernel(Protocol):
    triton_kernel: str | None


def use_triton(
    backend: str, method: str, methods: Mapping[str, _HasTritonKernel], kind: str, target_probs: torch.Tensor
) -> bool:
    """Whether ``method`` runs on its Triton kernel rather than the torch reference.

    Args:
        backend: one of ``BACKENDS``; ``"auto"`` picks the kernel on CUDA when one exists.
        method: a key of ``methods``, a method registry whose entries name their kernel wrapper
            (``triton_kernel``, ``None`` without one).
        kind: ``"chain"`` or ``"tree"``, for the error message.
        target_probs: the target rows; their device decides ``"auto"``.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be 'auto', 'torch' or 'triton', got {backend!r}")
    if backend == "torch":
        return False
    has_kernel = methods[method].triton_kernel is not None
    if backend == "triton":
        if not has_kernel:
            with_kernel = sorted(name for name, entry in methods.items() if entry.triton_kernel)
            raise ValueError(f"the Triton {kind} kernels implement {with_kernel}, not {method!r}")
        return True
    return has_kernel and target_probs.is_cuda
