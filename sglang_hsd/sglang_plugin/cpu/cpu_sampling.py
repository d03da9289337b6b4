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

Draft draws: SGLang's unseeded ``fast_sample`` draws each draft by an exponential race (one
``exponential_`` per vocabulary entry, then ``argmax(q / e)``). On the 2-core Xeon that ``exponential_``
costs 53-57 ms at 16 rows x 151,936 tokens (torch's CPU exponential is not vectorised), paid once
per draft step and once more in the draft extend, every round: at batch 16 with 4 drafts at T = 1,
11% of the round (``benchmarks/results/loaded_rounds_xeon_humaneval_c16_t1_profile.md``).
``draft_fast_sample`` draws the same law by inverse transform sampling instead, one uniform per
row mapped through the row's cumulative mass (``tree_draft.children.sequential_draws``, the tree
drafter's draw: block masses then the chosen block's entries, float64 across blocks): 0.7 ms
there, 0.15 ms for one row against 3.6.
The law is q's, so the verifier, which reads the q the draft was drawn from, stays lossless. Seeded
draws (``--hsd-request-seeds``) and several draws per row keep SGLang's path.
"""

from __future__ import annotations

import torch

from sglang_hsd.tree_draft.children import sequential_draws


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


def make_draft_fast_sample(original):
    """Replacement for ``spec_utils.fast_sample`` (module docstring): one unseeded draw per row
    by inverse transform sampling; anything else goes to ``original``.

    The replacement takes ``probs`` float [R, V] (non-negative rows, any positive mass) and
    returns ``(probs[r, X_r], X)``, float [R, 1] and int64 [R, 1], with X_r ~ probs[r] / sum.
    """

    def draft_fast_sample(probs, num_samples=1, *, sampling_seed=None, positions=None, draft_step=0):
        if sampling_seed is not None or num_samples != 1 or probs.device.type != "cpu":
            return original(probs, num_samples, sampling_seed=sampling_seed, positions=positions,
                            draft_step=draft_step)
        uniforms = torch.rand(probs.shape[0], 1, dtype=torch.float64, device=probs.device)
        index = sequential_draws(probs, uniforms, 1)
        return probs.gather(1, index), index

    draft_fast_sample.__sglang_hsd_original__ = original
    return draft_fast_sample
