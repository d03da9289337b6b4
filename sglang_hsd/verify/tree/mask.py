"""Attention masks for verifying a draft tree in one target forward pass.

Node i of a tree may attend to node j iff j is an ancestor of i or i itself (and to the whole
committed prefix), so every node sees exactly the context of its own root-to-node path.

FlashInfer layout (``BatchPrefillWithRaggedKVCacheWrapper.plan(custom_mask=...)``): per request a
row-major boolean [qo_len, kv_len] block (queries = the N tree nodes, keys = prefix + N tokens),
the blocks concatenated; ``qo_indptr`` / ``kv_indptr`` are the ragged offsets of queries and keys
and ``mask_indptr`` the offsets of the blocks (all length B + 1, starting at 0). FlashInfer packs
the flat mask itself in ``plan`` with ``segment_packbits(mask, mask_indptr, bitorder="little")``
(flashinfer/prefill.py and flashinfer/sparse.py), i.e. each request's block is padded to whole
bytes and bit k of a byte is element 8 * byte + k. ``pack_bits`` reproduces that (and numpy's
``packbits`` for either bit order) for callers that pass ``packed_custom_mask`` directly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def tree_attention_mask(parents: torch.Tensor) -> torch.Tensor:
    """Dense tree mask. parents: int64 [B, N] (-1 = root). Returns bool [B, N, N], [b, i, j] = j is
    an ancestor-or-self of i."""
    batch, num_nodes = parents.shape
    rows = torch.arange(batch, device=parents.device).unsqueeze(-1)
    nodes = torch.arange(num_nodes, device=parents.device).expand(batch, num_nodes)
    mask = torch.zeros(batch, num_nodes, num_nodes + 1, dtype=torch.bool, device=parents.device)
    ancestor = nodes.clone()
    for _ in range(num_nodes):  # the deepest node has at most N - 1 ancestors
        column = torch.where(ancestor >= 0, ancestor, num_nodes)  # spare column absorbs "no node"
        mask[rows, nodes, column] = True
        ancestor = torch.where(ancestor >= 0, parents.gather(1, ancestor.clamp_min(0)), ancestor)
    return mask[..., :num_nodes]


@dataclass
class FlashInferTreeMask:
    """Inputs for FlashInfer's ragged prefill with a custom mask.

    Fields:
        custom_mask: bool [sum_b N * (prefix_b + N)], the flattened per-request blocks.
        packed_mask: uint8, ``custom_mask`` packed per request (``bitorder``), blocks padded to bytes.
        qo_indptr: int32 [B + 1], query offsets (N per request).
        kv_indptr: int32 [B + 1], key offsets (prefix_b + N per request).
        mask_indptr: int32 [B + 1], offsets of each block in ``custom_mask`` (elements).
        packed_mask_indptr: int32 [B + 1], offsets of each block in ``packed_mask`` (bytes).
    """

    custom_mask: torch.Tensor
    packed_mask: torch.Tensor
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    mask_indptr: torch.Tensor
    packed_mask_indptr: torch.Tensor


def flashinfer_tree_mask(parents: torch.Tensor, prefix_lens: torch.Tensor, bitorder: str = "little") -> FlashInferTreeMask:
    """FlashInfer custom mask for a batch of trees after prefixes of ``prefix_lens`` (int64 [B]).

    Builds the ragged blocks on the host (mask preparation, one transfer per batch, not the
    sampling hot path)."""
    batch, num_nodes = parents.shape
    dense = tree_attention_mask(parents)
    blocks, packed = [], []
    for b, prefix in enumerate(prefix_lens.tolist()):
        block = torch.cat([torch.ones(num_nodes, prefix, dtype=torch.bool, device=parents.device), dense[b]], dim=1)
        blocks.append(block.flatten())
        packed.append(pack_bits(blocks[-1], bitorder))
    kv_lens = prefix_lens.to(torch.int32) + num_nodes
    zero = torch.zeros(1, dtype=torch.int32, device=parents.device)
    as_indptr = lambda sizes: torch.cat([zero, torch.cumsum(sizes, 0).to(torch.int32)])  # noqa: E731
    return FlashInferTreeMask(
        custom_mask=torch.cat(blocks),
        packed_mask=torch.cat(packed),
        qo_indptr=as_indptr(torch.full((batch,), num_nodes, dtype=torch.int32, device=parents.device)),
        kv_indptr=as_indptr(kv_lens),
        mask_indptr=as_indptr(kv_lens * num_nodes),
        packed_mask_indptr=as_indptr(torch.tensor([p.numel() for p in packed], dtype=torch.int32, device=parents.device)),
    )


def pack_bits(bits: torch.Tensor, bitorder: str = "little") -> torch.Tensor:
    """numpy.packbits for a 1-D bool tensor: uint8 [ceil(n / 8)], zero-padded at the end."""
    if bitorder not in ("little", "big"):
        raise ValueError(f"bitorder must be 'little' or 'big', got {bitorder!r}")
    padded = torch.zeros(-(-bits.numel() // 8) * 8, dtype=torch.uint8, device=bits.device)
    padded[: bits.numel()] = bits.to(torch.uint8)
    shifts = torch.arange(8, device=bits.device, dtype=torch.uint8)
    if bitorder == "big":
        shifts = 7 - shifts
    return (padded.view(-1, 8) << shifts).sum(-1).to(torch.uint8)
