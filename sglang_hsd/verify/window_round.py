"""The windowed two-level round: drafts -> one early exit -> full target, in one verify window.

Pure torch; the model work is passed in, so the SGLang plugin (``sglang_plugin/exit_level.py``,
SGLang's forwards) and the runtime (``runtime/window.py``, ``HierarchyConfig(window=True)``) run
the same rule, and tests drive it with tabular worlds.

One round for a request whose last emitted token r sits at position s (its KV not yet written):

1. The drafter (SGLang: the EAGLE-3 head) drafts d_1..d_K from q_1..q_K.
2. Layers [0, L) run on r, d_1..d_K (positions s..s+K); the exit head gives m_1..m_{K+1}
   (m_j: the exit's distribution of the token at position s + j).
3. ``exit_round``: ``verify_chain(d, q, m)`` accepts a drafts and draws y (from m's residual, or
   m's bonus row when a = K). The exit level proposes the chain c = (d_1..d_a, y), a + 1 tokens,
   each with its m row as q.
4. Layers [L, N) run only on positions s..s+a (tokens r, d_1..d_a: all have [0, L) state), giving
   the target's p_1..p_{a+1}.
5. ``target_round``: ``verify_chain(c, m, p)``; if it rejects at tau < a + 1 the request emits
   c_1..c_tau and the target's resampled z; if it accepts all a + 1 tokens it emits c itself and
   *no bonus token* (the bonus would need the target at position s + a + 1, i.e. y's own forward;
   a bonus is a fresh draw from p given the accepted prefix, so leaving it to the next round does
   not change the output law).

Either way the emitted tokens are (accepted drafts, one last token), which is SGLang's round shape:
the last token becomes the next round's root and every accepted draft has valid KV in all layers.

With an exit buffer N_i > 1 (the server's ``--hsd-exit-buffer``), steps 1-3 repeat inside the
round's verify window (positions s..s+K) before step 4: while fewer than N_i tokens are
provisional (n) and n < K, the drafter drafts K - n more tokens after the last provisional one,
layers [0, L) run on that token and the new drafts, and ``exit_round`` (with ragged
``draft_lengths``) appends its accepted drafts and its own token; steps 4-5 then verify all n
provisional tokens (``exit_sub_rounds``). The
stopping rule depends only on what the exit level has produced (a stopping time), so each exit
sub-round is a lossless chain rule step of the exit's own law and the target sees a chain that
follows the exit's law; exact enumeration of this rule is in the same test file. A request also
stops once its chain holds a stop token or every token it may still emit (``exit_sub_rounds``'s
``stop_ids`` / ``remaining``), a stopping time as well.

Lossless: step 3 makes c follow the exit's own autoregressive law (a lossless chain rule), step 5
verifies c against the target with a lossless chain rule. That the random chain length (which
for ``hsd`` depends on drafts beyond c) and the dropped bonus keep the output law exact is checked
by exact enumeration in ``tests/verify/test_window_round.py`` (TV ~1e-16 on 2-4-token
prefixes, both methods at both levels). Greedy (one-hot rows) is exact token for token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_hsd.verify import ChainUniforms, ChainVerifyResult, verify_chain
from sglang_hsd.verify.coupled import coupled_chain


@dataclass
class ExitProposal:
    """What the exit level hands to the target, per request (B requests, K drafts).

    Fields:
        exit_accepted: int64 [B], a: drafts the exit accepted.
        chain_tokens: int64 [B, K + 1], c_1..c_{a+1} then -1 padding.
        chain_len: int64 [B], a + 1.
        chain_probs: float [B, K + 1, V], row j = the exit's distribution c_{j+1} was drawn from
            (= m_{j+1}; rows beyond a are m rows too, unused).
        drafted: int64 [B], drafts the exit level verified (all sub-rounds).
        lower_positions: int64 [B], verify positions that ran layers [0, L) (all sub-rounds).
        sub_accepted: int64 [B, S], drafts accepted in each of S exit sub-rounds (-1: the
            request had no such sub-round).
    """

    exit_accepted: torch.Tensor
    chain_tokens: torch.Tensor
    chain_len: torch.Tensor
    chain_probs: torch.Tensor
    drafted: torch.Tensor | None = None
    lower_positions: torch.Tensor | None = None
    sub_accepted: torch.Tensor | None = None


def exit_round(draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None,
               exit_probs: torch.Tensor, method: str, uniforms: ChainUniforms,
               validate: bool = False, draft_lengths: torch.Tensor | None = None) -> ExitProposal:
    """One exit sub-round: the exit level verifies the drafter's drafts.

    Args:
        draft_tokens: int64 [B, K].
        draft_probs: float [B, K, V], the q each draft was sampled from; None for greedy drafts
            (then ``method`` must be "greedy").
        exit_probs: float [B, K + 1, V], m_1..m_{K+1} (sampling transforms applied).
        method: "hsd", "tokenwise" or "greedy".
        uniforms: ``ChainUniforms`` (accept [B, K], sample [B]); independent of the target's.
        draft_lengths: int64 [B] in [1, K], drafts per request (None: all K); row b's exit token
            comes from ``exit_probs[b, draft_lengths[b]]`` when all its drafts are accepted.
    """
    result = verify_chain(draft_tokens, draft_probs, exit_probs, method=method,
                          uniforms=uniforms, validate=validate, draft_lengths=draft_lengths)
    accepted = result.num_accepted.to(torch.int64)
    batch, num_draft = draft_tokens.shape
    slot = torch.arange(num_draft + 1, device=draft_tokens.device).unsqueeze(0)
    chain = torch.where(slot <= accepted.unsqueeze(1), result.tokens.to(torch.int64), -1)
    drafted = (torch.full((batch,), num_draft, dtype=torch.int64, device=accepted.device)
               if draft_lengths is None else draft_lengths.to(torch.int64))
    return ExitProposal(accepted, chain, accepted + 1, exit_probs, drafted=drafted,
                        lower_positions=drafted + 1, sub_accepted=accepted.unsqueeze(1))


def exit_sub_rounds(first: ExitProposal, buffer: int, method: str, draft, exit_rows, uniforms,
                    validate: bool = False, remaining: torch.Tensor | None = None,
                    stop_ids: torch.Tensor | None = None) -> ExitProposal:
    """Exit sub-rounds after ``first`` inside the verify window, until every request holds
    ``buffer`` (N_i) provisional tokens, has no room for another draft (n >= K), or is finished:
    its chain holds one of its ``stop_ids`` or ``remaining`` tokens (what it may still emit).

    A sub-round of request b with n provisional tokens c_1..c_n (c_n at window index n, position
    s + n) drafts k = K - n tokens after c_n, verifies them against the exit's rows of window
    indices n..n+k and appends the a accepted drafts and the exit's own token. The model work is
    injected, so SGLang's forwards (``sglang_plugin/exit_level.py``), the runtime's
    (``runtime/window.py``) and tabular worlds (the tests) run the same rule:

    Args:
        first: the first sub-round's proposal (K drafts over the whole window; its
            ``chain_probs`` [B, K + 1, V] is the table of exit rows: row j = the exit's
            distribution of position s + j + 1).
        buffer: N_i.
        method: the exit's chain rule ("hsd", "tokenwise" or "greedy").
        draft: ``(requests, last_token, last_index, counts, sub_round) -> (drafts int64
            [A, k_max] (-1 padding), q float [A, k_max, V] or None)``.
        exit_rows: ``(requests, last_index, run_tokens, counts) -> float [A, K + 1, V]``, the
            requests' whole table of exit rows after the exit level ran on window indices
            last_index .. last_index + counts (``run_tokens`` int64 [A, k_max + 1]: c_n and the
            drafts there).
        uniforms: ``(requests, sub_round, k_max) -> ChainUniforms`` (accept [A, k_max],
            sample [A]); fresh for every sub-round (sub_round = 1, 2, ...).
        remaining: int64 [B] or None (no budget).
        stop_ids: int64 [B, S] (-1 padding) or None: tokens that end a request (EOS).
    Returns:
        The round's ``ExitProposal``: chain c_1..c_n, ``chain_probs`` the final table (its rows
        0..n-1 are the rows each c_j was drawn from), counters summed over sub-rounds.
    """
    num_draft = first.chain_tokens.shape[1] - 1
    state = ExitProposal(first.exit_accepted.clone(), first.chain_tokens.clone(),
                         first.chain_len.clone(), first.chain_probs.clone(),
                         drafted=first.drafted.clone(),
                         lower_positions=first.lower_positions.clone())
    sub_accepted = [first.exit_accepted]
    limit = torch.full_like(state.chain_len, min(buffer, num_draft))
    if remaining is not None:
        limit = torch.minimum(limit, remaining.to(limit.dtype))
    sub_round = 1
    while True:
        active = state.chain_len < limit
        if stop_ids is not None:  # stopping at a finished chain is a stopping time too
            active &= ~_holds_stop_token(state.chain_tokens, state.chain_len, stop_ids)
        if not bool(active.any()):
            break
        reqs = active.nonzero().squeeze(-1)
        this_round = torch.full_like(state.chain_len, -1)
        this_round[reqs] = _sub_round(state, reqs, sub_round, method, draft, exit_rows, uniforms,
                                      validate)
        sub_accepted.append(this_round)
        sub_round += 1
    state.sub_accepted = torch.stack(sub_accepted, dim=1)
    return state


def _holds_stop_token(chain: torch.Tensor, chain_len: torch.Tensor, stop_ids: torch.Tensor
                      ) -> torch.Tensor:
    """bool [B]: the first ``chain_len`` [B] tokens of ``chain`` [B, K + 1] hold one of the
    request's ``stop_ids`` [B, S] (-1 padding)."""
    slot = torch.arange(chain.shape[1], device=chain.device).unsqueeze(0)
    in_chain = slot < chain_len.unsqueeze(1)
    hit = (chain.unsqueeze(-1) == stop_ids.unsqueeze(1)) & (stop_ids >= 0).unsqueeze(1)
    return (hit.any(-1) & in_chain).any(-1)


def _sub_round(state: ExitProposal, reqs: torch.Tensor, sub_round: int, method: str, draft,
               exit_rows, uniforms, validate: bool) -> torch.Tensor:
    """One exit sub-round of requests ``reqs`` (int64 [A]) of ``exit_sub_rounds``: appends its
    accepted drafts and the exit's token to ``state`` in place; returns the drafts accepted [A]."""
    num_draft = state.chain_tokens.shape[1] - 1
    last = state.chain_len[reqs]
    counts = num_draft - last
    last_token = state.chain_tokens[reqs, last - 1]
    drafts, q = draft(reqs, last_token, last, counts, sub_round)
    span = torch.arange(drafts.shape[1] + 1, device=reqs.device).unsqueeze(0)
    run_tokens = torch.cat([last_token.unsqueeze(1), drafts], dim=1)
    req_table = exit_rows(reqs, last, run_tokens, counts)
    state.chain_probs[reqs] = req_table.to(state.chain_probs.dtype)
    m_rows = req_table.gather(1, (last.unsqueeze(1) + span).clamp(max=num_draft).unsqueeze(-1)
                              .expand(-1, -1, req_table.shape[-1]))
    step = exit_round(drafts.clamp_min(0), q, m_rows, method,
                      uniforms(reqs, sub_round, drafts.shape[1]), validate=validate,
                      draft_lengths=counts)
    taken = span <= step.exit_accepted.unsqueeze(1)
    slots = last.unsqueeze(1) + span
    rows = reqs.unsqueeze(1).expand_as(slots)
    state.chain_tokens[rows[taken], slots[taken]] = step.chain_tokens[taken]
    state.chain_len[reqs] += step.chain_len
    state.exit_accepted[reqs] += step.exit_accepted
    state.drafted[reqs] += counts
    state.lower_positions[reqs] += counts + 1
    return step.exit_accepted


def target_round(proposal: ExitProposal, target_probs: torch.Tensor, method: str,
                 uniforms: ChainUniforms, validate: bool = False, keyed: torch.Tensor | None = None
                 ) -> tuple[ChainVerifyResult, torch.Tensor]:
    """The target verifies the exit's chain; returns SGLang's round result.

    Args:
        proposal: from ``exit_round`` or ``exit_sub_rounds``.
        target_probs: float [B, K + 1, V]; rows 0..a are p_1..p_{a+1} (row j: the target's
            distribution of c_{j+1}); later rows must be valid distributions but are not used.
        uniforms: accept [B, K + 1], sample [B].
        keyed: int64 [B, K + 1] or None: a seeded batch's keyed draws of the target rows; the
            coupled rule (``coupled.coupled_chain``) then replaces ``method``.
    Returns:
        (``ChainVerifyResult`` with num_accepted [B] = accepted *drafts* (<= a) and tokens
        [B, K + 1] = the accepted drafts followed by the round's last token, then -1;
        int64 [B] chain tokens the target accepted, in [0, a + 1]).
    """
    chain_tokens = proposal.chain_tokens.clamp_min(0)
    # verify_chain wants a bonus row after the longest chain; it is drawn and then discarded.
    bonus_pad = target_probs[:, -1:]
    if keyed is not None:
        result = coupled_chain(chain_tokens, torch.cat([keyed, keyed[:, -1:]], dim=1),
                               draft_lengths=proposal.chain_len)
    else:
        result = verify_chain(
            chain_tokens, proposal.chain_probs, torch.cat([target_probs, bonus_pad], dim=1),
            method=method, uniforms=uniforms, draft_lengths=proposal.chain_len, validate=validate,
        )
    tau = result.num_accepted.to(torch.int64)
    took_all = tau >= proposal.chain_len
    num_accepted = torch.where(took_all, proposal.chain_len - 1, tau)
    tokens = torch.where(took_all.unsqueeze(1), proposal.chain_tokens,
                         result.tokens[:, : chain_tokens.shape[1]].to(torch.int64))
    slot = torch.arange(tokens.shape[1], device=tokens.device).unsqueeze(0)
    tokens = torch.where(slot <= num_accepted.unsqueeze(1), tokens, -1)
    target_accepted = torch.where(took_all, proposal.chain_len, tau)
    return ChainVerifyResult(num_accepted=num_accepted, tokens=tokens), target_accepted
