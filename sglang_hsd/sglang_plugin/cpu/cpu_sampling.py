"""Torch versions of sampling kernels SGLang 0.5.23 lacks on CPU, installed by ``register()``.

Top-k / top-p renormalisation: SGLang resolves ``top_k_renorm_prob`` / ``top_p_renorm_prob`` per
platform and leaves them ``None`` on CPU, so ``eagle_sample``'s sampling path crashes as soon as a
batch has a request with top-k (every greedy request in a mixed batch has top_k = 1) or top-p.
``register()`` puts these in ``eagle_utils``' namespace when SGLang's are missing. Same semantics as
FlashInfer's kernels: keep the k largest entries (ties at the k-th value kept) / the smallest
prefix of the sorted row whose mass reaches p (the largest entry always kept), then renormalise.

Row argmax: SGLang's draft sampler (``spec_utils.fast_sample``) picks each sampled draft with the
Triton kernel ``row_argmax``, which has no CPU backend; on CPU ``register()`` puts
``torch_row_argmax`` in its place (the same argmax, for every algorithm).
"""

from __future__ import annotations

import torch


def top_k_renorm_prob(probs: torch.Tensor, top_ks: torch.Tensor) -> torch.Tensor:
    """probs float [N, V], top_ks int [N] (values <= 0 or >= V keep the whole row) -> [N, V]."""
    vocab = probs.shape[-1]
    k = torch.where((top_ks <= 0) | (top_ks > vocab), vocab, top_ks).long().view(-1, 1)
    kth = torch.sort(probs, dim=-1, descending=True).values.gather(-1, k - 1)
    kept = torch.where(probs >= kth, probs, 0.0)
    return kept / kept.sum(-1, keepdim=True)


def top_p_renorm_prob(probs: torch.Tensor, top_ps: torch.Tensor) -> torch.Tensor:
    """probs float [N, V], top_ps float [N] in (0, 1] -> [N, V]."""
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    drop_sorted = mass_before >= top_ps.view(-1, 1).to(probs.dtype)
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    kept = probs.masked_fill(drop, 0.0)
    return kept / kept.sum(-1, keepdim=True)


def torch_row_argmax(x: torch.Tensor) -> torch.Tensor:
    """CPU stand-in for SGLang's Triton ``row_argmax``: float32 [rows, n] -> int64 [rows]."""
    return x.argmax(dim=-1)
