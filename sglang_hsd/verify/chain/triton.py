"""Triton kernel for chain verification (``hsd`` and ``tokenwise``), one program per request.

The math is the one in ``reference.py`` (read its docstring first); this file only reorganises it for a
GPU. Each program walks its request's draft left to right once, keeping the running log joint ratio
log R_t and the running cap log M_t in registers, so every branch's excess mass
S+_t = sum_v max(0, r*_t p_{t+1}(v) - q_{t+1}(v)) is one pass over the vocabulary in blocks of
``BLOCK_V``. The backward scan "largest t whose coin succeeds" is the same as "the last success
seen going forward", so no second pass is needed. The corrected/bonus token is drawn by inverse CDF
with two more vocabulary passes (total mass, then the first index whose running sum exceeds
``u * total``).

Uniforms are drawn outside and passed in (``ChainUniforms``), so the kernel and the torch reference
give the same tokens for the same uniforms; the only possible differences are float summation order
flipping a coin or a token when a uniform falls within rounding distance of a threshold.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sglang_hsd.verify.chain.types import ChainVerifyResult
from sglang_hsd.verify.common import PLACEHOLDER_TOKEN_ID, ChainUniforms

# float32's smallest normal: below it a branch's deficit mass counts as empty (h = 0).
_TINY = tl.constexpr(1.1754943508222875e-38)
PLACEHOLDER = tl.constexpr(PLACEHOLDER_TOKEN_ID)


@triton.jit
def _chain_verify_kernel(
    draft_ptr,  # int64 [B, K]
    q_ptr,  # float32 [B, K, V]
    p_ptr,  # float32 [B, K + 1, V]
    accept_u_ptr,  # float32 [B, K]
    sample_u_ptr,  # float32 [B]
    lengths_ptr,  # int64 [B], K_b in [1, K]
    num_accepted_ptr,  # int64 [B] (out)
    tokens_ptr,  # int64 [B, K + 1] (out)
    K,
    V,
    IS_HSD: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    k_b = tl.load(lengths_ptr + b).to(tl.int32)  # int32 like the loop state it bounds (tau)
    q_row0 = q_ptr + b * K * V
    p_row0 = p_ptr + b * (K + 1) * V
    offs = tl.arange(0, BLOCK_V)

    log_r = 0.0  # log R_t
    log_m = 0.0  # log M_t
    tau = 0
    scale_at_tau = 1.0  # r*_tau (hsd) or 1 (tokenwise)
    alive = 1  # tokenwise: every token so far accepted
    for t in range(0, k_b):
        x = tl.load(draft_ptr + b * K + t)
        p_x = tl.load(p_row0 + t * V + x)
        q_x = tl.load(q_row0 + t * V + x)
        if IS_HSD:
            r_star = tl.exp(log_r - log_m)
            if t > 0:
                excess = 0.0
                for start in range(0, V, BLOCK_V):
                    mask = start + offs < V
                    p_v = tl.load(p_row0 + t * V + start + offs, mask=mask, other=0.0)
                    q_v = tl.load(q_row0 + t * V + start + offs, mask=mask, other=0.0)
                    excess += tl.sum(tl.maximum(r_star * p_v - q_v, 0.0), axis=0)
                deficit = excess + (1.0 - r_star)
                h = tl.where(deficit > _TINY, excess / tl.maximum(deficit, _TINY), 0.0)
                # Coin of position t uses column t - 1 (column K - 1 is the final coin h_K).
                u_prev = tl.load(accept_u_ptr + b * K + t - 1)
                success = u_prev < h
                tau = tl.where(success, t, tau)
                scale_at_tau = tl.where(success, r_star, scale_at_tau)
            log_r = log_r + tl.log(p_x) - tl.log(q_x)
            log_m = tl.maximum(log_m, tl.maximum(log_r, 0.0))
        else:
            u = tl.load(accept_u_ptr + b * K + t)
            accepted = u * q_x < p_x  # u < p/q without dividing, as the reference
            new_alive = tl.where(accepted, alive, 0)
            tau = tau + new_alive
            alive = new_alive
    if IS_HSD:
        h_final = tl.exp(log_r - log_m)
        u_last = tl.load(accept_u_ptr + b * K + k_b - 1)
        tau = tl.where(u_last < h_final, k_b, tau)
        scale_at_tau = tl.where(u_last < h_final, 1.0, scale_at_tau)

    # Next-token weights: max(0, s p_{tau+1} - q_{tau+1}) if tau < K_b, else p_{K_b+1} (q row = 0).
    has_q = tau < k_b
    p_next = p_row0 + tau * V
    q_next = q_row0 + tau * V
    total = 0.0
    for start in range(0, V, BLOCK_V):
        mask = start + offs < V
        p_v = tl.load(p_next + start + offs, mask=mask, other=0.0)
        q_v = tl.load(q_next + start + offs, mask=mask & has_q, other=0.0)
        total += tl.sum(tl.maximum(scale_at_tau * p_v - q_v, 0.0), axis=0)
    # A residual that rounding left empty: fall back to the target row (as the reference does).
    use_p = total <= 0.0
    if use_p:
        total = 0.0
        for start in range(0, V, BLOCK_V):
            mask = start + offs < V
            total += tl.sum(tl.load(p_next + start + offs, mask=mask, other=0.0), axis=0)
    threshold = tl.load(sample_u_ptr + b) * total
    running = 0.0
    chosen = V
    last_positive = -1
    for start in range(0, V, BLOCK_V):
        mask = start + offs < V
        p_v = tl.load(p_next + start + offs, mask=mask, other=0.0)
        q_v = tl.load(q_next + start + offs, mask=mask & has_q & (use_p == 0), other=0.0)
        w = tl.where(use_p, p_v, tl.maximum(scale_at_tau * p_v - q_v, 0.0))
        cdf = running + tl.cumsum(w, axis=0)
        first = tl.min(tl.where((cdf > threshold) & mask, start + offs, V), axis=0)
        chosen = tl.minimum(chosen, first)
        last_positive = tl.maximum(last_positive, tl.max(tl.where((w > 0) & mask, start + offs, -1), axis=0))
        running = running + tl.sum(w, axis=0)
    chosen = tl.minimum(chosen, last_positive)

    tl.store(num_accepted_ptr + b, tau.to(tl.int64))
    for j in range(0, K + 1):
        draft_j = tl.load(draft_ptr + b * K + j, mask=j < K, other=PLACEHOLDER)
        out = tl.where(j < tau, draft_j, tl.where(j == tau, chosen.to(tl.int64), PLACEHOLDER))
        tl.store(tokens_ptr + b * (K + 1) + j, out)


def verify_hsd_triton(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    uniforms: ChainUniforms,
    draft_lengths: torch.Tensor | None = None,
    block_v: int = 1024,
) -> ChainVerifyResult:
    """Kernel version of ``reference.verify_hsd`` (same arguments, same result for the same uniforms).

    ``block_v``: vocabulary entries per block (capped at the next power of two of V).
    """
    return _launch(draft_tokens, draft_probs, target_probs, uniforms, draft_lengths, block_v, is_hsd=True)


def verify_tokenwise_triton(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    uniforms: ChainUniforms,
    draft_lengths: torch.Tensor | None = None,
    block_v: int = 1024,
) -> ChainVerifyResult:
    """Kernel version of ``reference.verify_tokenwise``; arguments as ``verify_hsd_triton``."""
    return _launch(draft_tokens, draft_probs, target_probs, uniforms, draft_lengths, block_v, is_hsd=False)


def _launch(draft_tokens, draft_probs, target_probs, uniforms, draft_lengths, block_v, is_hsd: bool):
    batch, num_draft = draft_tokens.shape
    vocab = target_probs.shape[-1]
    if draft_lengths is None:
        draft_lengths = torch.full((batch,), num_draft, dtype=torch.int64, device=draft_tokens.device)
    num_accepted = torch.empty(batch, dtype=torch.int64, device=draft_tokens.device)
    tokens = torch.empty(batch, num_draft + 1, dtype=torch.int64, device=draft_tokens.device)
    _chain_verify_kernel[(batch,)](
        draft_tokens.contiguous().long(),
        draft_probs.contiguous().float(),
        target_probs.contiguous().float(),
        uniforms.accept.contiguous().float(),
        uniforms.sample.contiguous().float(),
        draft_lengths.contiguous().long(),
        num_accepted,
        tokens,
        num_draft,
        vocab,
        IS_HSD=is_hsd,
        BLOCK_V=min(block_v, triton.next_power_of_2(vocab)),
    )
    return ChainVerifyResult(num_accepted, tokens)
