"""Tree attention masks: ancestor relation, FlashInfer layout and bit packing, and a torch attention
with the mask equal to running every root-to-leaf path as its own causal chain."""

import numpy as np
import pytest
import torch

from sglang_hsd.verify.oracles.full_tree_draft import full_tree_links
from sglang_hsd.verify.tree import flashinfer_tree_mask, pack_bits, tree_attention_mask


def _irregular_parents():
    # Request 0: a full topk-2 depth-2 tree; request 1: a lopsided tree in a non-BFS order.
    full = full_tree_links(2, 2)[2]
    lopsided = torch.tensor([-1, 0, 1, 0, 2, 1, 4])
    return torch.stack([full, lopsided])


def _ancestors_by_walking(parents_row):
    n = len(parents_row)
    mask = np.zeros((n, n), dtype=bool)
    for i in range(n):
        j = i
        while j != -1:
            mask[i, j] = True
            j = parents_row[j]
    return mask


def test_dense_mask_is_the_ancestor_relation():
    parents = _irregular_parents()
    mask = tree_attention_mask(parents)
    for b in range(parents.shape[0]):
        assert np.array_equal(mask[b].numpy(), _ancestors_by_walking(parents[b].tolist()))


@pytest.mark.parametrize("bitorder", ["little", "big"])
def test_pack_bits_matches_numpy(bitorder):
    bits = torch.rand(37, generator=torch.Generator().manual_seed(0)) < 0.5
    expected = np.packbits(bits.numpy(), bitorder=bitorder)
    assert np.array_equal(pack_bits(bits, bitorder).numpy(), expected)


def test_flashinfer_layout_blocks_and_indptrs():
    parents = _irregular_parents()
    prefix_lens = torch.tensor([3, 5])
    fi = flashinfer_tree_mask(parents, prefix_lens)
    n = parents.shape[1]
    assert fi.qo_indptr.tolist() == [0, n, 2 * n]
    assert fi.kv_indptr.tolist() == [0, 3 + n, 3 + n + 5 + n]
    assert fi.mask_indptr.tolist() == [0, n * (3 + n), n * (3 + n) + n * (5 + n)]
    for b, prefix in enumerate(prefix_lens.tolist()):
        block = fi.custom_mask[fi.mask_indptr[b] : fi.mask_indptr[b + 1]].view(n, prefix + n).numpy()
        assert block[:, :prefix].all()
        assert np.array_equal(block[:, prefix:], _ancestors_by_walking(parents[b].tolist()))
        packed = fi.packed_mask[fi.packed_mask_indptr[b] : fi.packed_mask_indptr[b + 1]].numpy()
        assert np.array_equal(packed, np.packbits(block.flatten(), bitorder="little"))


def _attention(q, k, v, mask):
    scores = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v


def test_tree_attention_equals_each_path_as_a_causal_chain():
    gen = torch.Generator().manual_seed(0)
    parents = _irregular_parents()
    prefix_lens = torch.tensor([3, 5])
    fi = flashinfer_tree_mask(parents, prefix_lens)
    n, dim = parents.shape[1], 8
    for b, prefix in enumerate(prefix_lens.tolist()):
        prefix_kv = torch.randn(2, prefix, dim, generator=gen, dtype=torch.float64)
        node_qkv = torch.randn(3, n, dim, generator=gen, dtype=torch.float64)
        keys = torch.cat([prefix_kv[0], node_qkv[1]])
        values = torch.cat([prefix_kv[1], node_qkv[2]])
        block = fi.custom_mask[fi.mask_indptr[b] : fi.mask_indptr[b + 1]].view(n, prefix + n)
        tree_out = _attention(node_qkv[0], keys, values, block)
        parent_list = parents[b].tolist()
        leaves = [i for i in range(n) if i not in parent_list]
        for leaf in leaves:
            path = [leaf]
            while parent_list[path[-1]] != -1:
                path.append(parent_list[path[-1]])
            path.reverse()
            chain_keys = torch.cat([prefix_kv[0], node_qkv[1][path]])
            chain_values = torch.cat([prefix_kv[1], node_qkv[2][path]])
            causal = torch.ones(len(path), prefix + len(path), dtype=torch.bool).tril(prefix)
            chain_out = _attention(node_qkv[0][path], chain_keys, chain_values, causal)
            torch.testing.assert_close(tree_out[path], chain_out, rtol=1e-12, atol=1e-12)
