"""API, layout and bad-input tests of ``verify_tree`` and ``sample_tree`` (fast, CPU)."""

import pytest
import torch

from sglang_hsd.verify import (
    TREE_METHODS,
    ChainUniforms,
    TreeUniforms,
    verify_chain,
    verify_tree,
)
from sglang_hsd.verify.oracles.full_tree_draft import full_tree_links, sample_tree, topk_tree
from sglang_hsd.verify.tree import depths_from_parents, parents_from_links

VOCAB = 6


def _q_fn(seed):
    """A context-dependent q: rows depend on the path through a hash of its tokens."""
    gen = torch.Generator().manual_seed(seed)
    table = torch.rand(97, VOCAB, generator=gen, dtype=torch.float64) + 0.05
    table = table / table.sum(-1, keepdim=True)

    def q_fn(paths):
        weights = torch.arange(1, paths.shape[-1] + 1)
        return table[(paths * weights * 7 + paths.shape[-1]).sum(-1) % 97]

    return q_fn


def _random_tree(batch=4, topk=2, depth=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    tree = sample_tree(_q_fn(seed), topk, depth, gen, root_tokens=torch.arange(batch) % VOCAB)
    target = _q_fn(seed + 100)(torch.stack([tree.candidates, tree.depths], -1))  # any valid rows
    return tree, target


def test_full_tree_layout_and_parents():
    next_token, next_sibling, parents, depths = full_tree_links(2, 2)
    assert next_token.tolist() == [1, 3, 5, -1, -1, -1, -1]
    assert next_sibling.tolist() == [-1, 2, -1, 4, -1, 6, -1]
    derived = parents_from_links(next_token[None], next_sibling[None])
    assert derived[0].tolist() == parents.tolist() == [-1, 0, 0, 1, 1, 2, 2]
    assert depths_from_parents(derived)[0].tolist() == depths.tolist() == [0, 1, 1, 2, 2, 2, 2]


def test_sample_tree_without_replacement_has_distinct_siblings_and_exact_node_probs():
    tree, _ = _random_tree(batch=8, topk=3, depth=2)
    for b in range(8):
        for parent in range(4):
            kids = (tree.parents[b] == parent).nonzero().squeeze(-1)
            tokens = tree.candidates[b, kids].tolist()
            assert len(set(tokens)) == 3
            q = tree.draft_probs[b, parent]
            taken = 0.0
            for node, token in zip(kids.tolist(), tokens):
                assert tree.node_probs[b, node].item() == pytest.approx(q[token].item() / (1 - taken))
                taken += q[token].item()


def test_topk_tree_takes_the_most_likely_tokens():
    tree = topk_tree(_q_fn(3), 2, 2, root_tokens=torch.zeros(2, dtype=torch.long))
    top = torch.sort(tree.draft_probs[:, 0], descending=True, stable=True).indices[:, :2]
    assert torch.equal(tree.candidates[:, 1:3], top)


@pytest.mark.parametrize("method", sorted(TREE_METHODS))
def test_outputs_are_consistent_paths(method):
    tree, target = _random_tree(batch=16, topk=2, depth=3, seed=1)
    res = verify_tree(tree.candidates, tree.retrive_next_token, tree.retrive_next_sibling, tree.draft_probs,
                      target, method=method, generator=torch.Generator().manual_seed(0))
    assert res.accept_index.shape == res.tokens.shape == (16, 4)
    for b in range(16):
        n = int(res.num_accepted[b])
        path = res.accept_index[b, : n + 1].tolist()
        assert path[0] == 0 and all(i == -1 for i in res.accept_index[b, n + 1 :].tolist())
        assert all(int(tree.parents[b, c]) == p for p, c in zip(path, path[1:]))
        assert res.tokens[b, :n].tolist() == tree.candidates[b, path[1:]].tolist()
        assert 0 <= int(res.tokens[b, n]) < VOCAB and all(t == -1 for t in res.tokens[b, n + 1 :].tolist())


@pytest.mark.parametrize("depth", [1, 2, 4])
def test_topk1_tree_hsd_equals_chain_hsd_token_for_token(depth):
    batch = 64
    gen = torch.Generator().manual_seed(depth)
    tree = sample_tree(_q_fn(depth), 1, depth, gen, root_tokens=torch.zeros(batch, dtype=torch.long))
    target = _q_fn(depth + 7)(torch.stack([tree.candidates, tree.depths + 1], -1))
    chain_u = ChainUniforms.draw(batch, depth, generator=gen)
    tree_u = TreeUniforms(torch.cat([torch.zeros(batch, 1), chain_u.accept], 1), chain_u.sample)
    chain = verify_chain(tree.candidates[:, 1:], tree.draft_probs[:, :-1], target, "hsd", uniforms=chain_u)
    res = verify_tree(tree.candidates, tree.retrive_next_token, tree.retrive_next_sibling, tree.draft_probs,
                      target, "hsd", uniforms=tree_u)
    assert torch.equal(res.num_accepted, chain.num_accepted)
    assert torch.equal(res.tokens, chain.tokens)


def test_greedy_follows_the_target_argmax():
    tree, target = _random_tree(batch=1, topk=2, depth=1)
    target = torch.zeros_like(target)
    target[0, :, 5] = 1.0
    target[0, 0] = 0.0
    target[0, 0, int(tree.candidates[0, 2])] = 1.0  # the second child is the root's argmax
    res = verify_tree(tree.candidates, tree.retrive_next_token, tree.retrive_next_sibling, None, target, "greedy")
    assert res.accept_index[0].tolist() == [0, 2] and res.tokens[0].tolist() == [int(tree.candidates[0, 2]), 5]


def _args(tree, target):
    return [tree.candidates, tree.retrive_next_token, tree.retrive_next_sibling, tree.draft_probs, target]


def _with(args, index, value):
    args = list(args)
    args[index] = value
    return args


def test_bad_layouts_are_rejected():
    tree, target = _random_tree(batch=2)
    args = _args(tree, target)
    cycle = tree.retrive_next_token.clone()
    cycle[0, 3] = 1  # node 3 points back at its parent
    with pytest.raises(ValueError, match="reached twice"):
        verify_tree(*_with(args, 1, cycle))
    orphan = tree.retrive_next_sibling.clone()
    orphan[1, 5] = -1  # node 6 loses its only link
    with pytest.raises(ValueError, match="orphan"):
        verify_tree(*_with(args, 2, orphan))
    loop = tree.retrive_next_sibling.clone()
    loop[0, 2] = 1  # the root's sibling list revisits node 1
    with pytest.raises(ValueError, match="reached twice"):
        verify_tree(*_with(args, 2, loop))
    out_of_range = tree.retrive_next_token.clone()
    out_of_range[0, 0] = 99
    with pytest.raises(ValueError, match="outside"):
        verify_tree(*_with(args, 1, out_of_range))


def test_bad_probabilities_and_shapes_are_rejected():
    tree, target = _random_tree(batch=2)
    args = _args(tree, target)
    with pytest.raises(ValueError, match="target_probs must have shape"):
        verify_tree(*_with(args, 4, target[:, :3]))
    with pytest.raises(ValueError, match="draft_probs must have shape"):
        verify_tree(*_with(args, 3, tree.draft_probs[..., :3]))
    with pytest.raises(ValueError, match="target_probs rows must sum to 1"):
        verify_tree(*_with(args, 4, target * 2))
    zero_q = tree.draft_probs.clone()
    zero_q[0, 0, int(tree.candidates[0, 1])] = 0.0
    zero_q[0, 0] /= zero_q[0, 0].sum()
    with pytest.raises(ValueError, match="probability 0 to a drafted token"):
        verify_tree(*_with(args, 3, zero_q))
    with pytest.raises(ValueError, match="draft_probs is required"):
        verify_tree(*_with(args, 3, None), method="rrs")
    with pytest.raises(ValueError, match="uniforms.accept"):
        verify_tree(*args, uniforms=TreeUniforms(torch.rand(2, 3), torch.rand(2)))
    with pytest.raises(ValueError, match="method must be one of"):
        verify_tree(*args, method="eagle")
    with pytest.raises(ValueError, match="draft_mode"):
        verify_tree(*args, draft_mode="sometimes")


def test_duplicate_siblings_need_iid_mode():
    tree, target = _random_tree(batch=1)
    dup = tree.candidates.clone()
    dup[0, 2] = dup[0, 1]
    args = _with(_args(tree, target), 0, dup)
    for method in ("hsd", "target-only"):
        with pytest.raises(ValueError, match="same token"):
            verify_tree(*args, method=method)
    verify_tree(*args, method="hsd", draft_mode="iid")  # i.i.d. children may repeat a token


def test_triton_backend_refuses_methods_without_a_kernel():
    tree, target = _random_tree(batch=1)
    with pytest.raises(ValueError, match="Triton tree kernels implement"):
        verify_tree(*_args(tree, target), method="rrs", backend="triton")


def _short_tree():
    """A level-drafted tree (D = 2, k = 3, N = 5) whose request 1 has one token of q support:
    request 0 keeps 4 nodes, request 1 a chain of 2 and then 2 filler columns."""
    from sglang_hsd.tree_draft import DraftPlan, KeyedNoise, LevelDrafter, TreeShape

    root_q = torch.tensor([[0.3, 0.3, 0.2, 0.2, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    drafter = LevelDrafter(DraftPlan.build(TreeShape(2, 3, 5), "beam"), root_q, torch.tensor([False, False]),
                           KeyedNoise.fresh(torch.zeros(2, dtype=torch.long), torch.Generator().manual_seed(0)))
    drafter.first()
    rows = torch.full((6, VOCAB), 1.0 / VOCAB, dtype=torch.float64)
    rows[3:] = torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    drafter.step(rows)
    tree = drafter.finish()
    assert tree.num_kept.tolist() == [4, 2]
    target = torch.softmax(torch.randn(2, 5, VOCAB, generator=torch.Generator().manual_seed(1)), -1).double()
    return tree, target


def test_declared_filler_passes_validation_and_nothing_else_does():
    """A short level-drafted tree: its filler is refused as orphans unless ``num_kept`` declares
    it; declared, it validates and verifies as without validation, and a wrong declaration or a
    linked filler column is still refused."""
    tree, target = _short_tree()
    args = [tree.candidates, tree.retrive_next_token, tree.retrive_next_sibling, tree.draft_probs, target]
    uniforms = TreeUniforms(torch.rand(2, 5, generator=torch.Generator().manual_seed(2), dtype=torch.float64),
                            torch.rand(2, generator=torch.Generator().manual_seed(3), dtype=torch.float64))
    with pytest.raises(ValueError, match="node 3 is an orphan"):
        verify_tree(*args, uniforms=uniforms)  # general callers keep the orphan check
    checked = verify_tree(*args, uniforms=uniforms, num_kept=tree.num_kept)
    unchecked = verify_tree(*args, uniforms=uniforms, validate=False)
    assert torch.equal(checked.tokens, unchecked.tokens) and torch.equal(checked.accept_index, unchecked.accept_index)
    with pytest.raises(ValueError, match="orphan"):  # a filler column counted as kept
        verify_tree(*args, uniforms=uniforms, num_kept=tree.num_kept + torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="filler"):  # a kept node (with a child) declared filler
        verify_tree(*args, uniforms=uniforms, num_kept=torch.tensor([4, 0]))
    linked = tree.retrive_next_sibling.clone()
    linked[1, 4] = 3
    with pytest.raises(ValueError, match="node 4 is filler"):
        verify_tree(*_with(args, 2, linked), uniforms=uniforms, num_kept=tree.num_kept)
    for bad in (torch.tensor([4]), torch.tensor([4.0, 2.0]), torch.tensor([4, 5])):
        with pytest.raises(ValueError, match="num_kept"):
            verify_tree(*args, uniforms=uniforms, num_kept=bad)
