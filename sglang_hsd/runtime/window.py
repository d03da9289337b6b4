"""Windowed rounds of the runtime (``HierarchyConfig(window=True)``: drafter -> one exit -> target).

Each round runs the rule of ``sglang_hsd/verify/window_round.py``, the one the SGLang plugin's exit
level runs, with the engine's model work injected, so the runtime and the server can be compared
round by round (``tests/sglang_plugin/test_exit_level_server.py``). For a row whose last committed
token r sits at position s (window index j = position s + j, j = 0..K, K = N_d):

* drafting (``draft``): the engine's level-0 drafter (an EAGLE-3 head, a separate model or an early
  exit) drafts K - n tokens after the n-th provisional token, so the drafts never pass s + K. An
  EAGLE-3 drafter reads target features only up to position s - 1, as in SGLang, where r's
  features come with the next verify forward;
* exit rows (``exit_rows``): layers [0, L) and the exit head over the window positions just drafted;
* ``exit_sub_rounds`` stops a row once n >= min(N_i, K), or once its chain holds an EOS token or
  every token the row may still emit;
* ``target_round``: layers [L, N) and the LM head over r, c_1..c_n; no bonus token when the
  target accepts all n (the bonus is a fresh draw from the target given the accepted prefix, so
  leaving it to the next round keeps the output law).

Caches follow the engine's rule (``engine.py``): each verification cuts every cache at its first
changed position. The exit's own token c_n of a sub-round is written, and the caches cut before
it, when the row drafts again or, after its last sub-round, before the target runs; the target
also runs on c_n's position, which the next round keeps when the target accepts the whole chain.
"""

from __future__ import annotations

import time
from typing import Protocol

import torch

from sglang_hsd.runtime.groups import advance
from sglang_hsd.verify import ChainUniforms, ChainVerifyResult
from sglang_hsd.verify.window_round import ExitProposal, exit_round, exit_sub_rounds, target_round

class WindowHost(Protocol):
    """What a windowed round reads and drives on the state of one ``generate`` call (the engine's
    run state implements it; tensors are per request row b of B, positions index ``tokens``).

    Fields:
        levels: (drafter, one ``exit`` level, target) level specs.
        tokens: int64 [B, max_len]; seq_len / prompt_len / max_new: int64 [B]; finished: bool [B].
        buf_start: per level below the target, int64 [B], where its unchecked buffer starts.
        buf_probs: per level below the target, float [B, cap, V], the rows its buffer was drawn from.
        level_group: per level, the layer group whose hidden states it reads.
        stats: per level, ``LevelStats``; trace: per-request round traces or None.
        eos: int64 [E]; max_len: int; generator: torch.Generator; gen: the ``SpeculativeGenerator``.
    """

    levels: list
    tokens: torch.Tensor
    seq_len: torch.Tensor
    prompt_len: torch.Tensor
    max_new: torch.Tensor
    finished: torch.Tensor
    buf_start: list
    buf_probs: list
    level_group: list
    stats: list
    trace: list | None
    eos: torch.Tensor
    max_len: int
    generator: torch.Generator
    gen: object

    def level_probs(self, k: int, idx: torch.Tensor, positions: torch.Tensor) -> torch.Tensor: ...

    def draft_tokens(self, rows: torch.Tensor, base: torch.Tensor, features_upto: torch.Tensor) -> None: ...

    def rollback(self, keep: torch.Tensor) -> None: ...

    def commit(self, idx: torch.Tensor) -> None: ...


class WindowRounds:
    """Runs one windowed round per ``round`` call on the state of one ``generate`` call.

    Args:
        run: the engine's run state (``WindowHost``); its levels are (drafter, one ``exit``
            level, target).
    """

    def __init__(self, run: WindowHost) -> None:
        self.run = run
        drafter, exit_level, target = run.levels
        self.num_draft = drafter.buffer  # K: the window holds r and K more tokens
        self.exit_buffer = exit_level.buffer  # N_i
        self.exit_method = exit_level.method
        self.target_method = target.method

    def round(self, rows: torch.Tensor) -> None:
        """One round for the unfinished rows ``rows`` (bool [B]): exit sub-rounds, the target's
        verification, commit; records statistics and, when asked for, the round trace."""
        run = self.run
        idx = rows.nonzero().squeeze(-1)
        root = run.seq_len[idx] - 1  # s per row
        drafting_seconds = run.stats[0].seconds
        start_time = time.perf_counter()
        proposal = self._exit_level(idx, root)
        n = proposal.chain_len
        self._place(idx, root + n, proposal.chain_tokens.gather(1, (n - 1).unsqueeze(1)).squeeze(1))
        exit_seconds = time.perf_counter() - start_time - (run.stats[0].seconds - drafting_seconds)
        run.stats[1].seconds += exit_seconds

        start_time = time.perf_counter()
        result, target_accepted = self._target_level(idx, root, proposal)
        emitted = self._keep(idx, root, result, target_accepted)
        self._count(idx, proposal, target_accepted, emitted)
        run.stats[2].seconds += time.perf_counter() - start_time

    def _exit_level(self, idx: torch.Tensor, root: torch.Tensor) -> ExitProposal:
        """Exit sub-rounds of rows ``idx`` (int64 [A]) until each holds its provisional chain."""
        run, num_draft = self.run, self.num_draft
        device = idx.device
        table = torch.zeros(idx.numel(), num_draft + 1, run.buf_probs[0].shape[-1], device=device)

        def draft(reqs, last_token, last, counts, sub_round):
            self._place(idx[reqs], root[reqs] + last, last_token)
            return self._draft(idx[reqs], root[reqs] + last, counts)

        def exit_rows(reqs, last, run_tokens, counts):
            # run_tokens (c_n and the drafts after it) are in run.tokens already: ``draft`` put them
            advance(run.level_group[1], run.tokens, run.seq_len)
            span = torch.arange(run_tokens.shape[1], device=device)
            probs = run.level_probs(1, idx[reqs], (root[reqs] + last).unsqueeze(-1) + span)
            fresh = span.unsqueeze(0) <= counts.unsqueeze(-1)  # window indices last .. K
            rows = reqs.unsqueeze(-1).expand_as(fresh)
            table[rows[fresh], (last.unsqueeze(-1) + span)[fresh]] = probs[fresh]
            return table[reqs]

        def uniforms(reqs, sub_round, width):
            return ChainUniforms.draw(reqs.numel(), width, device, run.generator)

        every = torch.arange(idx.numel(), device=device)
        start = torch.zeros_like(idx)
        full = torch.full_like(idx, num_draft)
        drafts, q = self._draft(idx, root, full)
        run_tokens = torch.cat([run.tokens[idx, root].unsqueeze(-1), drafts], 1)
        m = exit_rows(every, start, run_tokens, full)
        first = exit_round(drafts, q, m, self.exit_method, uniforms(every, 0, num_draft),
                           validate=run.gen.validate)
        remaining = (run.prompt_len + run.max_new - run.buf_start[1])[idx]
        stop_ids = run.eos.expand(idx.numel(), -1) if run.eos.numel() else None
        return exit_sub_rounds(first, self.exit_buffer, self.exit_method, draft, exit_rows,
                               uniforms, validate=run.gen.validate, remaining=remaining,
                               stop_ids=stop_ids)

    def _draft(self, idx: torch.Tensor, after: torch.Tensor, counts: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """The drafter's ``counts`` [A] tokens after position ``after`` [A] of rows ``idx`` [A]:
        (drafts int64 [A, k_max], -1 past a row's count; q float [A, k_max, V])."""
        run = self.run
        run.buf_start[0][idx] = after + 1
        rows = torch.zeros_like(run.finished)
        rows[idx] = True
        committed = run.buf_start[1]
        # The drafts count from r, so they stop at s + K. SGLang's drafter has no target features
        # for r yet (they come with the next verify): its entry is fed by the head's own output.
        run.draft_tokens(rows, base=committed, features_upto=committed - 1)
        span = torch.arange(int(counts.max()), device=idx.device)
        positions = (after.unsqueeze(-1) + 1 + span).clamp(max=run.max_len - 1)
        drafts = run.tokens[idx.unsqueeze(-1), positions]
        drafts = torch.where(span.unsqueeze(0) < counts.unsqueeze(-1), drafts, -1)
        return drafts, run.buf_probs[0][idx, : span.numel()]

    def _place(self, idx: torch.Tensor, position: torch.Tensor, token: torch.Tensor) -> None:
        """Write the exit's own token ``token`` [A] at ``position`` [A] of rows ``idx`` [A], the
        first position its sub-round changed: cut every cache there and end the rows after it."""
        run = self.run
        run.tokens[idx, position] = token
        keep = run.seq_len.clone()
        keep[idx] = position
        run.rollback(keep)
        run.seq_len[idx] = position + 1

    def _target_level(self, idx: torch.Tensor, root: torch.Tensor, proposal: ExitProposal
                      ) -> tuple[ChainVerifyResult, torch.Tensor]:
        """The target's rows over r, c_1..c_n and ``target_round`` (see ``window_round``)."""
        run, num_draft = self.run, self.num_draft
        advance(run.level_group[2], run.tokens, run.seq_len)
        width = int(proposal.chain_len.max())
        offsets = torch.arange(width + 1, device=idx.device)
        p = run.level_probs(2, idx, root.unsqueeze(-1) + offsets)  # [A, n_max + 1, V]
        # target_round reads rows 0..n - 1 of K + 1; the rest only need to be distributions.
        if p.shape[1] < num_draft + 1:
            p = torch.cat([p, p[:, -1:].expand(-1, num_draft + 1 - p.shape[1], -1)], 1)
        uniforms = ChainUniforms.draw(idx.numel(), num_draft + 1, idx.device, run.generator)
        return target_round(proposal, p[:, : num_draft + 1], self.target_method, uniforms,
                            validate=run.gen.validate)

    def _keep(self, idx: torch.Tensor, root: torch.Tensor, result: ChainVerifyResult,
              target_accepted: torch.Tensor) -> torch.Tensor:
        """Commit the round's tokens (the accepted chain tokens and the round's last token) and cut
        the caches at the first position the target changed. Returns the tokens kept after r,
        int64 [A] (before EOS / length cutting)."""
        run = self.run
        emitted = result.num_accepted.to(torch.int64) + 1
        last_token = result.tokens.gather(1, result.num_accepted.unsqueeze(-1).long()).squeeze(-1)
        run.tokens[idx, root + emitted] = last_token
        keep = run.seq_len.clone()
        keep[idx] = root + 1 + target_accepted  # full acceptance: c_n's position stays valid
        run.rollback(keep)
        new_len = root + 1 + emitted
        run.seq_len[idx] = new_len
        run.buf_start[0][idx] = new_len
        run.buf_start[1][idx] = new_len
        run.commit(idx)
        return emitted

    def _count(self, idx: torch.Tensor, proposal: ExitProposal, target_accepted: torch.Tensor,
               emitted: torch.Tensor) -> None:
        """Level statistics and, with ``trace_rounds``, one trace entry per row."""
        run = self.run
        exit_stats, target_stats = run.stats[1], run.stats[2]
        exit_stats.rounds += int((proposal.sub_accepted >= 0).sum())
        exit_stats.proposed += int(proposal.drafted.sum())
        exit_stats.accepted += int(proposal.exit_accepted.sum())
        target_stats.rounds += idx.numel()
        target_stats.proposed += int(proposal.chain_len.sum())
        target_stats.accepted += int(target_accepted.sum())
        if run.trace is None:
            return
        for row, subs, taken, kept in zip(idx.tolist(), proposal.sub_accepted.tolist(),
                                          target_accepted.tolist(), emitted.tolist()):
            run.trace.rounds[row].append({"exit_accepted": [a for a in subs if a >= 0],
                                          "target_accepted": taken, "emitted": kept})
