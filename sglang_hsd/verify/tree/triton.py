"""Triton kernels for the hot loops of tree ``hsd`` (traversal verification) and ``target-only``.

One program per request runs the state machine of ``reference.hsd_final_node`` (the oracle and
the CPU path): 2N steps, each entering one node (its weight from the parent's current Mb/Ms) or
testing one leaf of the current tree with the pre-drawn coin ``uniforms.accept[b, node]``; a
rejected leaf is folded into its parent in two passes over the vocabulary (residual mass, then
the new Mb row and, without replacement, the Ms row without the leaf's token; in argmax-first
trees a node's first child is entered and folded against a one-hot proposal). Every step is
computed with masks rather than branches, so the program has no data-dependent control flow.

Mb and Ms live in float32 work copies of the probability rows, so after the kernel the accepted
node's Mb row *is* the distribution of the next token; the final inverse-CDF draw reuses the
torch helper with ``uniforms.sample``. Same uniforms, same tokens as the reference (up to float32
rounding of the residual sums, which only matters for coins within ~1e-7 of a threshold).

``target-only`` is SGLang's walk (one coin per accepted node against the children's cumulative
target mass, at most N steps); the kernel returns the accepted node and the residual (its target
row without its children's tokens) is built in torch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Smallest positive denominators are treated as zero, as in the reference (float32 tiny).
TINY = tl.constexpr(1.1754943508222875e-38)


@triton.jit
def _hsd_tree_kernel(
    cand_ptr, first_ptr, sibling_ptr, parent_ptr,  # int64 [B, N]
    mb_ptr, ms_ptr,  # float32 [B, N, V], modified in place
    weight_ptr,  # float32 [B, N] scratch
    accept_u_ptr,  # float32 [B, N]
    final_ptr,  # int64 [B] output
    num_nodes, vocab,
    REMOVE_REJECTED: tl.constexpr,
    ARGMAX_FIRST: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    base = b * num_nodes
    offs = tl.arange(0, BLOCK_V)
    tl.store(weight_ptr + base, 1.0)
    # Scalar reads (a token's Mb / Ms entry, a node's weight) may hit an element another thread of
    # this program stored in an earlier step: a barrier after every step's stores makes them
    # visible (without it, rare rows read stale values: seen on an H100, never under the interpreter).
    tl.debug_barrier()
    first = tl.load(first_ptr + base)
    node = tl.maximum(first, 0)
    phase = tl.where(first >= 0, 0, 1)  # 0 enter, 1 test, 2 done
    for _step in range(2 * num_nodes):
        parent = tl.maximum(tl.load(parent_ptr + base + node), 0)
        token = tl.load(cand_ptr + base + node)
        parent_row = (base + parent) * vocab
        w_parent = tl.load(weight_ptr + base + parent)
        entering = phase == 0
        testing = phase == 1
        # Argmax-first trees: the parent's first child was drafted from a one-hot proposal.
        one_hot = ARGMAX_FIRST & (node != 0) & (tl.load(first_ptr + base + parent) == node)
        # Enter: w = min(1, w_parent * Mb_parent(token) / Ms_parent(token)).
        mb_tok = tl.load(mb_ptr + parent_row + token)
        ms_tok = tl.where(one_hot, 1.0, tl.load(ms_ptr + parent_row + token))
        entered = tl.where(ms_tok > 0, tl.minimum(w_parent * mb_tok / tl.maximum(ms_tok, TINY), 1.0), 0.0)
        w_node = tl.where(entering, entered, tl.load(weight_ptr + base + node))
        tl.store(weight_ptr + base + node, w_node)
        # Test: the root always accepts.
        coin = tl.load(accept_u_ptr + base + node)
        accept = testing & ((node == 0) | (coin < w_node))
        reject = testing & (node != 0) & (coin >= w_node)
        # Fold pass 1: residual mass and the Ms mass left after removing the token.
        mass = 0.0
        ms_total = 0.0
        for v0 in range(0, vocab, BLOCK_V):
            in_vocab = (v0 + offs) < vocab
            mb = tl.load(mb_ptr + parent_row + v0 + offs, mask=in_vocab, other=0.0)
            ms = tl.load(ms_ptr + parent_row + v0 + offs, mask=in_vocab, other=0.0)
            proposal = tl.where(one_hot, tl.where((v0 + offs) == token, 1.0, 0.0), ms)
            mass += tl.sum(tl.maximum(w_parent * mb - proposal, 0.0), axis=0)
            ms_total += tl.sum(tl.where((v0 + offs) == token, 0.0, ms), axis=0)
        denom = mass + 1.0 - w_parent
        folded_w = tl.where(parent == 0, 1.0, tl.where(denom > TINY, mass / tl.maximum(denom, TINY), 0.0))
        # Fold pass 2: write the new rows (only for a rejected leaf).
        for v0 in range(0, vocab, BLOCK_V):
            in_vocab = (v0 + offs) < vocab
            mb = tl.load(mb_ptr + parent_row + v0 + offs, mask=in_vocab, other=0.0)
            ms = tl.load(ms_ptr + parent_row + v0 + offs, mask=in_vocab, other=0.0)
            proposal = tl.where(one_hot, tl.where((v0 + offs) == token, 1.0, 0.0), ms)
            residual = tl.maximum(w_parent * mb - proposal, 0.0)
            new_mb = tl.where(mass > TINY, residual / tl.maximum(mass, TINY), residual)
            tl.store(mb_ptr + parent_row + v0 + offs, new_mb, mask=in_vocab & reject)
            if REMOVE_REJECTED:
                kept = tl.where((v0 + offs) == token, 0.0, ms)
                new_ms = tl.where(ms_total > 0, kept / tl.maximum(ms_total, TINY), kept)
                tl.store(ms_ptr + parent_row + v0 + offs, new_ms, mask=in_vocab & reject)
        tl.store(weight_ptr + base + parent, tl.where(reject, folded_w, w_parent))
        # Next state.
        child = tl.load(first_ptr + base + node)
        sibling = tl.load(sibling_ptr + base + node)
        next_node = tl.where(entering & (child >= 0), child, node)
        next_phase = tl.where(entering, tl.where(child >= 0, 0, 1), phase)
        next_node = tl.where(reject, tl.where(sibling >= 0, sibling, parent), next_node)
        next_phase = tl.where(reject, tl.where(sibling >= 0, 0, 1), next_phase)
        phase = tl.where(accept, 2, next_phase)
        node = next_node
        tl.debug_barrier()
    tl.store(final_ptr + b, node)


def hsd_final_node_triton(tree, uniforms) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel version of ``reference.hsd_final_node``: (accepted node int64 [B], next-token weights
    [B, V])."""
    mb = tree.target_probs.float().contiguous().clone()
    ms = tree.draft_probs.float().contiguous().clone()
    batch, num_nodes, vocab = mb.shape
    weight = torch.zeros(batch, num_nodes, dtype=torch.float32, device=mb.device)
    final = torch.empty(batch, dtype=torch.long, device=mb.device)
    block_v = min(triton.next_power_of_2(vocab), 1024)
    _hsd_tree_kernel[(batch,)](
        tree.candidates.contiguous(), tree.first_child.contiguous(), tree.next_sibling.contiguous(),
        tree.parents.contiguous(), mb, ms, weight, uniforms.accept.float().contiguous(), final,
        num_nodes, vocab, REMOVE_REJECTED=tree.remove_rejected, ARGMAX_FIRST=tree.argmax_first, BLOCK_V=block_v,
    )
    rows = torch.arange(batch, device=mb.device)
    weights = mb[rows, final]
    fallback = tree.target_probs.float()[rows, final]
    return final, torch.where(weights.sum(-1, keepdim=True) > 0, weights, fallback)


@triton.jit
def _target_only_tree_kernel(
    cand_ptr, first_ptr, sibling_ptr,  # int64 [B, N]
    target_ptr,  # float32 [B, N, V]
    accept_u_ptr,  # float32 [B, N]
    final_ptr,  # int64 [B] output
    num_nodes, vocab,
):
    b = tl.program_id(0).to(tl.int64)
    base = b * num_nodes
    node = tl.zeros((), dtype=tl.int64)
    child = tl.load(first_ptr + base)
    coin = tl.load(accept_u_ptr + base)
    cumulative = 0.0
    for _step in range(num_nodes):
        active = child >= 0
        c = tl.maximum(child, 0)
        token = tl.load(cand_ptr + base + c)
        reached = cumulative + tl.load(target_ptr + (base + node) * vocab + token)
        accept = active & (coin < reached)
        reject = active & (coin >= reached)
        cumulative = tl.where(accept, 0.0, tl.where(reject, reached, cumulative))
        node = tl.where(accept, c, node)
        coin = tl.load(accept_u_ptr + base + node)
        child = tl.where(accept, tl.load(first_ptr + base + c), tl.where(reject, tl.load(sibling_ptr + base + c), child))
    tl.store(final_ptr + b, node)


def target_only_final_node_triton(tree, uniforms) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel version of ``reference.target_only_final_node``: (accepted node int64 [B], next-token
    weights [B, V])."""
    target = tree.target_probs.float().contiguous()
    batch, num_nodes, vocab = target.shape
    final = torch.empty(batch, dtype=torch.long, device=target.device)
    _target_only_tree_kernel[(batch,)](
        tree.candidates.contiguous(), tree.first_child.contiguous(), tree.next_sibling.contiguous(),
        target, uniforms.accept.float().contiguous(), final, num_nodes, vocab,
    )
    # The walk stopped at ``final`` after rejecting all of its children (or at a leaf).
    rows = torch.arange(batch, device=target.device)
    is_child = (tree.parents == final.unsqueeze(-1)).to(target.dtype)
    removed = torch.zeros(batch, vocab, dtype=target.dtype, device=target.device).scatter_add(1, tree.candidates, is_child)
    row = target[rows, final]
    weights = torch.where(removed > 0, 0.0, row)
    return final, torch.where(weights.sum(-1, keepdim=True) > 0, weights, row)
