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

from sglang_hsd.counter_rng import murmur_hash32
from sglang_hsd.sglang_plugin.cpu.batched_attention import decode_batched, dequantized, extend_batched


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


def _attend(q, keys, values, sm_scale, logit_cap, causal_offset=None, visible=None):
    """softmax(q k^T * scale) v for one request. q [Tq, Hq, D], keys/values [Tk, Hkv, D*];
    returns float32 [Tq, Hq, Dv]. Query head h reads key/value head h // (Hq / Hkv).

    ``causal_offset``: query i sees keys j <= causal_offset + i (None: sees all).
    ``visible``: bool [Tq, Tk], which keys each query sees (None: all).

    Runs torch's fused attention (``scaled_dot_product_attention`` with grouped-query heads):
    the KV is read in place, never repeated per query head, which is what makes a verify or
    draft step over a long context cost what plain decoding's attention costs. A logit cap
    (not expressible there) takes the explicit path."""
    mask = visible
    if causal_offset is not None:
        seen = (torch.arange(keys.shape[0]).unsqueeze(0)
                <= causal_offset + torch.arange(q.shape[0]).unsqueeze(1))
        mask = seen if mask is None else mask & seen
    if logit_cap and logit_cap > 0:
        return _attend_capped(q, keys, values, sm_scale, logit_cap, mask)
    out = torch.nn.functional.scaled_dot_product_attention(
        q.float().transpose(0, 1).unsqueeze(0), keys.float().transpose(0, 1).unsqueeze(0),
        values.float().transpose(0, 1).unsqueeze(0), attn_mask=mask, scale=sm_scale,
        enable_gqa=True)
    return out[0].transpose(0, 1)


def _attend_row(q, keys, values, sm_scale):
    """``_attend`` for one query row without cap or mask: q [Hq, D], keys / values [Tk, Hkv, D*]
    -> float32 [Hq, Dv]. Two batched products per KV head group read the keys in place; at one
    row they cost about half of ``scaled_dot_product_attention``'s call (0.036 against 0.074 ms
    for 14 heads over 600 keys on a 2-core Xeon), which a draft step pays in every layer."""
    hkv = keys.shape[1]
    qh = q.float().reshape(hkv, -1, q.shape[-1])  # [Hkv, G, D]: head h reads KV head h // G
    scores = torch.bmm(qh, keys.float().permute(1, 2, 0)).mul_(sm_scale)  # [Hkv, G, Tk]
    out = torch.bmm(torch.softmax(scores, dim=-1), values.float().transpose(0, 1))  # [Hkv, G, Dv]
    return out.reshape(q.shape[0], -1)


def _attend_capped(q, keys, values, sm_scale, logit_cap, mask):
    """``_attend`` with scores capped as ``logit_cap * tanh(s / logit_cap)``; ``mask`` bool
    [Tq, Tk] or None."""
    group = q.shape[1] // keys.shape[1]
    k = keys.float().repeat_interleave(group, dim=1)
    v = values.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * sm_scale
    scores = logit_cap * torch.tanh(scores / logit_cap)
    if mask is not None:
        scores = scores.masked_fill(~mask.unsqueeze(0), float("-inf"))
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
    if decode_batched(q, k_buffer, v_buffer, k_scale, v_scale, o, req_to_token, req_pool_indices,
                      seq_lens, sm_scale, logit_cap):
        return
    for b in range(q.shape[0]):
        slots = req_to_token[req_pool_indices[b], : int(seq_lens[b])].long()
        keys = dequantized(k_buffer.index_select(0, slots), k_scale)
        values = dequantized(v_buffer.index_select(0, slots), v_scale)
        if logit_cap and logit_cap > 0:
            o[b] = _attend(q[b : b + 1], keys, values, sm_scale, logit_cap)[0].to(o.dtype)
        else:
            o[b] = _attend_row(q[b], keys, values, sm_scale).to(o.dtype)


def extend_attention_cpu(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, k_scale,
                         v_scale, req_to_token, req_pool_indices, seq_lens, extend_seq_lens,
                         extend_start_loc, max_extend_len, sm_scale, logit_cap, is_cross,
                         window_plus_one, encoder_lens, sinks, tree_mask, is_causal) -> None:
    """Torch version of ``torch.ops.sgl_kernel.extend_attention_cpu``.

    Request b has ``seq_lens[b]`` tokens of which the last ``extend_seq_lens[b]`` are new (rows
    ``extend_start_loc[b]:`` of ``q_extend``/``k_extend``/``v_extend``); the prefix is read from
    the cache through ``req_to_token``. Without a tree mask the new tokens attend causally.

    ``tree_mask`` (target verify of a draft tree, SGLang's QLEN_ONLY mode): bool, request b's
    ``L x L`` block (L = extend_seq_lens[b]) flattened after the blocks of requests < b; entry
    [i, j] says whether new token i sees new token j (its ancestors and itself). The prefix is
    always visible.
    """
    _check_plain_attention(is_cross, window_plus_one - 1, sinks, "extend_attention_cpu")
    masked = tree_mask is not None and tree_mask.numel() > 0
    if extend_batched(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, k_scale, v_scale,
                      req_to_token, req_pool_indices, seq_lens, extend_seq_lens, extend_start_loc,
                      sm_scale, logit_cap, tree_mask if masked else None, is_causal):
        return
    mask_begin = 0
    for b in range(seq_lens.shape[0]):
        start, length = int(extend_start_loc[b]), int(extend_seq_lens[b])
        prefix = int(seq_lens[b]) - length
        slots = req_to_token[req_pool_indices[b], :prefix].long()
        keys = torch.cat([dequantized(k_buffer[slots], k_scale),
                          k_extend[start : start + length].float()])
        values = torch.cat([dequantized(v_buffer[slots], v_scale),
                            v_extend[start : start + length].float()])
        visible = None
        if masked:
            block = tree_mask.reshape(-1)[mask_begin : mask_begin + length * length]
            mask_begin += length * length
            visible = torch.cat([torch.ones(length, prefix, dtype=torch.bool),
                                 block.view(length, length).bool()], dim=1)
        out = _attend(q_extend[start : start + length], keys, values, sm_scale, logit_cap,
                      causal_offset=prefix if is_causal and not masked else None, visible=visible)
        o_extend[start : start + length] = out.to(o_extend.dtype)


def build_draft_decode_metadata_cpu(req_to_token, req_pool_indices, seq_lens, topk, num_steps,
                                    pool_len):
    """Torch version of ``sgl_kernel.build_draft_decode_metadata_cpu`` (the intel_amx multi-step
    draft backend).

    Row b*topk + j of the result is the table draft beam j of request b attends through: the
    request's prefix slots ``req_to_token[r, :seq_lens[b]]`` followed by beam j's ``num_steps``
    draft slots, which ``assign_draft_cache_locs_contiguous_cpu`` reserved at
    ``seq_lens[b] + j*num_steps``. Entries past ``seq_lens[b] + num_steps`` are undefined.
    Returns int [bs*topk, pool_len] (``req_to_token``'s dtype).
    """
    rows = req_to_token[req_pool_indices.long(), :pool_len].repeat_interleave(int(topk), dim=0)
    if topk == 1:  # the beam's slots already follow the prefix in the request's own row
        return rows.clone()
    lens = seq_lens.long().repeat_interleave(int(topk))
    beam = torch.arange(int(topk)).repeat(seq_lens.shape[0])
    step = torch.arange(int(num_steps))
    src = (lens + beam * int(num_steps)).unsqueeze(1) + step
    dst = lens.unsqueeze(1) + step
    return rows.scatter(1, dst, rows.gather(1, src))


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


# SGLang's TreeMaskMode values (eagle_utils): full rows over prefix + draft, or draft-only rows.
_FULL_MASK, _QLEN_ONLY = 0, 1


def build_tree_kernel_efficient_cpu(parent_list, top_scores_index, seq_lens, tree_mask, positions,
                                    retrive_index, retrive_next_token, retrive_next_sibling, topk,
                                    spec_steps, num_verify_tokens, tree_mask_mode) -> None:
    """Torch version of ``sgl_kernel.build_tree_kernel_efficient_cpu`` (SGLang's
    ``build_tree_kernel_efficient``): the verify tree of each request from the draft pool.

    Args:
        parent_list: int64 [bs, topk*(spec_steps-1)+1]; entry t >= 1 is the pool index of the node
            whose children fill pool block t (pool index // topk == t); entry 0 is the root's.
        top_scores_index: int64 [bs, N-1], sorted pool indices of the kept nodes; verify node
            n >= 1 is pool node ``top_scores_index[n-1]``, node 0 the root.
        seq_lens: int64 [bs] prefix lengths.
        tree_mask: bool, written: ``tree_mask_mode`` 0 (FULL_MASK: per request N rows of prefix +
            N columns, prefix columns left as the caller filled them) or 1 (QLEN_ONLY: N x N per
            request); row n sees the root, its ancestors and itself.
        positions: int64 [bs*N] written: seq_lens[b] + depth of node n.
        retrive_index / retrive_next_token / retrive_next_sibling: int64 [bs, N] written (the
            latter two must come in filled with -1): global index b*N + n, first child, next
            sibling; children are listed in increasing verify index.
    A kept node whose parent was not kept is skipped, as the kernel does (it warns).
    """
    bs, n = seq_lens.shape[0], int(num_verify_tokens)
    if topk == 1:
        return _build_chain(seq_lens, tree_mask, positions, retrive_index, retrive_next_token,
                            retrive_next_sibling, n, int(tree_mask_mode))
    retrive_index.copy_((torch.arange(bs).unsqueeze(1) * n + torch.arange(n)).to(retrive_index.dtype))
    parents = _verify_parents(parent_list.long(), top_scores_index.long(), int(topk))
    mask = torch.zeros(bs, n, n, dtype=torch.bool)
    mask[:, :, 0] = True
    for b in range(bs):
        row = parents[b].tolist()
        for node in range(n - 1, 0, -1):  # prepend, so the first child has the lowest index
            parent = row[node]
            if parent < 0:
                continue
            retrive_next_sibling[b, node] = retrive_next_token[b, parent]
            retrive_next_token[b, parent] = node
        for node in range(1, n):
            cur = node
            while cur > 0:
                mask[b, node, cur] = True
                cur = row[cur]
    depth = mask[:, :, 1:].sum(-1)
    positions.copy_((seq_lens.long().unsqueeze(1) + depth).reshape(-1).to(positions.dtype))
    _write_mask(tree_mask, mask, seq_lens, int(tree_mask_mode))


def _verify_parents(parent_list, top_scores_index, topk):
    """int64 [bs, N]: verify index of each node's parent (0 = root; -1 for the root itself and
    for a node whose parent pool node was not kept)."""
    bs = top_scores_index.shape[0]
    block = top_scores_index // topk
    if parent_list.shape[1] == 0:
        # One draft step (depth 1, a tree budget of --hsd-adaptive): SGLang passes no parent
        # entries, as every pool node is a child of the root (block 0).
        parent_list = torch.full((bs, 1), -1, dtype=torch.long, device=block.device)
    parent_pool = parent_list.gather(1, block)
    # verify index of a pool node = 1 + its rank among the kept (sorted) pool indices
    match = top_scores_index.unsqueeze(1) == parent_pool.unsqueeze(2)  # [bs, N-1 (child), N-1]
    found = match.any(-1)
    index = torch.where(found, match.long().argmax(-1) + 1, -1)
    index = torch.where(block == 0, 0, index)
    return torch.cat([torch.full((bs, 1), -1, dtype=torch.long), index], dim=1)


def _write_mask(tree_mask, mask, seq_lens, mode):
    """Write the [bs, N, N] ancestor mask in SGLang's layout for ``mode``."""
    bs, n = mask.shape[:2]
    if mode == _QLEN_ONLY:
        tree_mask.view(-1)[: bs * n * n] = mask.reshape(-1).to(tree_mask.dtype)
        return
    if mode != _FULL_MASK:
        raise NotImplementedError(f"sglang-hsd's torch tree builder: tree_mask_mode {mode}")
    begin = 0
    for b in range(bs):
        prefix = int(seq_lens[b])
        rows = tree_mask.view(-1)[begin : begin + n * (prefix + n)].view(n, prefix + n)
        rows[:, prefix:] = mask[b].to(tree_mask.dtype)
        begin += n * (prefix + n)


def _build_chain(seq_lens, tree_mask, positions, retrive_index, retrive_next_token,
                 retrive_next_sibling, n, mode):
    """The topk = 1 tree: a chain root + drafts (node j: position seq_lens[b] + j, next j + 1)."""
    bs = seq_lens.shape[0]
    slot = torch.arange(n)
    positions.copy_((seq_lens.long().unsqueeze(1) + slot).reshape(-1).to(positions.dtype))
    retrive_index.copy_((torch.arange(bs).unsqueeze(1) * n + slot).to(retrive_index.dtype))
    nxt = torch.where(slot + 1 < n, slot + 1, -1).expand(bs, n)
    retrive_next_token.copy_(nxt.to(retrive_next_token.dtype))
    retrive_next_sibling.fill_(-1)
    causal = slot.unsqueeze(0) <= slot.unsqueeze(1)  # [N, N]
    _write_mask(tree_mask, causal.expand(bs, n, n), seq_lens, mode)


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
def murmur_hash32_cpu(seed: torch.Tensor, positions: torch.Tensor,
                      col_indices: torch.Tensor) -> torch.Tensor:
    """uint32 [n, m] = MurmurHash3 of (seed[i] (64 bit), positions[i], col_indices[j]), the same
    blocks in the same order as SGLang's Triton ``murmur_hash32_kernel`` (seeded sampling and
    verify coins); the hash itself lives in ``sglang_hsd.counter_rng``."""
    return murmur_hash32(seed, positions, col_indices).to(torch.uint32)


murmur_hash32_cpu.default = murmur_hash32_cpu  # called as torch.ops.sgl_kernel.<name>.default


# Ops SGLang reaches as ``torch.ops.sgl_kernel.<name>`` (the intel_amx attention backend, the only
# CPU backend SGLang's EAGLE draft path accepts).
SGL_KERNEL_TORCH_OPS = {
    "decode_attention_cpu": decode_attention_cpu,
    "extend_attention_cpu": extend_attention_cpu,
    "murmur_hash32_cpu": murmur_hash32_cpu,
}
