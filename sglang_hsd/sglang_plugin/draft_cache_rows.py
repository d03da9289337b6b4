"""Which draft-cache positions an extend of the draft language model must write
(``draft_catch_up.py``), as a :class:`CatchUpPlan`.

Draft KV layout (SGLang's EAGLE convention, kept by its STANDALONE worker): draft entry p reads
the committed token p + 1, so at the start of a round whose committed length is n the draft cache
holds entries 0..n-1 and its last row gives q of the first draft (token n + 1).

* ``stale_plan``: the catch-up of requests whose extends were skipped (rounds that drafted
  nothing) or whose draft prefill was deferred: each marked request's entries from its first
  missing one to n - 1.
* ``tail_plan`` (``--hsd-draft-extend tail``): after a drafting chain round, the entries its
  draft steps did not write. A round of L drafts runs L - 1 draft steps, which write entries
  n .. n + L - 2 (reading d_1 .. d_{L-1}) into the slots the verify window shares; once a drafts
  are accepted, entries n .. n + min(a, L - 1) - 1 already read the committed tokens and only
  entries n + min(a, L - 1) .. n + a are missing: one row per request (the bonus token, whose
  entry n + a the step of a rejected draft wrote) or two (d_L as well, which no step read, when
  every draft was accepted), where SGLang's extend reruns the whole window of L + 1 rows. On the
  2-core Xeon at batch 1 a window extend of 9 rows on the int4 draft copy took 108 ms, a
  one-token draft forward 36-53 ms (``benchmarks/results/torch_profile_xeon_humaneval_c1_l8_auto.md``);
  measured against the window extend in one serving run, the saving was smaller, about 33 ms per
  round of 8 drafts (median TPOT 87.6 -> 83.3 ms, ``benchmarks/README.md``, twenty-fifth run).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_hsd.sglang_plugin.draft_catch_up_setting import CATCH_UP_FLAG

# Attribute of SGLang's Req: the first draft-cache position its skipped extends left missing.
STALE_ATTR = "hsd_draft_stale_from"


@dataclass
class CatchUpPlan:
    """The missing draft positions of one round's marked requests (A of the batch's B).

    Fields:
        rows: int64 [A], the requests' rows in the batch.
        prefix: int64 [A], each one's first missing position s (the extend's prefix length).
        lengths: int64 [A], n - s >= 1 missing positions (n: the committed length).
        input_ids: int64 [sum(lengths)], the committed token p + 1 of each missing position p.
        positions: int64 [sum(lengths)], p.
        out_cache_loc: int64 [sum(lengths)], the KV slot of p (the target's, shared).
        reqs: the A SGLang ``Req`` s (their marks are cleared once the extend ran).
    """

    rows: torch.Tensor
    prefix: torch.Tensor
    lengths: torch.Tensor
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    reqs: list


def stale_plan(batch, device) -> CatchUpPlan | None:
    """The catch-up of ``batch``'s marked requests (``STALE_ATTR``: positions s .. n - 1 of a
    request whose committed length is n, reading its committed tokens s + 1 .. n), or None when
    none is marked. ``device``: where the plan's tensors go."""
    rows, prefix, lengths, tokens, reqs = [], [], [], [], []
    for row, (req, committed) in enumerate(zip(batch.reqs, batch.seq_lens.tolist())):
        stale = getattr(req, STALE_ATTR, None)
        if stale is None:
            continue
        committed = int(committed)
        ids = list(req.origin_input_ids) + list(req.output_ids)
        if len(ids) != committed + 1 or not 0 <= stale < committed:
            raise RuntimeError(
                f"{CATCH_UP_FLAG}: request {req.rid} has {len(ids)} tokens, committed length "
                f"{committed}, first missing draft position {stale}; expected committed + 1 "
                f"tokens and a position below the committed length (pass {CATCH_UP_FLAG} off)")
        rows.append(row)
        prefix.append(stale)
        lengths.append(committed - stale)
        tokens.extend(ids[stale + 1:committed + 1])
        reqs.append(req)
    if not rows:
        return None
    rows_t = torch.tensor(rows, dtype=torch.int64, device=device)
    prefix_t = torch.tensor(prefix, dtype=torch.int64, device=device)
    lengths_t = torch.tensor(lengths, dtype=torch.int64, device=device)
    positions = torch.cat([torch.arange(s, s + n, dtype=torch.int64, device=device)
                           for s, n in zip(prefix, lengths)])
    # req_to_token maps (request slot, position) to the KV slot the two pools share.
    pool_rows = batch.req_pool_indices[rows_t].to(torch.int64)
    slots = batch.req_to_token_pool.req_to_token[pool_rows.repeat_interleave(lengths_t), positions]
    return CatchUpPlan(rows=rows_t, prefix=prefix_t, lengths=lengths_t,
                       input_ids=torch.tensor(tokens, dtype=torch.int64, device=device),
                       positions=positions, out_cache_loc=slots.to(torch.int64), reqs=reqs)


def tail_plan(batch, batch_result, num_steps: int, width: int) -> CatchUpPlan:
    """The tail extend of a drafting chain round (module docstring): for each of the B requests,
    entries n + min(a, L - 1) .. n + a.

    Args:
        batch: SGLang's ``ScheduleBatch``; ``seq_lens``: n [B], the committed lengths before the
            round.
        batch_result: its ``GenerationBatchResult``: ``accept_lens`` a + 1 [B] and the committed
            tokens window by window, ``next_token_ids`` [B * W] (SGLang's window extend reads
            token j of request b's window at entry n + j).
        num_steps: L, the round's draft length (its draft steps ran L - 1 forwards).
        width: W = L + 1, the verify window.
    """
    accepted = batch_result.accept_lens.to(torch.int64) - 1  # a [B]
    written = accepted.clamp(max=num_steps - 1)  # entries n .. n + written - 1 read accepted drafts
    lengths = accepted - written + 1  # 1, or 2 when every draft was accepted
    size = int(accepted.numel())
    offsets = torch.arange(int(lengths.max()), device=accepted.device)
    window = (written.unsqueeze(-1) + offsets)[offsets < lengths.unsqueeze(-1)]  # window column
    owner = torch.arange(size, device=accepted.device).repeat_interleave(lengths)
    committed = batch.seq_lens.to(torch.int64)
    positions = committed[owner] + window
    pool_rows = batch.req_pool_indices.to(torch.int64)
    slots = batch.req_to_token_pool.req_to_token[pool_rows[owner], positions].to(torch.int64)
    prepared = batch_result.prepared_draft_extend_inputs
    tokens = batch_result.next_token_ids if prepared is None else prepared[2]
    return CatchUpPlan(rows=torch.arange(size, device=accepted.device), prefix=committed + written,
                       lengths=lengths, input_ids=tokens.to(torch.int64)[owner * width + window],
                       positions=positions, out_cache_loc=slots, reqs=[])
