"""Chain (topk = 1) verification: capped hierarchical branch resampling and its baselines.

Notation (one request; the batch is vectorised). The draft x_1..x_K was sampled from q: row t of
``draft_probs`` is q_t(.), the distribution x_t was drawn from given x_1..x_{t-1}. Row t of
``target_probs`` is p_t(.) at the same position; row K is the bonus distribution p_{K+1}.

``hsd`` (capped hierarchical branch resampling; algebraically the same as block verification,
Sun et al. 2024)::

    R_0 = 1,  R_t = prod_{j<=t} p_j(x_j) / q_j(x_j)        joint prefix ratio
    M_t = max(1, R_1, ..., R_t),  r*_t = R_t / M_t          capped ratio, in [0, 1]
    S+_t = sum_v max(0, r*_t p_{t+1}(v) - q_{t+1}(v))       t = 0..K-1
    h_t  = S+_t / (S+_t + 1 - r*_t)  (h_0 = 1),  h_K = r*_K
    Scan t = K, K-1, ..., 0 and stop at the first coin Bernoulli(h_t) that succeeds: tau.
    tau = K: emit x_1..x_K and a bonus token from p_{K+1};
    tau < K: emit x_1..x_tau and one token from max(0, r*_tau p_{tau+1} - q_{tau+1}) / S+_tau.

Denominators: S+_t + 1 - r*_t is the "deficit" mass S-_t of the branch, which is >= S+_t, so
h_t = S+_t / max(S+_t, S-_t) as in the paper. Ratios live in log space so long drafts whose joint
probabilities underflow float32 are safe; p == q rows give r* = 1, S+ = 0 and h = 0/0, which is the
event "this branch has nothing to resample", so h is set to 0 there (the scan never stops at an
empty branch).

``hsd-paper`` is the published code's variant, identical but for the uncapped final coin
h_K = min(1, R_K). It is NOT lossless (see ``sglang-hsd check``) and exists only for comparison.

``tokenwise`` is Leviathan / Chen speculative sampling; ``greedy`` accepts while the draft equals
the target argmax.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from sglang_hsd.verify.common import ChainUniforms, assemble_emitted, inverse_cdf_sample
from sglang_hsd.verify.validation import (
    check_drafted_tokens_have_mass,
    check_prob_rows,
    check_token_ids,
    check_uniforms,
)

CHAIN_METHODS = ("hsd", "tokenwise", "hsd-paper", "greedy")
# Methods whose output distribution equals the target's (checked by exact enumeration in tests).
LOSSLESS_CHAIN_METHODS = ("hsd", "tokenwise")


@dataclass
class ChainVerifyResult:
    """Outcome of verifying one chain draft per request.

    Fields:
        num_accepted: int64 [B], accepted draft tokens, in [0, K].
        tokens: int64 [B, K + 1]: the accepted draft tokens, then one corrected token (sampled from
            a residual after a rejection) or bonus token (from p_{K+1} when all K are accepted),
            then ``PLACEHOLDER_TOKEN_ID`` padding. Row b emits ``num_accepted[b] + 1`` tokens.
    """

    num_accepted: torch.Tensor
    tokens: torch.Tensor


def verify_chain(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    method: str = "hsd",
    generator: torch.Generator | None = None,
    uniforms: ChainUniforms | None = None,
    validate: bool = True,
    backend: str = "auto",
    draft_lengths: torch.Tensor | None = None,
) -> ChainVerifyResult:
    """Verify a batch of chain drafts against the target.

    Args:
        draft_tokens: int64 [B, K], K >= 1.
        draft_probs: float [B, K, V]; row k is the distribution token k was sampled from. May be
            ``None`` for ``greedy`` only.
        target_probs: float [B, K + 1, V]; row K is the bonus distribution after the draft.
        method: one of ``CHAIN_METHODS``.
        generator: torch generator for the uniforms (ignored if ``uniforms`` is given).
        uniforms: pre-drawn ``ChainUniforms`` (accept [B, K], sample [B]); makes two
            implementations comparable token for token.
        validate: check inputs (synchronises with the device); pass ``False`` on hot paths once
            the caller is known to be correct.
        backend: ``"auto"`` (Triton on CUDA for hsd/tokenwise, torch otherwise), ``"torch"`` or
            ``"triton"`` (on CPU only under ``TRITON_INTERPRET=1``).
        draft_lengths: optional int64 [B] in [1, K]: row b drafted only its first K_b tokens
            (ragged drafts, e.g. a level that buffers "until N tokens", or a request near its
            length limit). Row K_b of ``target_probs`` is then row b's bonus distribution; later
            rows and tokens are ignored (tokens must still be valid ids).
    Returns:
        ``ChainVerifyResult``; ``num_accepted[b] <= draft_lengths[b]``.
    """
    if method not in CHAIN_METHODS:
        raise ValueError(f"method must be one of {CHAIN_METHODS}, got {method!r}")
    if validate:
        _validate_chain(draft_tokens, draft_probs, target_probs, method, draft_lengths)
    if method == "hsd-paper":
        _warn_lossy_once()
    batch, num_draft = draft_tokens.shape
    if uniforms is None:
        uniforms = ChainUniforms.draw(batch, num_draft, target_probs.device, generator)
    elif validate:
        check_uniforms("uniforms.accept", uniforms.accept, (batch, num_draft))
        check_uniforms("uniforms.sample", uniforms.sample, (batch,))
    use_triton = _use_triton(backend, method, target_probs)
    if method == "greedy":
        return _verify_greedy(draft_tokens, target_probs, draft_lengths)
    if use_triton:
        from sglang_hsd.verify.chain_triton import verify_chain_triton

        return verify_chain_triton(draft_tokens, draft_probs, target_probs, method, uniforms, draft_lengths)
    return verify_chain_reference(draft_tokens, draft_probs, target_probs, method, uniforms, draft_lengths)


def verify_chain_reference(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    method: str,
    uniforms: ChainUniforms,
    draft_lengths: torch.Tensor | None = None,
) -> ChainVerifyResult:
    """Plain-torch implementation of the sampling methods (the CPU path and the kernel oracle)."""
    q = draft_probs.float()
    p = target_probs.float()
    lengths = _lengths_or_full(draft_tokens, draft_lengths)
    idx = draft_tokens.long().unsqueeze(-1)
    p_draft = p[:, :-1].gather(-1, idx).squeeze(-1)  # [B, K]
    q_draft = q.gather(-1, idx).squeeze(-1)  # [B, K]
    # Padding beyond a row's length: ratio 1 keeps the log ratios finite; it is never used.
    in_draft = torch.arange(q.shape[1], device=q.device) < lengths.unsqueeze(-1)
    p_draft = torch.where(in_draft, p_draft, 1.0)
    q_draft = torch.where(in_draft, q_draft, 1.0)
    if method == "tokenwise":
        num_accepted = torch.minimum(_tokenwise_stop(p_draft, q_draft, uniforms.accept), lengths)
        scale = torch.ones_like(p[:, :, 0])  # residual max(0, p - q): r* = 1 everywhere
    else:
        h, scale = hsd_weights(p_draft, q_draft, q, p, capped=(method == "hsd"), draft_lengths=lengths)
        num_accepted = _backward_scan_stop(h, uniforms.accept)
    weights = _next_token_weights(num_accepted, lengths, scale, q, p)
    next_token = inverse_cdf_sample(weights, uniforms.sample)
    return ChainVerifyResult(num_accepted, assemble_emitted(draft_tokens, num_accepted, next_token))


def hsd_weights(
    p_draft: torch.Tensor,
    q_draft: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    capped: bool = True,
    draft_lengths: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stop-coin probabilities and capped ratios of hierarchical branch resampling.

    Args:
        p_draft, q_draft: float [B, K], p_t(x_t) and q_t(x_t).
        draft_probs: float [B, K, V]; target_probs: float [B, K + 1, V].
        capped: ``False`` gives the published code's uncapped final coin (lossy).
        draft_lengths: optional int64 [B]; row b's final coin is h_{K_b} and later coins are 0.
    Returns:
        h: float [B, K + 1], h[:, t] = probability the backward scan stops at t (given it got there).
        r_star: float [B, K + 1], the capped prefix ratios r*_0..r*_K (r*_0 = 1).
    """
    log_ratio = torch.log(p_draft) - torch.log(q_draft)  # -inf where p = 0: R collapses to 0
    zero = torch.zeros_like(log_ratio[:, :1])
    log_r = torch.cat([zero, torch.cumsum(log_ratio, dim=-1)], dim=-1)  # [B, K+1], log R_t
    log_m = torch.cummax(log_r.clamp_min(0.0), dim=-1).values  # log M_t (M_0 = 1)
    r_star = torch.exp(log_r - log_m)
    excess = (r_star[:, :-1, None] * target_probs[:, :-1] - draft_probs).clamp_min(0).sum(-1)
    deficit = excess + (1.0 - r_star[:, :-1])
    tiny = torch.finfo(excess.dtype).tiny
    h_branch = torch.where(deficit > tiny, excess / deficit.clamp_min(tiny), torch.zeros_like(excess))
    h_branch[:, 0] = 1.0  # the scan always stops at the empty prefix
    if draft_lengths is None:
        h_final = r_star[:, -1] if capped else torch.exp(log_r[:, -1]).clamp(max=1.0)
        return torch.cat([h_branch, h_final.unsqueeze(-1)], dim=-1), r_star
    last = draft_lengths.unsqueeze(-1)
    h_final = r_star.gather(-1, last) if capped else torch.exp(log_r.gather(-1, last)).clamp(max=1.0)
    stop = torch.arange(log_r.shape[-1], device=log_r.device)
    h = torch.cat([h_branch, torch.zeros_like(h_final)], dim=-1)
    h = torch.where(stop < last, h, torch.where(stop == last, h_final, torch.zeros_like(h)))
    return h, r_star


def expected_accepted_per_length(
    tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor, method: str
) -> torch.Tensor:
    """Exact expected accepted tokens given each draft, for every draft length K' = 1..K.

    No coins are drawn: this is the expectation over the verifier's randomness for the fixed draft
    (truncated to its first K' tokens), which is what benchmarks compare methods on.

    Args:
        tokens: int64 [N, K]; draft_probs: float [N, K, V]; target_probs: float [N, K + 1, V].
        method: ``tokenwise``, ``hsd`` or ``hsd-paper``.
    Returns:
        float64 [N, K]; column K' - 1 is E[accepted | first K' draft tokens].
    """
    q, p = draft_probs, target_probs
    idx = tokens.unsqueeze(-1)
    p_draft = p[:, :-1].gather(-1, idx).squeeze(-1).double()
    q_draft = q.gather(-1, idx).squeeze(-1).double()
    num_draft = tokens.shape[1]
    out = torch.zeros(tokens.shape[0], num_draft, dtype=torch.float64)
    for k in range(1, num_draft + 1):
        if method == "tokenwise":
            accept = (p_draft[:, :k] / q_draft[:, :k]).clamp(max=1.0)
            out[:, k - 1] = torch.cumprod(accept, dim=-1).sum(-1)
            continue
        h, _ = hsd_weights(p_draft[:, :k], q_draft[:, :k], q[:, :k].double(), p[:, : k + 1].double(),
                           capped=(method == "hsd"))
        # P(tau = t) = h_t * prod_{s > t} (1 - h_s), scanning from t = k down to 0.
        survive = torch.flip(torch.cumprod(torch.flip(1 - h, [-1]), -1), [-1])
        after = torch.cat([survive[:, 1:], torch.ones_like(survive[:, :1])], -1)
        stop = h * after
        out[:, k - 1] = (stop * torch.arange(k + 1, dtype=torch.float64)).sum(-1)
    return out


def _backward_scan_stop(h: torch.Tensor, accept_u: torch.Tensor) -> torch.Tensor:
    """tau = the largest t whose coin u_t < h_t succeeds (t = 0 always succeeds). int64 [B]."""
    success = torch.cat([torch.ones_like(accept_u[:, :1], dtype=torch.bool), accept_u < h[:, 1:]], 1)
    num_stops = success.shape[-1]
    last_from_end = torch.flip(success, dims=[-1]).int().argmax(dim=-1)
    return (num_stops - 1 - last_from_end).long()


def _tokenwise_stop(p_draft: torch.Tensor, q_draft: torch.Tensor, accept_u: torch.Tensor) -> torch.Tensor:
    """Accept token t while u_t * q_t(x_t) < p_t(x_t) (i.e. u < p/q without dividing). int64 [B]."""
    accepted = accept_u * q_draft < p_draft
    return torch.cumprod(accepted.long(), dim=-1).sum(dim=-1)


def _next_token_weights(
    num_accepted: torch.Tensor,
    lengths: torch.Tensor,
    scale: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
) -> torch.Tensor:
    """Unnormalised distribution of the token emitted after the accepted prefix. float [B, V].

    After tau accepted tokens: max(0, r*_tau p_{tau+1} - q_{tau+1}) if tau < K_b, else p_{K_b+1}.
    In exact arithmetic the residual of a branch the scan stopped at has positive mass; when
    rounding leaves it empty (p and q equal to float precision) the target row is used instead.
    """
    batch = draft_probs.shape[0]
    rows = torch.arange(batch, device=draft_probs.device)
    p_next = target_probs[rows, num_accepted]
    bonus = (num_accepted == lengths).unsqueeze(-1)
    q_padded = torch.cat([draft_probs, torch.zeros_like(draft_probs[:, :1])], dim=1)
    # The bonus row is p_{K_b+1} itself: no q subtracted, whatever r*_{K_b} is.
    q_next = torch.where(bonus, 0.0, q_padded[rows, num_accepted])
    s_next = torch.where(bonus, 1.0, scale[rows, num_accepted].unsqueeze(-1))
    residual = (s_next * p_next - q_next).clamp_min(0)
    empty = residual.sum(-1, keepdim=True) <= 0
    return torch.where(empty, p_next, residual)


def _lengths_or_full(draft_tokens: torch.Tensor, draft_lengths: torch.Tensor | None) -> torch.Tensor:
    if draft_lengths is None:
        return torch.full_like(draft_tokens[:, 0], draft_tokens.shape[1], dtype=torch.long)
    return draft_lengths.long()


def _verify_greedy(draft_tokens, target_probs, draft_lengths=None) -> ChainVerifyResult:
    target_argmax = target_probs.argmax(dim=-1)  # [B, K + 1]
    matches = draft_tokens == target_argmax[:, :-1]
    lengths = _lengths_or_full(draft_tokens, draft_lengths)
    num_accepted = torch.minimum(torch.cumprod(matches.long(), dim=-1).sum(dim=-1), lengths)
    next_token = target_argmax.gather(-1, num_accepted.unsqueeze(-1)).squeeze(-1)
    return ChainVerifyResult(num_accepted, assemble_emitted(draft_tokens, num_accepted, next_token))


def _validate_chain(draft_tokens, draft_probs, target_probs, method: str, draft_lengths=None) -> None:
    if not isinstance(draft_tokens, torch.Tensor) or draft_tokens.dim() != 2:
        raise ValueError("draft_tokens must be an int64 tensor of shape [B, K]")
    batch, num_draft = draft_tokens.shape
    if num_draft == 0:
        raise ValueError("draft_tokens has K = 0 draft tokens; verification needs K >= 1")
    if target_probs.dim() != 3 or tuple(target_probs.shape[:2]) != (batch, num_draft + 1):
        raise ValueError(
            f"target_probs must have shape [B, K + 1, V] = [{batch}, {num_draft + 1}, V], "
            f"got {list(target_probs.shape)}"
        )
    vocab = target_probs.shape[-1]
    check_token_ids("draft_tokens", draft_tokens, vocab)
    used_target = torch.ones(batch, num_draft + 1, dtype=torch.bool, device=draft_tokens.device)
    if draft_lengths is not None:
        if tuple(draft_lengths.shape) != (batch,) or draft_lengths.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"draft_lengths must be an int64 tensor of shape [{batch}]")
        if bool(((draft_lengths < 1) | (draft_lengths > num_draft)).any()):
            raise ValueError(f"draft_lengths must lie in [1, K = {num_draft}]")
        positions = torch.arange(num_draft + 1, device=draft_tokens.device)
        used_target = positions <= draft_lengths.unsqueeze(-1).to(draft_tokens.device)
    check_prob_rows("target_probs", target_probs[used_target])
    if draft_probs is None:
        if method != "greedy":
            raise ValueError(f"draft_probs is required for method {method!r} (only 'greedy' ignores it)")
        return
    if tuple(draft_probs.shape) != (batch, num_draft, vocab):
        raise ValueError(
            f"draft_probs must have shape [B, K, V] = [{batch}, {num_draft}, {vocab}] "
            f"(the target's vocabulary), got {list(draft_probs.shape)}"
        )
    used_draft = used_target[:, 1:]  # draft position t is used iff t < K_b, i.e. t + 1 <= K_b
    check_prob_rows("draft_probs", draft_probs[used_draft])
    if method != "greedy":
        q_draft = draft_probs.gather(-1, draft_tokens.long().unsqueeze(-1)).squeeze(-1)
        check_drafted_tokens_have_mass(draft_tokens, torch.where(used_draft, q_draft, 1.0))


def _use_triton(backend: str, method: str, target_probs: torch.Tensor) -> bool:
    if backend not in ("auto", "torch", "triton"):
        raise ValueError(f"backend must be 'auto', 'torch' or 'triton', got {backend!r}")
    if backend == "torch":
        return False
    supported = method in ("hsd", "tokenwise")
    if backend == "triton":
        if not supported:
            raise ValueError(f"the Triton kernel implements 'hsd' and 'tokenwise', not {method!r}")
        return True
    return supported and target_probs.is_cuda


def _warn_lossy_once() -> None:
    # Python's default warning filter shows a warning once per call site, so this warns once.
    warnings.warn(
        "method 'hsd-paper' reproduces the published code's uncapped final acceptance and does "
        "NOT preserve the target distribution; use it only for comparison",
        stacklevel=3,
    )
