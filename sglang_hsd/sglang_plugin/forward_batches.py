"""``ForwardBatch`` views of a verify window, for the exit level's partial forwards.

A round's verify window holds W = K + 1 positions per request (s..s+K, SGLang's TARGET_VERIFY
batch: root + K drafts, one pre-allocated KV slot each, ``req_to_token`` already mapping the
positions to those slots). The exit level runs forwards over parts of it:

* ``window_extend_batch``: an EXTEND batch over a contiguous run of window positions per request
  (its prefix is everything before the run), for some of the requests: layers [L, N) over the
  kept chain, and layers [0, L) over an exit sub-round's positions;
* ``draft_decode_batch``: a DECODE batch of one token per request for the EAGLE-3 draft model
  (the draft continuation of an exit sub-round);
* ``catch_up_extend_batch``: an EXTEND batch of a draft language model over each request's
  missing draft positions (``draft_catch_up.py``), from the round's draft DECODE batch.

All are shallow copies of a batch SGLang built, with the per-request fields cut to the chosen
requests; the attention metadata is re-planned by ``ModelRunner.forward``.
"""

from __future__ import annotations

import copy

import torch

# Per-request ForwardBatch fields that a request subset must cut (None fields are left alone).
_PER_REQUEST_FIELDS = ("req_pool_indices", "orig_seq_lens", "req_pool_indices_cpu")
_PER_REQUEST_LISTS = ("mm_inputs", "rids", "lora_ids", "top_logprobs_nums", "token_ids_logprobs")


def _cut_requests(fb, requests: torch.Tensor) -> None:
    """Keep the per-request fields of ``requests`` (int64 [A]) in ``fb`` (in place)."""
    fb.batch_size = int(requests.numel())
    cpu_requests = requests.cpu()
    for name in _PER_REQUEST_FIELDS:
        value = getattr(fb, name, None)
        if value is not None:
            setattr(fb, name, value[requests if value.device == requests.device else cpu_requests])
    for name in _PER_REQUEST_LISTS:
        value = getattr(fb, name, None)
        if isinstance(value, list):
            setattr(fb, name, [value[i] for i in cpu_requests.tolist()])
    fb.sampling_info = None  # the partial forwards compute no sampled logits
    fb.spec_info = None
    fb.return_logprob = False
    fb.residual_stream = None
    fb.forward_metadata_ready = False


def _make_extend(fb, input_ids: torch.Tensor, positions: torch.Tensor, out_cache_loc: torch.Tensor,
                 prefix: torch.Tensor, lengths: torch.Tensor) -> None:
    """Turn ``fb`` (already cut to its A requests) into an EXTEND batch of ``lengths[i]`` rows
    after a prefix of ``prefix[i]`` positions per request (both [A], ``seq_lens``' dtype); the
    rows' ``input_ids``, ``positions`` and ``out_cache_loc`` are int64 [sum(lengths)]. No hidden
    states are captured."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode

    fb.forward_mode = ForwardMode.EXTEND
    fb.input_ids = input_ids
    fb.positions = positions
    fb.out_cache_loc = out_cache_loc
    fb.seq_lens = prefix + lengths
    fb.seq_lens_cpu = fb.seq_lens.cpu()
    fb.seq_lens_sum = int(fb.seq_lens_cpu.sum())
    fb.extend_seq_lens = lengths
    fb.extend_prefix_lens = prefix
    fb.extend_start_loc = torch.cumsum(lengths, 0) - lengths
    fb.extend_seq_lens_cpu = lengths.tolist()
    fb.extend_prefix_lens_cpu = prefix.tolist()
    fb.extend_logprob_start_lens_cpu = lengths.tolist()
    fb.extend_num_tokens = int(input_ids.numel())
    fb.capture_hidden_mode = CaptureHiddenMode.NULL
    # The template's count of real (unpadded) tokens: SGLang runs attention on that many rows
    # only (``padded_extend_real_tokens``), so a count copied from a one-token-per-request
    # decode batch would leave every later row of a request unattended.
    count = fb.extend_num_tokens
    fb.global_num_token_non_padded_cpu = count
    for name in ("global_num_token_non_padded", "num_token_non_padded"):
        if getattr(fb, name, None) is not None:
            setattr(fb, name, torch.tensor(count, dtype=getattr(fb, name).dtype,
                                           device=input_ids.device))


def window_extend_batch(verify_batch, requests: torch.Tensor, start: torch.Tensor,
                        length: torch.Tensor, input_ids: torch.Tensor | None = None):
    """An EXTEND batch over window positions ``start .. start + length - 1`` of ``requests``.

    Args:
        verify_batch: SGLang's TARGET_VERIFY ``ForwardBatch`` (B requests x W window rows,
            ``seq_lens`` = committed lengths s).
        requests: int64 [A], the requests to run (in this order).
        start, length: int64 [A]; 0 <= start, 1 <= length, start + length <= W.
        input_ids: int64 [B * W] tokens of the window rows (default: the verify batch's).
    Returns:
        (forward batch over sum(length) tokens, int64 [sum(length)] window row of each token,
        i.e. b * W + j).
    """
    width = verify_batch.input_ids.shape[0] // verify_batch.batch_size
    offsets = torch.arange(int(length.max()), device=start.device)
    kept = offsets.unsqueeze(0) < length.unsqueeze(1)
    rows = (requests.unsqueeze(1) * width + start.unsqueeze(1) + offsets)[kept]
    committed = verify_batch.seq_lens[requests]
    prefix = committed + start.to(committed.dtype)
    fb = copy.copy(verify_batch)
    _cut_requests(fb, requests)
    ids = verify_batch.input_ids if input_ids is None else input_ids
    _make_extend(fb, ids[rows], verify_batch.positions[rows], verify_batch.out_cache_loc[rows],
                 prefix, length.to(committed.dtype))
    return fb, rows


def draft_decode_batch(draft_batch, requests: torch.Tensor, input_ids: torch.Tensor,
                       positions: torch.Tensor, out_cache_loc: torch.Tensor,
                       hidden_states: torch.Tensor):
    """A DECODE batch of one token per request for the EAGLE-3 draft model.

    Args:
        draft_batch: the round's draft-decode ``ForwardBatch`` (B requests, one token each).
        requests: int64 [A] into its B requests.
        input_ids, positions, out_cache_loc: int64 [A]: the token each draft entry reads, the
            entry's position (it attends to the draft KV of positions <= it) and its KV slot.
        hidden_states: [A, D], the draft model's hidden input (its previous entry's output).
    """
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    fb = copy.copy(draft_batch)
    spec_info = copy.copy(draft_batch.spec_info)
    _cut_requests(fb, requests)
    fb.forward_mode = ForwardMode.DECODE
    fb.input_ids = input_ids
    fb.positions = positions
    fb.out_cache_loc = out_cache_loc
    fb.seq_lens = (positions + 1).to(draft_batch.seq_lens.dtype)
    fb.seq_lens_cpu = fb.seq_lens.cpu()
    fb.seq_lens_sum = int(fb.seq_lens_cpu.sum())
    spec_info.hidden_states = hidden_states
    fb.spec_info = spec_info
    return fb


def catch_up_extend_batch(draft_batch, requests: torch.Tensor, prefix: torch.Tensor,
                          lengths: torch.Tensor, input_ids: torch.Tensor, positions: torch.Tensor,
                          out_cache_loc: torch.Tensor):
    """An EXTEND batch of the draft model over positions ``prefix .. prefix + lengths - 1`` of
    ``requests`` (its prefix is the draft KV before them); the logits of each request's last row
    come back (SGLang's extend logits).

    Args:
        draft_batch: the round's draft DECODE ``ForwardBatch`` (B requests).
        requests, prefix, lengths: int64 [A]; lengths >= 1.
        input_ids, positions, out_cache_loc: int64 [sum(lengths)], request by request: the token
            each row reads, its position and its KV slot.
    """
    fb = copy.copy(draft_batch)
    _cut_requests(fb, requests)
    dtype = draft_batch.seq_lens.dtype
    _make_extend(fb, input_ids, positions, out_cache_loc, prefix.to(dtype), lengths.to(dtype))
    return fb
