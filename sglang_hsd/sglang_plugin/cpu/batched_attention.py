"""One attention call for a whole batch of requests (the decode and extend stand-ins of
``kernel_ops.py``: plain decoding, a speculative verify, a draft step, a draft extend).

Why: a per-request loop pays a dozen small torch calls per request and layer; at batch 16 on the
2-core EPYC that Python overhead, the per-request cache gather and ``scaled_dot_product_attention``
on one query row cost ~250 ms a round of the 28-layer Qwen2.5-Coder-1.5B over ~512-token contexts,
and the extend variant (a one-token verify, which also concatenated the gathered keys) ~330 ms,
against ~120 ms for this batched form (``benchmarks/results/cpu_attention_batch.md``). Here every request's keys are gathered at once,
as whole token rows (one ``index_select``), padded to the longest request, and each KV head's
scores are two batched matmuls with an additive mask.

Shapes: ``B`` requests, ``Lq`` query rows per request (padded to the most), ``P`` cached keys per
request (padded), ``Ln`` new keys per request (padded; 0 for decode), ``Hq`` query heads,
``Hkv`` KV heads, ``G = Hq / Hkv`` (query head h reads KV head h // G), ``D`` head size.

This module must not import SGLang (it runs before SGLang is imported).
"""

from __future__ import annotations

import torch

# Below this many requests the callers keep their loop: one request's fused attention call
# costs less than the batched form's extra steps (at batch 1, 5-14 ms a 28-layer round of the
# 1.5B's attention against 7-18 ms batched, in a first run of bench_cpu_attention_batch.py).
BATCHED_MIN_REQUESTS = 2
# Above this many score entries (B * Hq * Lq * (P + Ln)) the callers keep their per-request loop:
# padding a long prefill to its batch's longest request would waste memory and work.
BATCHED_MAX_SCORES = 1 << 24


def padded_scores(batch: int, heads: int, query_rows: int, keys: int) -> int:
    """Score entries the batched form would hold (compare with ``BATCHED_MAX_SCORES``)."""
    return batch * heads * query_rows * keys


def gather_rows(buffer: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """``buffer`` ``[pool, Hkv, D]`` rows at ``slots`` int64 ``[B, T]`` -> float32
    ``[B, T, Hkv, D]``: one gather of whole token rows (a head-first layout would need a
    transposing copy, which costs as much as the gather on this memory-bound step)."""
    pool = buffer.shape[0]
    batch, width = slots.shape
    rows = buffer.reshape(pool, -1).index_select(0, slots.reshape(-1))
    return rows.view(batch, width, *buffer.shape[1:]).float()


def attend_batch(q: torch.Tensor, parts: list[tuple[torch.Tensor, torch.Tensor]], bias: torch.Tensor,
                 sm_scale: float) -> torch.Tensor:
    """softmax(q k^T * scale + bias) v for every request at once, the keys given in parts (a
    cached prefix and the new tokens) so that neither is copied into one tensor.

    Args:
        q: ``[B, Lq, Hq, D]``.
        parts: ``(keys, values)`` pairs, float32 ``[B, T_k, Hkv, D]`` / ``[B, T_k, Hkv, Dv]``;
            the key axis of the attention is their concatenation in order (``T = sum T_k``).
        bias: float32 ``[B, Lq, T]``, 0 where query row i sees key j, ``-inf`` where not. A row
            that sees nothing (padding) comes out NaN; callers drop those rows.

    Returns: float32 ``[B, Lq, Hq, Dv]``.

    One KV head at a time: its keys are a strided view of the gathered rows, which ``bmm`` reads
    in place.
    """
    batch, lq, hq, d = q.shape
    hkv, dv = parts[0][0].shape[2], parts[0][1].shape[3]
    group = hq // hkv
    out = torch.empty(batch, lq, hq, dv)
    for h in range(hkv):
        heads = slice(h * group, (h + 1) * group)
        # Rows ordered (query row, head in group) so one mask row serves the group's heads.
        qh = q[:, :, heads].float().reshape(batch, lq * group, d)
        scores = torch.cat([torch.bmm(qh, keys[:, :, h].transpose(1, 2)) for keys, _ in parts], dim=-1)
        scores.mul_(sm_scale).view(batch, lq, group, -1).add_(bias.view(batch, lq, 1, -1))
        probs = torch.softmax(scores, dim=-1)
        acc, start = None, 0
        for keys, values in parts:
            width = keys.shape[1]
            piece = torch.bmm(probs[..., start : start + width], values[:, :, h])  # [B, Lq * G, Dv]
            acc = piece if acc is None else acc.add_(piece)
            start += width
        out[:, :, heads] = acc.view(batch, lq, group, dv)
    return out


def prefix_bias(lengths: torch.Tensor, width: int, query_rows: int) -> torch.Tensor:
    """float32 ``[B, Lq, width]``: 0 on each request's first ``lengths[b]`` keys, ``-inf`` on the
    padding after them."""
    hidden = torch.arange(width).unsqueeze(0) >= lengths.unsqueeze(1)
    bias = torch.zeros(lengths.shape[0], width).masked_fill_(hidden, float("-inf"))
    return bias.unsqueeze(1).expand(-1, query_rows, -1)


def dequantized(rows, scale):
    """Cache rows in float32 times the cache's scale (a number or tensor; 1 / None: none)."""
    rows = rows.float()
    if scale is None or (isinstance(scale, (int, float)) and scale == 1):
        return rows
    return rows * scale


def _batchable(logit_cap, k_scale, v_scale) -> bool:
    """No logit cap, and cache scales that are one number (a per-head scale would need the
    loop's [T, Hkv, D] layout)."""
    scalar = all(s is None or isinstance(s, (int, float)) or s.numel() == 1 for s in (k_scale, v_scale))
    return not (logit_cap and logit_cap > 0) and scalar


def extend_batched(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, k_scale, v_scale,
                    req_to_token, req_pool_indices, seq_lens, extend_seq_lens, extend_start_loc,
                    sm_scale, logit_cap, tree_mask, is_causal) -> bool:
    """``extend_attention_cpu`` for all requests at once; False, having written nothing, for
    fewer than ``BATCHED_MIN_REQUESTS`` requests, a logit cap or per-head cache scale, padded
    scores above ``BATCHED_MAX_SCORES`` or a request that extends by nothing.
    Query row i of request b is row ``extend_start_loc[b] + i``; it sees the request's cached
    prefix and, among its new tokens, those ``tree_mask`` allows (None: i' <= i when
    ``is_causal``, else all)."""
    batch, heads = seq_lens.shape[0], q_extend.shape[1]
    lengths = extend_seq_lens.long()
    if (batch < BATCHED_MIN_REQUESTS or not _batchable(logit_cap, k_scale, v_scale)
            or int(lengths.min()) < 1):
        return False
    prefix = seq_lens.long() - lengths
    width, new = int(prefix.max()), int(lengths.max())
    if padded_scores(batch, heads, new, width + new) > BATCHED_MAX_SCORES:
        return False
    if new == 1 and (tree_mask is None or bool(tree_mask.all())):
        _one_row_extend(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, k_scale, v_scale,
                        req_to_token[req_pool_indices.long(), : width + 1].long(), prefix,
                        extend_start_loc.long(), sm_scale)
        return True
    steps = torch.arange(new)
    valid = steps.unsqueeze(0) < lengths.unsqueeze(1)  # [B, Ln]
    rows = extend_start_loc.long().unsqueeze(1) + torch.minimum(steps.unsqueeze(0), lengths.unsqueeze(1) - 1)
    slots = req_to_token[req_pool_indices.long(), :width].long()
    cached = (dequantized(gather_rows(k_buffer, slots), k_scale),
              dequantized(gather_rows(v_buffer, slots), v_scale))
    fresh = (k_extend[rows].float(), v_extend[rows].float())
    if tree_mask is not None:
        sees = torch.zeros(batch, new, new, dtype=torch.bool)
        begin = 0
        for b, length in enumerate(lengths.tolist()):
            sees[b, :length, :length] = tree_mask.reshape(-1)[begin : begin + length * length].view(length, length).bool()
            begin += length * length
    elif is_causal:
        sees = (steps.view(1, 1, new) <= steps.view(1, new, 1)).expand(batch, -1, -1)
    else:
        sees = torch.ones(batch, new, new, dtype=torch.bool)
    sees = sees & valid.unsqueeze(1)
    new_bias = torch.zeros(batch, new, new).masked_fill_(~sees, float("-inf"))
    bias = torch.cat([prefix_bias(prefix, width, new), new_bias], dim=2) if width > 0 else new_bias
    parts = [cached, fresh] if width > 0 else [fresh]
    out = attend_batch(q_extend[rows], parts, bias, sm_scale)  # [B, Ln, Hq, Dv]
    o_extend[rows[valid]] = out[valid].to(o_extend.dtype)
    return True


def _one_row_extend(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, k_scale, v_scale,
                    slots, prefix, rows, sm_scale) -> None:
    """``extend_batched`` when every request extends by one token (a verify round that drafted
    nothing): the new key is written into the gathered rows at its position, so each KV head's
    attention is one pair of matmuls over one key block, as in decode, instead of a cached block
    and a new one joined by a ``cat`` (the 1.5B's 28 layers at batch 16: 79 against 86 ms over
    ~512 cached tokens, 30 against 34 over ~128; ``benchmarks/results/cpu_attention_batch_onerow_*``).

    ``slots`` int64 ``[B, P + 1]`` (P: the longest prefix), ``prefix`` ``[B]``, ``rows`` ``[B]``:
    request b's new token is row ``rows[b]`` of ``q_extend`` / ``k_extend`` / ``v_extend``."""
    batch = prefix.shape[0]
    keys = dequantized(gather_rows(k_buffer, slots), k_scale)
    values = dequantized(gather_rows(v_buffer, slots), v_scale)
    at = (torch.arange(batch), prefix)
    keys[at] = k_extend[rows].float()
    values[at] = v_extend[rows].float()
    out = attend_batch(q_extend[rows].unsqueeze(1), [(keys, values)],
                       prefix_bias(prefix + 1, slots.shape[1], 1), sm_scale)
    o_extend[rows] = out[:, 0].to(o_extend.dtype)


def decode_batched(q, k_buffer, v_buffer, k_scale, v_scale, o, req_to_token, req_pool_indices,
                   seq_lens, sm_scale, logit_cap) -> bool:
    """``decode_attention_cpu``'s attention for all requests at once (the new token already
    written): q ``[B, Hq, D]``, request b attends its first ``seq_lens[b]`` slots; output into
    ``o`` ``[B, Hq, Dv]``. False, having written nothing, in the cases ``extend_batched``
    lists."""
    batch, heads = q.shape[0], q.shape[1]
    if batch < BATCHED_MIN_REQUESTS or not _batchable(logit_cap, k_scale, v_scale):
        return False  # before the longest length is read: one request's draft step pays no sync
    lengths = seq_lens.long()
    width = int(lengths.max())
    if not 0 < padded_scores(batch, heads, 1, width) <= BATCHED_MAX_SCORES:
        return False
    slots = req_to_token[req_pool_indices.long(), :width].long()
    part = (dequantized(gather_rows(k_buffer, slots), k_scale),
            dequantized(gather_rows(v_buffer, slots), v_scale))
    out = attend_batch(q.reshape(batch, 1, heads, -1), [part], prefix_bias(lengths, width, 1), sm_scale)
    o.copy_(out[:, 0].to(o.dtype).view_as(o))
    return True
