"""Unit checks of the budgeted drafter (``tree/expand.py``): layout, shapes, bad input."""

import pytest
import torch

from sglang_hsd.verify.oracles import exact
from sglang_hsd.verify.oracles.expand_exact import Shape, draft_outcomes
from sglang_hsd.tree_draft import TreeShape
from sglang_hsd.verify.oracles.expand_draft import EXPANSION_RULES, expand_tree
from sglang_hsd.verify.tree.layout import check_tree_layout


def _context_free_q_fn(q_row):
    def q_fn(paths):
        return q_row.expand(*paths.shape[:2], -1)

    return q_fn


@pytest.mark.parametrize("rule", sorted(EXPANSION_RULES))
@pytest.mark.parametrize("depth,topk,num_draft_tokens", [(3, 2, 7), (4, 2, 8), (5, 4, 8), (2, 2, 7)])
def test_trees_are_valid_and_within_shape(rule, depth, topk, num_draft_tokens):
    cfg = TreeShape(depth, topk, num_draft_tokens)
    q_fn = _context_free_q_fn(torch.tensor([0.1, 0.2, 0.3, 0.25, 0.15], dtype=torch.float64))
    tree = expand_tree(q_fn, cfg, torch.zeros(64, dtype=torch.long), rule=rule, generator=torch.Generator().manual_seed(0))
    assert tree.candidates.shape == (64, num_draft_tokens)
    check_tree_layout(tree.retrive_next_token, tree.retrive_next_sibling)  # the budget is always filled here
    assert int(tree.depths.max()) <= depth
    children = torch.zeros_like(tree.parents).scatter_add_(1, tree.parents.clamp_min(0), (tree.parents >= 0).long())
    assert int(children.max()) <= topk
    assert bool((tree.parents[:, 1:] < torch.arange(1, num_draft_tokens)).all())  # drafting order


def test_spine_shape():
    tree = expand_tree(_context_free_q_fn(torch.full((4,), 0.25)), TreeShape(3, 2, 7), torch.zeros(2, dtype=torch.long),
                       rule="spine", generator=torch.Generator().manual_seed(0))
    assert tree.parents[0].tolist() == [-1, 0, 1, 2, 0, 1, 2]
    assert tree.depths[0].tolist() == [0, 1, 2, 3, 1, 2, 3]


@pytest.mark.statistical
def test_batched_tree_law_matches_the_oracle():
    """The batched drafter's law of whole trees (with fixed uniforms per column) is the oracle's."""
    world = exact.random_world(3, 3, seed=2)
    q = torch.as_tensor(world.draft)
    offsets = torch.tensor([exact.prefix_offset(3, n) for n in range(4)])

    def q_fn(paths):
        drafted = paths[..., 1:]
        value = (drafted * 3 ** torch.arange(drafted.shape[-1] - 1, -1, -1)).sum(-1)
        return q[offsets[drafted.shape[-1]] + value]

    for rule in ("spine", "best_first", "beam"):
        law = {tuple((n.parent, n.token) for n in nodes[1:]): prob for prob, nodes in draft_outcomes(world, (), rule, Shape(3, 2, 6))}
        tree = expand_tree(q_fn, TreeShape(3, 2, 6), torch.zeros(40_000, dtype=torch.long), rule=rule,
                           generator=torch.Generator().manual_seed(3))
        keys = [tuple(zip(p[1:], t[1:])) for p, t in zip(tree.parents.tolist(), tree.candidates.tolist())]
        assert set(keys) <= set(law)
        for key, prob in sorted(law.items(), key=lambda kv: -kv[1])[:5]:
            assert abs(keys.count(key) / len(keys) - prob) < 5 * (prob * (1 - prob) / len(keys)) ** 0.5 + 1e-3


def test_bad_input():
    with pytest.raises(ValueError, match="num_draft_tokens"):
        TreeShape(3, 2, 1)
    with pytest.raises(ValueError, match="depth"):
        TreeShape(0, 2, 7)
    q_fn = _context_free_q_fn(torch.full((3,), 1 / 3))
    roots = torch.zeros(2, dtype=torch.long)
    with pytest.raises(ValueError, match="rule"):
        expand_tree(q_fn, TreeShape(3, 2, 7), roots, rule="nope")
    with pytest.raises(ValueError, match="uniforms"):
        expand_tree(q_fn, TreeShape(3, 2, 7), roots, uniforms=torch.rand(2, 3, dtype=torch.float64))
