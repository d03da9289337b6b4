"""``verify_chain``: input checks, then dispatch through ``CHAIN_METHODS`` to the torch reference or
the Triton kernel; and ``expected_accepted_per_length``, the exact acceptance of fixed drafts."""

from __future__ import annotations

import warnings

import torch

from sglang_hsd.verify.chain.methods import CHAIN_METHODS, ChainMethod
from sglang_hsd.verify.chain.types import ChainVerifyResult
from sglang_hsd.verify.common import ChainUniforms, use_triton
from sglang_hsd.verify.validation import (
    check_drafted_tokens_have_mass,
    check_prob_rows,
    check_token_ids,
    check_uniforms,
)


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
            ``None`` for methods that do not read q (``greedy``).
        target_probs: float [B, K + 1, V]; row K is the bonus distribution after the draft.
        method: a key of ``CHAIN_METHODS``.
        generator: torch generator for the uniforms (ignored if ``uniforms`` is given).
        uniforms: pre-drawn ``ChainUniforms`` (accept [B, K], sample [B]); makes two
            implementations comparable token for token.
        validate: check inputs (synchronises with the device); pass ``False`` on hot paths once
            the caller is known to be correct.
        backend: ``"auto"`` (Triton on CUDA when the method has a kernel, torch otherwise),
            ``"torch"`` or ``"triton"`` (on CPU only under ``TRITON_INTERPRET=1``).
        draft_lengths: optional int64 [B] in [1, K]: row b drafted only its first K_b tokens
            (ragged drafts, e.g. a level that buffers "until N tokens", or a request near its
            length limit). Row K_b of ``target_probs`` is then row b's bonus distribution; later
            rows and tokens are ignored (tokens must still be valid ids).
    Returns:
        ``ChainVerifyResult``; ``num_accepted[b] <= draft_lengths[b]``.
    """
    rule = _lookup(method)
    if validate:
        _validate_chain(draft_tokens, draft_probs, target_probs, rule, draft_lengths)
    if rule.warning is not None:
        _warn_once(rule.warning)
    batch, num_draft = draft_tokens.shape
    # Drawn for every method, deterministic ones included, so a shared generator advances the same
    # way whichever method runs.
    if uniforms is None:
        uniforms = ChainUniforms.draw(batch, num_draft, target_probs.device, generator)
    elif validate:
        check_uniforms("uniforms.accept", uniforms.accept, (batch, num_draft))
        check_uniforms("uniforms.sample", uniforms.sample, (batch,))
    if use_triton(backend, method, CHAIN_METHODS, "chain", target_probs):
        from sglang_hsd.verify.chain import triton as kernels

        return getattr(kernels, rule.triton_kernel)(draft_tokens, draft_probs, target_probs, uniforms, draft_lengths)
    return rule.reference(draft_tokens, draft_probs, target_probs, uniforms, draft_lengths)


def expected_accepted_per_length(
    tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor, method: str
) -> torch.Tensor:
    """Exact expected accepted tokens given each draft, for every draft length K' = 1..K.

    No coins are drawn: this is the expectation over the verifier's randomness for the fixed draft
    (truncated to its first K' tokens), which is what benchmarks compare methods on.

    Args:
        tokens: int64 [N, K]; draft_probs: float [N, K, V]; target_probs: float [N, K + 1, V].
        method: a key of ``CHAIN_METHODS`` with an ``expected_accepted`` formula (``tokenwise``,
            ``hsd``, ``hsd-paper``).
    Returns:
        float64 [N, K]; column K' - 1 is E[accepted | first K' draft tokens].
    """
    rule = _lookup(method)
    if rule.expected_accepted is None:
        with_formula = sorted(name for name, m in CHAIN_METHODS.items() if m.expected_accepted is not None)
        raise ValueError(f"method must be one of {with_formula} (an exact acceptance formula), got {method!r}")
    q, p = draft_probs, target_probs
    idx = tokens.unsqueeze(-1)
    p_draft = p[:, :-1].gather(-1, idx).squeeze(-1).double()
    q_draft = q.gather(-1, idx).squeeze(-1).double()
    num_draft = tokens.shape[1]
    out = torch.zeros(tokens.shape[0], num_draft, dtype=torch.float64)
    for k in range(1, num_draft + 1):
        out[:, k - 1] = rule.expected_accepted(
            p_draft[:, :k], q_draft[:, :k], q[:, :k].double(), p[:, : k + 1].double()
        )
    return out


def _lookup(method: str) -> ChainMethod:
    if method not in CHAIN_METHODS:
        raise ValueError(f"method must be one of {sorted(CHAIN_METHODS)}, got {method!r}")
    return CHAIN_METHODS[method]


def _validate_chain(draft_tokens, draft_probs, target_probs, rule: ChainMethod, draft_lengths=None) -> None:
    """Raise ``ValueError`` naming the argument on malformed input (shapes as ``verify_chain``)."""
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
        if rule.reads_q:
            without_q = ", ".join(repr(name) for name, m in CHAIN_METHODS.items() if not m.reads_q)
            raise ValueError(f"draft_probs is required for method {rule.name!r} (only {without_q} ignores it)")
        return
    if tuple(draft_probs.shape) != (batch, num_draft, vocab):
        raise ValueError(
            f"draft_probs must have shape [B, K, V] = [{batch}, {num_draft}, {vocab}] "
            f"(the target's vocabulary), got {list(draft_probs.shape)}"
        )
    used_draft = used_target[:, 1:]  # draft position t is used iff t < K_b, i.e. t + 1 <= K_b
    check_prob_rows("draft_probs", draft_probs[used_draft])
    if rule.reads_q:
        q_draft = draft_probs.gather(-1, draft_tokens.long().unsqueeze(-1)).squeeze(-1)
        check_drafted_tokens_have_mass(draft_tokens, torch.where(used_draft, q_draft, 1.0))


def _warn_once(message: str) -> None:
    # Python's default warning filter shows a warning once per call site, so this warns once;
    # stacklevel 3 names verify_chain's caller.
    warnings.warn(message, stacklevel=3)
