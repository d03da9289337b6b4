"""Chain (topk = 1) verification rules in plain torch: the CPU path and the kernels' oracle.

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

Every rule here has the signature of ``ChainRule`` (``methods.py``) and takes the same pre-drawn
``ChainUniforms`` as the Triton kernels, so both give the same tokens for the same uniforms.
Inputs are assumed valid (``verify_chain`` checks them).
"""

from __future__ import annotations

import torch

from sglang_hsd.verify.chain.types import ChainVerifyResult
from sglang_hsd.verify.common import ChainUniforms, assemble_emitted, inverse_cdf_sample


def verify_hsd(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    uniforms: ChainUniforms,
    draft_lengths: torch.Tensor | None = None,
) -> ChainVerifyResult:
    """Capped hierarchical branch resampling (lossless).

    Args:
        draft_tokens: int64 [B, K]; draft_probs: float [B, K, V]; target_probs: float [B, K + 1, V].
        uniforms: ``ChainUniforms`` (accept [B, K], sample [B]).
        draft_lengths: optional int64 [B] in [1, K]; row b uses only its first K_b tokens.
    Returns:
        ``ChainVerifyResult`` (num_accepted [B], tokens [B, K + 1]).
    """
    return _verify_backward_scan(draft_tokens, draft_probs, target_probs, uniforms, draft_lengths, capped=True)


def verify_hsd_paper(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    uniforms: ChainUniforms,
    draft_lengths: torch.Tensor | None = None,
) -> ChainVerifyResult:
    """The published code's uncapped final coin h_K = min(1, R_K) (lossy). Arguments as ``verify_hsd``."""
    return _verify_backward_scan(draft_tokens, draft_probs, target_probs, uniforms, draft_lengths, capped=False)


def verify_tokenwise(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    uniforms: ChainUniforms,
    draft_lengths: torch.Tensor | None = None,
) -> ChainVerifyResult:
    """Token-by-token speculative sampling (Leviathan / Chen). Arguments as ``verify_hsd``."""
    q, p, lengths, p_draft, q_draft = _draft_rows(draft_tokens, draft_probs, target_probs, draft_lengths)
    num_accepted = torch.minimum(_tokenwise_stop(p_draft, q_draft, uniforms.accept), lengths)
    scale = torch.ones_like(p[:, :, 0])  # residual max(0, p - q): r* = 1 everywhere
    return _emit(draft_tokens, num_accepted, lengths, scale, q, p, uniforms)


def verify_greedy(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    uniforms: ChainUniforms | None = None,
    draft_lengths: torch.Tensor | None = None,
) -> ChainVerifyResult:
    """Accept while the draft equals the target argmax, then emit the argmax.

    ``draft_probs`` and ``uniforms`` are ignored (the rule is deterministic); arguments otherwise
    as ``verify_hsd``.
    """
    target_argmax = target_probs.argmax(dim=-1)  # [B, K + 1]
    matches = draft_tokens == target_argmax[:, :-1]
    lengths = _lengths_or_full(draft_tokens, draft_lengths)
    num_accepted = torch.minimum(torch.cumprod(matches.long(), dim=-1).sum(dim=-1), lengths)
    next_token = target_argmax.gather(-1, num_accepted.unsqueeze(-1)).squeeze(-1)
    return ChainVerifyResult(num_accepted, assemble_emitted(draft_tokens, num_accepted, next_token))


def _verify_backward_scan(draft_tokens, draft_probs, target_probs, uniforms, draft_lengths, capped: bool):
    q, p, lengths, p_draft, q_draft = _draft_rows(draft_tokens, draft_probs, target_probs, draft_lengths)
    h, scale = hsd_weights(p_draft, q_draft, q, p, capped=capped, draft_lengths=lengths)
    num_accepted = _backward_scan_stop(h, uniforms.accept)
    return _emit(draft_tokens, num_accepted, lengths, scale, q, p, uniforms)


def _draft_rows(draft_tokens, draft_probs, target_probs, draft_lengths):
    """float32 rows, lengths [B] and the drafted tokens' probabilities p_t(x_t), q_t(x_t) [B, K]."""
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
    return q, p, lengths, p_draft, q_draft


def _emit(draft_tokens, num_accepted, lengths, scale, q, p, uniforms: ChainUniforms) -> ChainVerifyResult:
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


def tokenwise_expected_accepted(
    p_draft: torch.Tensor, q_draft: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor
) -> torch.Tensor:
    """Exact E[accepted] of ``tokenwise`` for fixed drafts (no coins drawn).

    Args:
        p_draft, q_draft: float64 [N, K]; draft_probs: float64 [N, K, V]; target_probs: float64
            [N, K + 1, V] (the rows are not needed by this rule).
    Returns:
        float64 [N].
    """
    accept = (p_draft / q_draft).clamp(max=1.0)
    return torch.cumprod(accept, dim=-1).sum(-1)


def hsd_expected_accepted(
    p_draft: torch.Tensor,
    q_draft: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    capped: bool = True,
) -> torch.Tensor:
    """Exact E[accepted] of ``hsd`` (``capped=False``: ``hsd-paper``) for fixed drafts.

    Shapes as ``tokenwise_expected_accepted``. Returns float64 [N].
    """
    num_draft = p_draft.shape[1]
    h, _ = hsd_weights(p_draft, q_draft, draft_probs, target_probs, capped=capped)
    # P(tau = t) = h_t * prod_{s > t} (1 - h_s), scanning from t = K down to 0.
    survive = torch.flip(torch.cumprod(torch.flip(1 - h, [-1]), -1), [-1])
    after = torch.cat([survive[:, 1:], torch.ones_like(survive[:, :1])], -1)
    stop = h * after
    return (stop * torch.arange(num_draft + 1, dtype=torch.float64)).sum(-1)


def hsd_paper_expected_accepted(
    p_draft: torch.Tensor, q_draft: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor
) -> torch.Tensor:
    """``hsd_expected_accepted`` with the uncapped final coin."""
    return hsd_expected_accepted(p_draft, q_draft, draft_probs, target_probs, capped=False)


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

