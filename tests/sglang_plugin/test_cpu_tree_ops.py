"""The torch stand-ins of SGLang's CPU tree ops (``cpu/kernel_ops.py``) against the semantics of
the ops they replace, on small hand-built trees (topk > 1). No SGLang import needed."""

from __future__ import annotations

import pytest
import torch

from sglang_hsd.sglang_plugin.cpu.kernel_ops import (
    build_draft_decode_metadata_cpu,
    build_tree_kernel_efficient_cpu,
    extend_attention_cpu,
    verify_tree_greedy_cpu,
)

# k = 2, 3 steps, N = 6. Pool: block 0 = pool 0, 1 (root's children); parent_list[1 + beam] =
# pool index forwarded by beam at step 1 (pool 0, 1), children pool 2..5; step 2 beams forward
# pool 2 and 4, children pool 6..9. Kept: pool 0, 1, 2, 4, 6 -> verify nodes 1..5.
PARENT_LIST = [-1, 0, 1, 2, 4]
KEPT = [0, 1, 2, 4, 6]
# verify tree: root -> {1, 2}; 1 -> 3; 2 -> 4; 3 -> 5
PARENTS = [-1, 0, 0, 1, 2, 3]
DEPTH = [0, 1, 1, 2, 2, 3]


def _build(seq_lens, mode, parent_list=PARENT_LIST, kept=KEPT, n=6):
    bs = len(seq_lens)
    seq = torch.tensor(seq_lens)
    if mode == 1:
        mask = torch.ones(bs * n * n, dtype=torch.bool)
    else:
        mask = torch.ones(int(seq.sum()) * n + bs * n * n, dtype=torch.bool)
    positions = torch.empty(bs * n, dtype=torch.long)
    ri, nt, ns = torch.full((3, bs, n), -1, dtype=torch.long)
    build_tree_kernel_efficient_cpu(
        torch.tensor([parent_list] * bs), torch.tensor([kept] * bs), seq, mask, positions,
        ri, nt, ns, 2, 3, n, mode)
    return mask, positions, ri, nt, ns


def _ancestor_mask(parents):
    n = len(parents)
    mask = torch.zeros(n, n, dtype=torch.bool)
    for node in range(n):
        mask[node, 0] = True
        cur = node
        while cur > 0:
            mask[node, cur] = True
            cur = parents[cur]
    return mask


def test_build_tree_links_positions_and_qlen_mask():
    mask, positions, ri, nt, ns = _build([5, 7], mode=1)
    assert nt[0].tolist() == [1, 3, 4, 5, -1, -1]
    assert ns[0].tolist() == [-1, 2, -1, -1, -1, -1]
    assert ri.tolist() == [list(range(6)), list(range(6, 12))]
    assert positions.view(2, 6).tolist() == [[5 + d for d in DEPTH], [7 + d for d in DEPTH]]
    expected = _ancestor_mask(PARENTS)
    assert torch.equal(mask.view(2, 6, 6), expected.expand(2, 6, 6))


def test_build_tree_full_mask_keeps_prefix_columns():
    mask, *_ = _build([3, 2], mode=0)
    first = mask[: 6 * 9].view(6, 9)
    assert first[:, :3].all()
    assert torch.equal(first[:, 3:], _ancestor_mask(PARENTS))
    second = mask[6 * 9 :].view(6, 8)
    assert torch.equal(second[:, 2:], _ancestor_mask(PARENTS))


def test_build_tree_skips_node_whose_parent_was_not_kept():
    # pool 8's parent is parent_list[4] = pool 4, not kept here: node 5 is left out of the tree
    _, _, _, nt, ns = _build([4], mode=1, kept=[0, 1, 2, 3, 8])
    assert nt[0].tolist() == [1, 3, -1, -1, -1, -1]
    assert ns[0].tolist() == [-1, 2, -1, 4, -1, -1]


def test_build_tree_of_one_draft_step_without_parent_entries():
    """Depth 1 (a tree budget of --hsd-adaptive): SGLang passes a parent list with no columns;
    every kept node is a child of the root."""
    n = 3
    mask = torch.ones(n * n, dtype=torch.bool)
    positions = torch.empty(n, dtype=torch.long)
    ri, nt, ns = torch.full((3, 1, n), -1, dtype=torch.long)
    build_tree_kernel_efficient_cpu(torch.empty(1, 0, dtype=torch.long), torch.tensor([[0, 1]]),
                                    torch.tensor([4]), mask, positions, ri, nt, ns, 2, 1, n, 1)
    assert nt[0].tolist() == [1, -1, -1] and ns[0].tolist() == [-1, 2, -1]
    assert positions.tolist() == [4, 5, 5]
    assert torch.equal(mask.view(n, n), _ancestor_mask([-1, 0, 0]))


def test_greedy_tree_verify_walks_siblings():
    _, _, ri, nt, ns = _build([4], mode=1)
    candidates = torch.tensor([[9, 10, 11, 12, 13, 14]])
    # target argmax at root = 11 (node 2), at node 2 = 13 (node 4), then 7 (bonus)
    target = torch.tensor([[11, 0, 13, 0, 7, 0]])
    predicts = torch.zeros(6, dtype=torch.int32)
    accept_index = torch.full((1, 4), -1, dtype=torch.int32)
    accept_num = torch.zeros(1, dtype=torch.int32)
    verify_tree_greedy_cpu(predicts, accept_index, accept_num, candidates, ri, nt, ns, target)
    assert accept_index.tolist() == [[0, 2, 4, -1]]
    assert accept_num.tolist() == [2]
    assert predicts[[0, 2, 4]].tolist() == [11, 13, 7]


def test_draft_decode_metadata_per_beam_rows():
    pool_len, steps, topk = 20, 3, 2
    req_to_token = torch.randperm(3 * pool_len).to(torch.int32).view(3, pool_len)
    indices, seq_lens = torch.tensor([2, 0]), torch.tensor([4, 6])
    out = build_draft_decode_metadata_cpu(req_to_token, indices, seq_lens, topk, steps, pool_len)
    assert out.shape == (4, pool_len) and out.dtype == torch.int32
    for b in range(2):
        row, sl = req_to_token[indices[b]], int(seq_lens[b])
        for j in range(topk):
            want = torch.cat([row[:sl], row[sl + j * steps : sl + (j + 1) * steps]])
            assert torch.equal(out[b * topk + j, : sl + steps], want)


def test_tree_masked_extend_attention_equals_each_path_as_a_sequence():
    torch.manual_seed(0)
    n, prefix, heads, dim = 6, 3, 2, 4
    mask, *_ = _build([prefix], mode=1)
    k_buffer, v_buffer = torch.randn(2, 16, heads, dim)
    req_to_token = torch.arange(16).view(1, 16)
    q, k, v = torch.randn(3, n, heads, dim)
    out = torch.empty(n, heads, dim)
    args = (k_buffer, v_buffer, 1.0, 1.0, req_to_token, torch.tensor([0]))
    tail = (0.5, 0.0, False, 0, None, None)
    extend_attention_cpu(q, k, v, out, *args, torch.tensor([prefix + n]), torch.tensor([n]),
                         torch.tensor([0]), n, *tail, mask, True)
    for node in range(n):
        path, cur = [], node
        while cur >= 0:
            path.insert(0, cur)
            cur = PARENTS[cur]
        plain = torch.empty(len(path), heads, dim)
        extend_attention_cpu(q[path], k[path], v[path], plain, *args,
                             torch.tensor([prefix + len(path)]), torch.tensor([len(path)]),
                             torch.tensor([0]), len(path), *tail, None, True)
        torch.testing.assert_close(out[node], plain[-1])


@pytest.mark.parametrize("depth, topk, n", [(3, 2, 6), (3, 3, 8), (2, 4, 9), (1, 2, 3), (1, 4, 3)])
def test_tree_builder_reads_the_sampled_drafters_pool_layout(depth, topk, n):
    """SGLang's tree builder (this stand-in) turns the sampled drafter's pool layout into the
    links the drafter reports in verify order (full-support q: no filler nodes)."""
    from sglang_hsd.tree_draft import DraftPlan, KeyedNoise, LevelDrafter, TreeShape

    gen = torch.Generator().manual_seed(depth * 10 + topk)
    bs, vocab = 3, 12
    drafter = LevelDrafter(DraftPlan.build(TreeShape(depth, topk, n), "spine"),
                           torch.softmax(torch.randn(bs, vocab, generator=gen), -1),
                           torch.tensor([False, True, False]), KeyedNoise.fresh(torch.zeros(bs, dtype=torch.long), gen))
    drafter.first()
    for _ in range(depth - 1):
        drafter.step(torch.softmax(torch.randn(bs * topk, vocab, generator=gen), -1))
    tree = drafter.finish()
    assert (tree.num_kept == n - 1).all()
    ri, nt, ns = torch.full((3, bs, n), -1, dtype=torch.long)
    positions = torch.empty(bs * n, dtype=torch.long)
    build_tree_kernel_efficient_cpu(tree.parent_list, tree.top_scores_index, torch.full((bs,), 4),
                                    torch.ones(bs * n * n, dtype=torch.bool), positions, ri, nt,
                                    ns, topk, depth, n, 1)
    assert torch.equal(nt, tree.retrive_next_token)
    assert torch.equal(ns, tree.retrive_next_sibling)
    assert torch.equal(positions.view(bs, n), 4 + tree.depths)
