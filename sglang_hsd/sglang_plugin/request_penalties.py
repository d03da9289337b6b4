"""Exact penalties in HSD's verify: SGLang's requests read into ``sglang_hsd.penalties``.

SGLang's speculative verify (``eagle_utils.eagle_sample``) adds the batch's accumulated penalties
(``SamplingBatchInfo.acc_additive_penalties`` / ``acc_scaling_penalties`` [bs, V]) to every row of
a request alike, and those accumulate only the last token of each round
(``ScheduleBatch.cumulate_penalty_output_tokens`` in ``eagle_prepare_for_decode``). Inside an HSD
verify call ``verify_hook.make_verify_entry`` instead

1. builds ``RequestPenalties`` from each request's own parameters and its whole committed output
   (``req.output_ids``, which ends with the round's root), as the non-speculative sampler's
   penalizers see them (``batch_penalties``);
2. penalises each verify row with that output plus the drafted tokens on the row's own path
   (``penalise_verify_logits``), in place, as SGLang penalises its rows;
3. runs SGLang's ``eagle_sample`` on a copy of the batch whose sampling info carries no
   accumulated penalties, so nothing is applied twice. ``logit_bias`` (the same at every row) and
   grammar masks stay SGLang's.

Imports no SGLang module: tests drive it with stand-ins for SGLang's requests and verify input.
"""

from __future__ import annotations

import torch

from sglang_hsd.penalties import RequestPenalties, penalise_rows


def stop_token_ids(req) -> set[int]:
    """The ids SGLang's ``min_new_tokens`` penalizer forbids for ``req`` (its stop ids, the model's
    EOS ids and the tokenizer's additional stop and EOS ids; ``BatchedMinNewTokensPenalizer``)."""
    tokenizer = req.tokenizer
    ids = (set(req.sampling_params.stop_token_ids or ()) | set(req.eos_token_ids or ())
           | set(getattr(tokenizer, "additional_stop_token_ids", None) or ()))
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is not None:
        ids.add(eos)
    return {i for i in ids if i is not None}


def batch_penalties(reqs, vocab_size: int, device, dtype: torch.dtype = torch.float32) -> RequestPenalties:
    """``RequestPenalties`` of SGLang ``Req`` objects: their sampling parameters and committed
    output (prompt tokens are not penalised, as in SGLang's penalizers)."""
    params = [req.sampling_params for req in reqs]
    min_new = [int(p.min_new_tokens or 0) for p in params]
    return RequestPenalties.build(
        [list(req.output_ids) for req in reqs], vocab_size,
        frequency=[float(p.frequency_penalty) for p in params],
        presence=[float(p.presence_penalty) for p in params],
        repetition=[float(p.repetition_penalty) for p in params],
        min_new_tokens=min_new,
        stop_tokens=[stop_token_ids(req) if m > 0 else set() for req, m in zip(reqs, min_new)],
        device=device, dtype=dtype)


def penalise_verify_logits(logits: torch.Tensor, candidates: torch.Tensor, next_token: torch.Tensor,
                           next_sibling: torch.Tensor, penalties: RequestPenalties) -> None:
    """Penalise a verify round's logits in place, each row with its own path.

    Args:
        logits: float [bs * N, V], the target's verify logits (request b's rows contiguous).
        candidates: int [bs, N], the round's node tokens (column 0 the root).
        next_token / next_sibling: int [bs, N], the tree's first-child / next-sibling links
            (the drafted links of a sampled tree; a chain's for chains).
        penalties: the requests' ``batch_penalties``.
    """
    batch, width = candidates.shape
    penalise_rows(logits.view(batch, width, -1), penalties, candidates, next_token, next_sibling, inplace=True)


def has_penalties(sampling_info) -> bool:
    """Whether SGLang accumulated penalties for the batch (some request has one)."""
    return (sampling_info.acc_additive_penalties is not None
            or sampling_info.acc_scaling_penalties is not None)
