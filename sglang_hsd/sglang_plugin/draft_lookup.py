"""``--hsd-draft-lookup N``: prompt-lookup copies below the draft language model, a third level
under the target (lookup -> draft model -> target).

A chain round of L drafts runs L - 1 draft-model forwards of one row per request: entry n + i
reads draft d_{i+1} and gives q_{i+2}, the law of the next draft (n: the committed length; draft
KV layout as in ``draft_cache_rows.py``). Code and chat answers re-type spans of their prompt, so
the tokens after the latest earlier occurrence of the current suffix
(``lookup_draft.lookup_continuation``) are a free guess at what the draft model will draw next.
With the lookup, a request that has drafted t tokens runs one forward over its last draft and the
m copies c_{t+1} .. c_{t+m} (entries n + t - 1 .. n + t - 1 + m, one EXTEND batch for all
requests, ragged), which gives the m + 1 rows q_{t+1} .. q_{t+m+1}; it draws d_{t+1} from the
first row and, while d_{t+j} = c_{t+j}, d_{t+j+1} from the next. So one forward hands up r + 1
drafts where r copies matched, and the round needs as few as one forward.

Lossless, and the same law as the round without the lookup: row j + 1 is the draft model's
q given d_{t+1} .. d_{t+j} exactly when those drafts equal the copies the row read, which is when
it is used; each draft is drawn from its row alone (the request's temperature and top-k, SGLang's
``sample_draft_proposal`` with the position and draft step SGLang's own loop would use, so a seeded
request draws the same stream), and its q goes up to the target's verifier. Comparing the draw with
the copy is the token-wise verification of a one-hot draft (accept c with probability q(c),
else draw from q without c), the lookup level's own verification.

KV: every entry is written into the slot ``req_to_token`` maps it to (the slots the verify window
shares, allocated before drafting); the entries after a mismatch read a wrong copy and are written
again by the next forward, which starts at the first of them. When the round ends, entries
n .. n + L - 2 hold d_1 .. d_{L-1}, as after SGLang's loop, so its draft extends (window or tail)
run unchanged.

Cost: on CPU a forward's cost grows with its rows, so rejected copies are not free
(``--hsd-draft-lookup-copies`` caps them); ``/server_info`` (``hsd.draft_lookup``) reports the
forwards and rows run against the chain's, and the copies accepted.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass

import torch

from sglang_hsd.lookup_draft import lookup_continuation
from sglang_hsd.sglang_plugin.draft_lookup_setting import LOOKUP_FLAG, LookupSetting

logger = logging.getLogger(__name__)

__all__ = ["DraftLookup", "LookupStats", "build_lookup", "matched_run"]


def matched_run(copies: torch.Tensor, drawn: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Drafts one lookup forward hands up per request: 1 + the leading copies its draws matched.

    Args:
        copies: int64 [A, M], request a's copies in columns < lengths[a] (the rest ignored).
        drawn: int64 [A, M + 1], the draw from each forward row (row j read copy j - 1).
        lengths: int64 [A], m_a <= M copies per request.
    Returns:
        int64 [A], r + 1 with r the largest count such that drawn[a, :r] == copies[a, :r] and
        r <= m_a: draws 0..r are kept, draw j + 1 only once draw j equalled the copy row j + 1 read.
    """
    width = copies.shape[1]
    columns = torch.arange(width, device=copies.device)
    same = (drawn[:, :width] == copies) & (columns < lengths.unsqueeze(-1))
    return same.to(torch.int64).cumprod(dim=-1).sum(dim=-1) + 1


@dataclass
class LookupStats:
    """Counters of one scheduler process, reported in ``/server_info`` (``hsd.draft_lookup``).

    Fields:
        rounds: request-rounds drafted with the lookup.
        forwards: draft-model forwards run (one per sub-round, all requests together).
        chain_forwards: what SGLang's loop would have run for the same rounds (L - 1 each).
        rows: forward rows run (a request's last draft and its copies per sub-round).
        chain_rows: rows SGLang's loop would have run (L - 1 per request-round).
        proposed / accepted: copies shown to / matched by the draft model's draws.
        drafted: drafts handed up to the target.
        seconds: the lookups, forwards and draws.
    """

    rounds: int = 0
    forwards: int = 0
    chain_forwards: int = 0
    rows: int = 0
    chain_rows: int = 0
    proposed: int = 0
    accepted: int = 0
    drafted: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class _Chain:
    """One round's chains, request by request (B requests, L drafts, V tokens).

    Fields:
        context: B int64 tensors [n + 1 + L]: committed tokens then the drafts so far.
        committed: int64 [B], n.
        tokens: int64 [B, L] drafts; probs: float [B, L, V] their q (None: an all-greedy batch).
        drafted: int64 [B], t, drafts so far (>= 1: the first comes from the draft extend).
    """

    context: list
    committed: torch.Tensor
    tokens: torch.Tensor
    probs: torch.Tensor | None
    drafted: torch.Tensor


class DraftLookup:
    """The lookup level of one draft worker (``HSDStandaloneDraftWorker.hsd_lookup``).

    ``begin`` (from the draft worker's ``draft``, with SGLang's ``ScheduleBatch``) takes the
    requests' committed tokens; ``draft`` replaces ``draft_forward``'s loop for a chain round.

    Args:
        setting: the flags' values.
        forward, draw: the draft model's forward over a sub-round's rows and the draw of each
            row's draft (default: ``_forward_rows`` / ``_draw``, SGLang's); the exact tests pass a
            model with its own KV and enumerate the draws.
    """

    def __init__(self, setting: LookupSetting, forward=None, draw=None) -> None:
        if not setting.enabled:
            raise ValueError(f"{LOOKUP_FLAG}: DraftLookup needs a longest n-gram >= 1")
        self.setting = setting
        self._forward = forward or _forward_rows
        self._draw = draw or _draw
        self.stats = LookupStats()
        self._history: list | None = None  # B int64 tensors [n + 1]

    def begin(self, batch) -> None:
        """A round of ``batch`` is about to draft: record each request's committed tokens (prompt
        and output, n + 1 of them with n its committed length)."""
        history = []
        for req, committed in zip(batch.reqs, batch.seq_lens.tolist()):
            ids = list(req.origin_input_ids) + list(req.output_ids)
            if len(ids) != int(committed) + 1:
                raise RuntimeError(
                    f"{LOOKUP_FLAG}: request {req.rid} has {len(ids)} tokens at committed length "
                    f"{committed}; expected committed + 1 (pass {LOOKUP_FLAG} off)")
            history.append(torch.tensor(ids, dtype=torch.int64))
        self._history = history

    def as_dict(self) -> dict:
        return {"enabled": True, "ngram": self.setting.ngram, "copies": self.setting.copies,
                **self.stats.as_dict()}

    @torch.no_grad()
    def draft(self, worker, forward_batch):
        """The round's chain of L = ``worker.speculative_num_steps`` drafts per request.

        Args:
            worker: the ``HSDStandaloneDraftWorker`` (draft runner, token pool, preallocated
                chain topology).
            forward_batch: the round's draft DECODE batch (B requests); its ``spec_info`` holds
                the first draft (``topk_index`` [B, 1]) and its q (``draft_probs`` [B, V]).
        Returns:
            SGLang's ``draft_forward`` outputs for a chain: (parents, score indices, drafts
            int64 [B, L], q float [B, L, V] or None for an all-greedy batch).
        """
        started = time.perf_counter()
        chain = self._start(worker, forward_batch)
        steps = chain.tokens.shape[1]
        while bool((chain.drafted < steps).any()):
            self._sub_round(worker, forward_batch, chain)
        size = forward_batch.batch_size
        self.stats.rounds += size
        self.stats.chain_forwards += steps - 1
        self.stats.chain_rows += size * (steps - 1)
        self.stats.drafted += size * steps
        self.stats.seconds += time.perf_counter() - started
        return (worker._topk1_parents_prealloc[:size], worker._topk1_score_indices_prealloc[:size],
                chain.tokens, chain.probs)

    def _start(self, worker, forward_batch) -> _Chain:
        spec_info = forward_batch.spec_info
        steps = int(worker.speculative_num_steps)
        size = forward_batch.batch_size
        if self._history is None or len(self._history) != size:
            raise RuntimeError(f"{LOOKUP_FLAG}: the round's committed tokens were not recorded "
                               "before drafting (DraftLookup.begin)")
        first = spec_info.topk_index[:, 0].to(torch.int64)
        tokens = first.new_zeros(size, steps)
        tokens[:, 0] = first
        probs = None
        if not forward_batch.sampling_info.is_all_greedy:
            probs = spec_info.draft_probs.new_zeros(size, steps, spec_info.draft_probs.shape[-1])
            probs[:, 0] = spec_info.draft_probs.reshape(size, -1)
        committed = torch.tensor([ids.shape[0] - 1 for ids in self._history], dtype=torch.int64)
        context = [torch.cat([ids, first[b:b + 1].cpu(), ids.new_zeros(steps - 1)])
                   for b, ids in enumerate(self._history)]
        self._history = None
        return _Chain(context, committed, tokens, probs, torch.ones(size, dtype=torch.int64))

    def _copies(self, chain: _Chain, active: list) -> list:
        """Each active request's copies: up to the room its chain has left (the last draft
        needs no row) and the copy cap."""
        steps = chain.tokens.shape[1]
        out = []
        for b in active:
            drafted = int(chain.drafted[b])
            room = steps - 1 - drafted
            if self.setting.copies is not None:
                room = min(room, self.setting.copies)
            end = int(chain.committed[b]) + 1 + drafted
            out.append(lookup_continuation(chain.context[b][:end], self.setting.ngram, room)
                       if room > 0 else chain.context[b].new_empty(0))
        return out

    def _sub_round(self, worker, forward_batch, chain: _Chain) -> None:
        """One forward of every request still drafting over its last draft and its copies, a draw
        from every row, and the draws kept up to the first that differs from its copy."""
        active = (chain.drafted < chain.tokens.shape[1]).nonzero().squeeze(-1).tolist()
        copies = self._copies(chain, active)
        lengths = torch.tensor([c.shape[0] for c in copies], dtype=torch.int64)  # m per request
        device = chain.tokens.device
        rows_in = [torch.cat([chain.tokens[b, int(chain.drafted[b]) - 1:int(chain.drafted[b])].cpu(), c])
                   for b, c in zip(active, copies)]
        first_entry = chain.committed[active] + chain.drafted[active] - 1  # the last draft's entry
        logits = self._forward(worker, forward_batch, torch.tensor(active, dtype=torch.int64),
                               first_entry, lengths + 1, torch.cat(rows_in).to(device))
        # Row j of a request that has drafted t tokens gives draft t + j + 1 (0-based index t + j).
        draft_index = torch.cat([chain.drafted[b] + torch.arange(int(n) + 1) for b, n in zip(active, lengths)])
        owner = torch.tensor(active, dtype=torch.int64).repeat_interleave(lengths + 1)
        drawn, q = self._draw(logits, forward_batch.sampling_info, owner,
                              chain.committed[owner] + draft_index, draft_index, chain.probs is not None)
        self._keep(chain, active, copies, lengths, drawn.cpu(), q)
        self.stats.forwards += 1
        self.stats.rows += int((lengths + 1).sum())
        self.stats.proposed += int(lengths.sum())

    def _keep(self, chain: _Chain, active: list, copies: list, lengths: torch.Tensor,
              drawn: torch.Tensor, q: torch.Tensor | None) -> None:
        """Append to each active request's chain its draws up to the first that differs from the
        copy its next row read (``matched_run``). ``drawn`` int64 [sum(lengths + 1)] and ``q``
        [same, V] (or None) hold the requests' rows one request after another."""
        starts = (torch.cumsum(lengths + 1, 0) - (lengths + 1)).tolist()
        width = int(lengths.max())
        padded_copies = torch.full((len(active), width), -1, dtype=torch.int64)
        padded_drawn = torch.full((len(active), width + 1), -2, dtype=torch.int64)
        for a, (c, start, n) in enumerate(zip(copies, starts, lengths.tolist())):
            padded_copies[a, :n] = c
            padded_drawn[a, :n + 1] = drawn[start:start + n + 1]
        kept = matched_run(padded_copies, padded_drawn, lengths)
        for a, b in enumerate(active):
            t, keep, start = int(chain.drafted[b]), int(kept[a]), starts[a]
            chain.tokens[b, t:t + keep] = padded_drawn[a, :keep].to(chain.tokens.device)
            if q is not None:
                chain.probs[b, t:t + keep] = q[start:start + keep]
            end = int(chain.committed[b]) + 1 + t
            chain.context[b][end:end + keep] = padded_drawn[a, :keep]
            chain.drafted[b] = t + keep
        self.stats.accepted += int((kept - 1).sum())


def build_lookup(setting: LookupSetting) -> DraftLookup | None:
    """The lookup level of ``setting`` (None when ``--hsd-draft-lookup`` is off); the server
    arguments refused it wherever it cannot run (``draft_lookup_setting.lookup_problems``)."""
    if not setting.enabled:
        return None
    logger.info("HSD: prompt-lookup level below the draft model (longest n-gram %d, copies %s)",
                setting.ngram, "as many as fit" if setting.copies is None else setting.copies)
    return DraftLookup(setting)


def _forward_rows(worker, template, requests, first_entry, lengths, input_ids) -> torch.Tensor:
    """One EXTEND forward of the draft model over entries ``first_entry .. first_entry + lengths
    - 1`` of ``requests`` (int64 [A] rows of the round's draft batch ``template``), reading
    ``input_ids`` (int64 [sum(lengths)]); returns the logits of every row, float [sum(lengths), V]."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

    from sglang_hsd.sglang_plugin.forward_batches import catch_up_extend_batch
    from sglang_hsd.sglang_plugin.layer_range import lm_head_logits

    device = input_ids.device
    requests, first_entry, lengths = (t.to(device) for t in (requests, first_entry, lengths))
    owner = torch.arange(requests.numel(), device=device).repeat_interleave(lengths)
    starts = torch.cumsum(lengths, 0) - lengths
    positions = first_entry[owner] + torch.arange(owner.numel(), device=device) - starts[owner]
    pool_rows = template.req_pool_indices.to(torch.int64)[requests]
    slots = worker.req_to_token_pool.req_to_token[pool_rows[owner], positions].to(torch.int64)
    fb = catch_up_extend_batch(template, requests, first_entry, lengths, input_ids, positions, slots)
    several = bool((lengths > 1).any())
    if several:  # the rows before each request's last come from the hidden states
        fb.capture_hidden_mode = CaptureHiddenMode.FULL
    out = worker.draft_runner.forward(fb).logits_output
    last = out.next_token_logits.float()  # [A, V]
    if not several:
        return last
    model = worker.draft_runner.model
    logits = last.new_empty(owner.numel(), last.shape[-1])
    is_last = torch.zeros(owner.numel(), dtype=torch.bool, device=device)
    is_last[starts + lengths - 1] = True
    logits[is_last] = last
    logits[~is_last] = lm_head_logits(model, out.hidden_states[~is_last], last.shape[-1])
    return logits


def _draw(logits, sampling, owner, positions, draft_index, with_q: bool):
    """Each row's draft and its q, as SGLang's draft loop draws them.

    Args:
        logits: float [R, V]; owner: int64 [R], each row's request in the batch.
        positions: int64 [R], the drawn draft's position n + k - 1 (k: its 1-based index in the
            chain); draft_index: int64 [R], k - 1, SGLang's draft step for that draft.
        with_q: False for an all-greedy batch (argmax, no q).
    Returns:
        (drafts int64 [R], q float [R, V] or None).
    """
    if not with_q:
        return logits.argmax(dim=-1), None
    from sglang.srt.speculative import spec_utils

    device = logits.device
    drawn = torch.empty(logits.shape[0], dtype=torch.int64, device=device)
    q = torch.empty_like(logits)
    seed = sampling.sampling_seed
    for step in draft_index.unique().tolist():  # SGLang's draw takes one draft step per call
        rows = (draft_index == step).nonzero().squeeze(-1).to(device)
        who = owner[rows.cpu()].to(device)
        probs, _, ids = spec_utils.sample_draft_proposal(
            logits[rows], sampling.temperatures[who], sampling.top_ks[who],
            sampling_seed=None if seed is None else seed[who],
            positions=positions[rows.cpu()].to(device), draft_step=int(step))
        drawn[rows] = ids.reshape(-1).to(torch.int64)
        q[rows] = probs.to(q.dtype)
    return drawn, q
