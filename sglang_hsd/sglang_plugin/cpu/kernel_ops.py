"""Plain-torch stand-ins for the ``sgl_kernel`` CPU ops SGLang 0.5.23's speculative path calls.

Each function has the op's name and argument order, works in place as the op does, and says in
its docstring which SGLang call site it serves. ``SGL_KERNEL_CPU_OPS`` are attributes of the
``sgl_kernel`` module, ``SGL_KERNEL_TORCH_OPS`` are reached as ``torch.ops.sgl_kernel.<name>``;
``cpu_shims.install_sgl_kernel_shim`` puts both where SGLang looks. This module must not import
SGLang (it runs before SGLang is imported).
"""

from __future__ import annotations

import ctypes

import torch


def copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc) -> None:
    """Torch version of ``sgl_kernel.copy_all_layer_kv_cache_cpu`` (SGLang's ``cache_move.py``).

    The op works on raw buffers: for every layer buffer ``i`` (address ``data_ptrs[i]``, row size
    ``strides[i]`` bytes), row ``tgt_loc[j]`` receives a copy of row ``src_loc[j]``. All sources
    are read before any row is written, as the kernel does.

    Args:
        data_ptrs: uint64 [num_buffers] addresses of the per-layer KV buffers (CPU memory).
        strides: int64 [num_buffers] bytes per slot row.
        tgt_loc, src_loc: int [N] slot indices.
    """
    tgt = tgt_loc.to(torch.int64)
    src = src_loc.to(torch.int64)
    if tgt.numel() == 0:
        return
    num_rows = int(torch.maximum(tgt.max(), src.max())) + 1
    for ptr, stride in zip(data_ptrs.tolist(), strides.tolist()):
        raw = (ctypes.c_uint8 * (num_rows * int(stride))).from_address(int(ptr))
        rows = torch.frombuffer(raw, dtype=torch.uint8).view(num_rows, int(stride))
        rows[tgt] = rows[src].clone()


def _attend(q, keys, values, sm_scale, logit_cap, causal_offset=None):
    """softmax(q k^T * scale) v for one request. q [Tq, Hq, D], keys/values [Tk, Hkv, D*].

    ``causal_offset``: query i sees keys j <= causal_offset + i (None: sees all)."""
    group = q.shape[1] // keys.shape[1]
    k = keys.float().repeat_interleave(group, dim=1)
    v = values.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * sm_scale
    if logit_cap and logit_cap > 0:
        scores = logit_cap * torch.tanh(scores / logit_cap)
    if causal_offset is not None:
        qi = torch.arange(q.shape[0]).unsqueeze(1)
        kj = torch.arange(keys.shape[0]).unsqueeze(0)
        scores = scores.masked_fill((kj > causal_offset + qi).unsqueeze(0), float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v)


def _check_plain_attention(is_cross, window, sinks, what):
    if is_cross or (window is not None and window > 0) or sinks is not None:
        raise NotImplementedError(
            f"sglang-hsd's torch {what} supports plain causal self-attention only "
            "(no cross attention, sliding window or sinks)"
        )


def decode_attention_cpu(q, k_buffer, v_buffer, k_scale, v_scale, o, k_new, v_new, loc,
                         attn_logits, req_to_token, req_pool_indices, seq_lens, sm_scale,
                         logit_cap, is_cross, window_plus_one, encoder_lens, sinks) -> None:
    """Torch version of ``torch.ops.sgl_kernel.decode_attention_cpu`` (one new token per row).

    Writes ``k_new``/``v_new`` [bs, Hkv, D] at slots ``loc`` [bs], then attends the row's first
    ``seq_lens[b]`` slots ``req_to_token[req_pool_indices[b]]``; output into ``o`` [bs, Hq, Dv].
    ``attn_logits`` (the kernel's split-K scratch) is unused.
    """
    _check_plain_attention(is_cross, window_plus_one - 1, sinks, "decode_attention_cpu")
    if k_new is not None and v_new is not None:
        k_buffer[loc.long()] = k_new.to(k_buffer.dtype).view(-1, *k_buffer.shape[1:])
        v_buffer[loc.long()] = v_new.to(v_buffer.dtype).view(-1, *v_buffer.shape[1:])
    for b in range(q.shape[0]):
        slots = req_to_token[req_pool_indices[b], : int(seq_lens[b])].long()
        keys = k_buffer[slots].float() * k_scale
        values = v_buffer[slots].float() * v_scale
        o[b] = _attend(q[b : b + 1], keys, values, sm_scale, logit_cap)[0].to(o.dtype)


def extend_attention_cpu(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, k_scale,
                         v_scale, req_to_token, req_pool_indices, seq_lens, extend_seq_lens,
                         extend_start_loc, max_extend_len, sm_scale, logit_cap, is_cross,
                         window_plus_one, encoder_lens, sinks, tree_mask, is_causal) -> None:
    """Torch version of ``torch.ops.sgl_kernel.extend_attention_cpu``.

    Request b has ``seq_lens[b]`` tokens of which the last ``extend_seq_lens[b]`` are new (rows
    ``extend_start_loc[b]:`` of ``q_extend``/``k_extend``/``v_extend``); the prefix is read from
    the cache through ``req_to_token``. New tokens attend causally. A tree mask (topk > 1 verify)
    is not supported.
    """
    _check_plain_attention(is_cross, window_plus_one - 1, sinks, "extend_attention_cpu")
    if tree_mask is not None and tree_mask.numel() > 0:
        raise NotImplementedError("sglang-hsd's torch extend_attention_cpu has no tree mask")
    for b in range(seq_lens.shape[0]):
        start, length = int(extend_start_loc[b]), int(extend_seq_lens[b])
        prefix = int(seq_lens[b]) - length
        slots = req_to_token[req_pool_indices[b], :prefix].long()
        keys = torch.cat([k_buffer[slots].float() * k_scale, k_extend[start : start + length].float()])
        values = torch.cat([v_buffer[slots].float() * v_scale,
                            v_extend[start : start + length].float()])
        out = _attend(q_extend[start : start + length], keys, values, sm_scale, logit_cap,
                      causal_offset=prefix if is_causal else None)
        o_extend[start : start + length] = out.to(o_extend.dtype)


def build_draft_decode_metadata_cpu(req_to_token, req_pool_indices, seq_lens, topk, num_steps,
                                    pool_len):
    """Torch version of ``sgl_kernel.build_draft_decode_metadata_cpu`` for topk = 1 chains.

    With one draft branch the draft tokens sit in the request's own ``req_to_token`` row right
    after the prefix, so the expanded table is the batch's rows. Returns int [bs, pool_len].
    """
    if topk != 1:
        raise NotImplementedError("sglang-hsd's torch draft metadata supports topk = 1 only")
    return req_to_token[req_pool_indices.long(), :pool_len].clone()


def assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset,
                                 out_cache_loc, pool_len) -> None:
    """Torch version of ``sgl_kernel.assign_req_to_token_pool_cpu``.

    For request b, ``req_to_token[req_pool_indices[b], start_offset[b]:end_offset[b]]`` receives
    the next ``end_offset[b] - start_offset[b]`` entries of the flat ``out_cache_loc``.
    """
    lengths = (end_offset - start_offset).tolist()
    begin = 0
    for b, length in enumerate(lengths):
        row, start = int(req_pool_indices[b]), int(start_offset[b])
        req_to_token[row, start : start + length] = out_cache_loc[begin : begin + length].to(
            req_to_token.dtype)
        begin += length


def assign_draft_cache_locs_contiguous_cpu(req_pool_indices, req_to_token, seq_lens, out_cache_loc,
                                           pool_len, topk, num_cols) -> None:
    """``out_cache_loc[b*w:(b+1)*w] = req_to_token[req_pool_indices[b], seq_lens[b]:+w]``,
    w = topk * num_cols (the draft steps' slots, reserved right after the prefix)."""
    width = topk * num_cols
    for b in range(seq_lens.shape[0]):
        start = int(seq_lens[b])
        out_cache_loc[b * width : (b + 1) * width] = req_to_token[
            int(req_pool_indices[b]), start : start + width].to(out_cache_loc.dtype)


def assign_extend_cache_locs_cpu(req_pool_indices, req_to_token, start_offset, end_offset,
                                 out_cache_loc, pool_len) -> None:
    """Gather ``req_to_token[req_pool_indices[b], start[b]:end[b]]`` for every b, concatenated
    into ``out_cache_loc`` (the inverse of ``assign_req_to_token_pool_cpu``)."""
    begin = 0
    for b in range(start_offset.shape[0]):
        start, end = int(start_offset[b]), int(end_offset[b])
        out_cache_loc[begin : begin + end - start] = req_to_token[
            int(req_pool_indices[b]), start:end].to(out_cache_loc.dtype)
        begin += end - start


def fill_bonus_tokens_cpu(accept_tokens, accept_lens, bonus_tokens, accept_stride) -> None:
    """``bonus_tokens[b] = accept_tokens.flat[accept_stride * b + accept_lens[b] - 1]``."""
    flat = accept_tokens.reshape(-1)
    index = torch.arange(accept_lens.shape[0]) * int(accept_stride) + accept_lens.long() - 1
    bonus_tokens.copy_(flat[index].to(bonus_tokens.dtype))


def fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, accept_out_cache_loc) -> None:
    """Compact the cache slots of accepted nodes: entries of ``accept_index`` != -1, in order."""
    flat = accept_index.reshape(-1).long()
    kept = flat[flat != -1]
    accept_out_cache_loc[: kept.numel()] = out_cache_loc[kept].to(accept_out_cache_loc.dtype)


def build_tree_kernel_efficient_cpu(parent_list, top_scores_index, seq_lens, tree_mask, positions,
                                    retrive_index, retrive_next_token, retrive_next_sibling, topk,
                                    spec_steps, num_verify_tokens, tree_mask_mode) -> None:
    """``sgl_kernel.build_tree_kernel_efficient_cpu`` for topk = 1 (a chain: root + drafts).

    Node j of request b is global index b*N + j, its position seq_lens[b] + j, its next token
    j + 1 and it has no siblings. The tree mask is a causal chain: the full mask (N x (prefix+N)
    per request, flattened) or the draft-only N x N mask, whichever size ``tree_mask`` has.
    """
    if topk != 1:
        raise NotImplementedError("sglang-hsd's torch tree builder supports topk = 1 only")
    bs, n = seq_lens.shape[0], int(num_verify_tokens)
    slot = torch.arange(n)
    positions.copy_((seq_lens.long().unsqueeze(1) + slot).reshape(-1).to(positions.dtype))
    retrive_index.copy_((torch.arange(bs).unsqueeze(1) * n + slot).to(retrive_index.dtype))
    nxt = torch.where(slot + 1 < n, slot + 1, -1).expand(bs, n)
    retrive_next_token.copy_(nxt.to(retrive_next_token.dtype))
    retrive_next_sibling.fill_(-1)
    causal = slot.unsqueeze(0) <= slot.unsqueeze(1)  # [N, N]
    if tree_mask.numel() == bs * n * n:
        tree_mask.copy_(causal.expand(bs, n, n).reshape(tree_mask.shape).to(tree_mask.dtype))
        return
    total = int((seq_lens.long() * n + n * n).sum())
    if tree_mask.numel() >= total:
        begin = 0
        for b in range(bs):
            prefix = int(seq_lens[b])
            rows = torch.cat([torch.ones(n, prefix, dtype=torch.bool), causal], dim=1)
            tree_mask.view(-1)[begin : begin + rows.numel()] = rows.reshape(-1).to(tree_mask.dtype)
            begin += rows.numel()
        return
    raise NotImplementedError(
        f"sglang-hsd's torch tree builder: unexpected tree_mask size {tree_mask.numel()} "
        f"(mode {tree_mask_mode})")


def verify_tree_greedy_cpu(predicts, accept_index, accept_token_num, candidates, retrive_index,
                           retrive_next_token, retrive_next_sibling, target_predict) -> None:
    """``sgl_kernel.verify_tree_greedy_cpu``: walk the tree from the root, following the child
    whose token equals the target argmax at the current node (siblings in order)."""
    bs = candidates.shape[0]
    for b in range(bs):
        cur, accepted = 0, 0
        accept_index[b, 0] = retrive_index[b, 0]
        while True:
            child = int(retrive_next_token[b, cur])
            want = int(target_predict[b, cur])
            while child != -1 and int(candidates[b, child]) != want:
                child = int(retrive_next_sibling[b, child])
            if child == -1 or accepted + 1 >= accept_index.shape[1]:
                break
            predicts[int(retrive_index[b, cur])] = want
            accepted += 1
            accept_index[b, accepted] = retrive_index[b, child]
            cur = child
        predicts[int(retrive_index[b, cur])] = int(target_predict[b, cur])
        accept_token_num[b] = accepted


# Ops SGLang's CPU speculative path reaches in 0.5.23 (found by running the CPU server).
SGL_KERNEL_CPU_OPS = {
    "copy_all_layer_kv_cache_cpu": copy_all_layer_kv_cache_cpu,
    "build_draft_decode_metadata_cpu": build_draft_decode_metadata_cpu,
    "assign_req_to_token_pool_cpu": assign_req_to_token_pool_cpu,
    "assign_draft_cache_locs_contiguous_cpu": assign_draft_cache_locs_contiguous_cpu,
    "assign_extend_cache_locs_cpu": assign_extend_cache_locs_cpu,
    "fill_bonus_tokens_cpu": fill_bonus_tokens_cpu,
    "fill_accept_out_cache_loc_cpu": fill_accept_out_cache_loc_cpu,
    "build_tree_kernel_efficient_cpu": build_tree_kernel_efficient_cpu,
    "verify_tree_greedy_cpu": verify_tree_greedy_cpu,
}
_U32 = 0xFFFFFFFF


def _rotl32(x: torch.Tensor, r: int) -> torch.Tensor:
    return ((x << r) | (x >> (32 - r))) & _U32


def _murmur3_mix(h: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    k = _rotl32((k * 0xCC9E2D51) & _U32, 15)
    k = (k * 0x1B873593) & _U32
    h = _rotl32(h ^ k, 13)
    return (h * 5 + 0xE6546B64) & _U32


def murmur_hash32_cpu(seed: torch.Tensor, positions: torch.Tensor,
                      col_indices: torch.Tensor) -> torch.Tensor:
    """uint32 [n, m] = MurmurHash3 of (seed[i] (64 bit), positions[i], col_indices[j]), the same
    blocks in the same order as SGLang's Triton ``murmur_hash32_kernel`` (seeded sampling and
    verify coins). int64 arithmetic: every product is masked back to 32 bits, and two's-complement
    wrap-around keeps the low 32 bits exact."""
    seed = seed.to(torch.int64).view(-1, 1)
    h = torch.zeros_like(seed)
    h = _murmur3_mix(h, seed & _U32)
    h = _murmur3_mix(h, (seed >> 32) & _U32)
    h = _murmur3_mix(h, positions.to(torch.int64).view(-1, 1) & _U32)
    h = _murmur3_mix(h, col_indices.to(torch.int64).view(1, -1) & _U32)
    h = h ^ 16
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & _U32
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & _U32
    h = h ^ (h >> 16)
    return h.to(torch.uint32)


murmur_hash32_cpu.default = murmur_hash32_cpu  # called as torch.ops.sgl_kernel.<name>.default


# Ops SGLang reaches as ``torch.ops.sgl_kernel.<name>`` (the intel_amx attention backend, the only
# CPU backend SGLang's EAGLE draft path accepts).
SGL_KERNEL_TORCH_OPS = {
    "decode_attention_cpu": decode_attention_cpu,
    "extend_attention_cpu": extend_attention_cpu,
    "murmur_hash32_cpu": murmur_hash32_cpu,
}
