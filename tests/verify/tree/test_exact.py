"""Exact-enumeration checks of the tree verifiers (float64 oracle in ``oracles/tree_exact.py``, no sampling).

Worlds are context dependent (every prefix has its own p and q); the laws compared are those of the
first 3 emitted tokens, which span several rounds, from the empty prefix.
"""

import functools

import numpy as np
import pytest

from sglang_hsd.verify.oracles import exact, tree_exact

pytestmark = pytest.mark.exact

# Enumeration in float64 reaches ~1e-16; anything above 1e-12 is a real bias.
LOSSLESS_TV = 1e-12
# The wrong pairings below are off by 1e-2 or more on these worlds; 1e-3 separates them from noise.
LOSSY_TV = 1e-3
PREFIX_LEN = 3

SHAPES = [  # (vocab, topk, depth): every shape the brief covers, sized to stay fast
    (3, 2, 2),
    (3, 2, 3),
    (3, 3, 2),
    (4, 2, 2),
    (4, 3, 2),
    (3, 3, 3),  # topk = V: without replacement the tree holds every token; i.i.d. trees repeat them
]


@pytest.mark.parametrize("vocab,topk,depth", SHAPES)
@pytest.mark.parametrize("seed", [0, 1])
def test_lossless_tree_methods_match_target(vocab, topk, depth, seed):
    world = exact.random_world(vocab, PREFIX_LEN - 1 + depth, seed=seed)
    cases = [
        ("hsd", "without-replacement"),
        ("rrs", "without-replacement"),
        ("target-only", "without-replacement"),
        ("target-only", "top-k"),
        ("hsd", "iid"),
        ("rrs", "iid"),
    ]
    for method, drafting in cases:
        tv = tree_exact.tree_prefix_tv(world, method, topk, depth, PREFIX_LEN, drafting)
        assert tv < LOSSLESS_TV, f"{method}/{drafting} V={vocab} topk={topk} depth={depth}: TV {tv:.3g}"


@pytest.mark.parametrize("draft", ["independent", "one-hot"])
def test_lossless_on_peaked_and_unrelated_drafters(draft):
    # One-hot q rows have a single token of positive mass: only i.i.d. (duplicate) children exist.
    world = exact.random_world(3, 4, seed=5, draft=draft, concentration=0.5)
    drafting = "iid" if draft == "one-hot" else "without-replacement"
    for method in ("hsd", "rrs"):
        assert tree_exact.tree_prefix_tv(world, method, 2, 2, PREFIX_LEN, drafting) < LOSSLESS_TV


def _traversal_keeping_q(world, prefix, topk, depth, drafting):
    """Wrong: without-replacement children, but the fold never removes the rejected token from q."""
    return tree_exact.traversal_outcomes(world, prefix, topk, depth, drafting, q_update=lambda ms, token, mode: ms)


def _traversal_always_removing(world, prefix, topk, depth, drafting):
    """Wrong for i.i.d. children: removes the rejected token although the next child may repeat it."""
    return tree_exact.traversal_outcomes(
        world, prefix, topk, depth, drafting,
        q_update=lambda ms, token, mode: tree_exact.matching_q_update(ms, token, "without-replacement"),
    )


def _best_path_block_verified(world, prefix, topk, depth, drafting):
    """Wrong: draw topk children per level, keep the one with the highest q, and block-verify the
    kept path with the plain q rows, as if it had been drawn from q. Choosing a path by looking at
    its siblings changes its law (the multi-path shortcut docs/verification.md, section 'Trees',
    warns about)."""
    outcomes = {}
    for tree_path, draw_prob in _best_q_paths(world, tuple(prefix), depth):
        contexts = [tuple(prefix) + tree_path[:t] for t in range(depth + 1)]
        p_rows = np.stack([world.p(c) for c in contexts])
        q_rows = np.stack([world.q(c) for c in contexts[:-1]])
        for (n, token), prob in exact.hsd_outcome_law(p_rows, q_rows, tree_path).items():
            key = (tree_path[:n], token)
            outcomes[key] = outcomes.get(key, 0.0) + draw_prob * prob
    return outcomes


def _best_q_paths(world, ctx, depth):
    """Law of the path that keeps, at every level, the likelier (under q) of two children drawn
    without replacement."""
    paths = [((), 1.0)]
    for _ in range(depth):
        grown = []
        for path, prob in paths:
            q = world.q(ctx + path)
            for first in range(len(q)):
                for second in range(len(q)):
                    if first == second or q[first] == 0 or q[second] == 0:
                        continue
                    pair = q[first] * q[second] / (1 - q[first])
                    best = first if q[first] >= q[second] else second
                    grown.append((path + (best,), prob * pair))
        paths = grown
    return paths


@pytest.mark.parametrize(
    "wrong_rule,drafting",
    [(_traversal_keeping_q, "without-replacement"), (_traversal_always_removing, "iid"), (_best_path_block_verified, "without-replacement")],
)
def test_plausible_wrong_rules_are_caught(wrong_rule, drafting):
    worst = max(
        tree_exact.tree_prefix_tv(exact.random_world(3, 4, seed=seed), None, 2, 2, PREFIX_LEN, drafting, wrong_rule)
        for seed in range(3)
    )
    assert worst > LOSSY_TV, f"{wrong_rule.__name__}: TV {worst:.3g} (the test has no teeth)"


def test_read_q_verifiers_are_lossy_on_top_k_trees():
    # A deterministic top-k tree is not a sample from q: reading q there is badly biased.
    world = exact.random_world(3, 4, seed=0)
    assert tree_exact.tree_prefix_tv(world, "hsd", 2, 2, PREFIX_LEN, "top-k") > 0.1


def test_target_only_needs_distinct_siblings():
    # With i.i.d. children two siblings can carry one token: SGLang's walk then double-counts it.
    world = exact.random_world(3, 4, seed=0)
    assert tree_exact.tree_prefix_tv(world, "target-only", 2, 2, PREFIX_LEN, "iid") > LOSSY_TV


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("depth", [1, 2, 3])
def test_topk1_tree_hsd_is_chain_hsd(seed, depth):
    world = exact.random_world(3, 2 + depth, seed=seed)
    for prefix in [(), (1,), (2, 0)]:
        tree_law = tree_exact.tree_round_law(world, "hsd", 1, depth, prefix)
        chain_law = exact.round_law(world, "hsd", depth, prefix)
        assert exact.total_variation(tree_law.emitted, chain_law.emitted) < LOSSLESS_TV
        assert tree_law.expected_accepted == pytest.approx(chain_law.expected_accepted, abs=1e-13)


def test_target_only_on_top_k_tree_has_closed_form():
    # docs/verification.md, section 'Trees': expected accepted = sum over drafted nodes of the
    # target probability of their path.
    world = exact.random_world(4, 3, seed=3)
    expected, paths = 0.0, [((), 1.0)]
    for _ in range(2):
        grown = []
        for path, mass in paths:
            q = world.q(path)
            for token in sorted(range(4), key=lambda v: (-q[v], v))[:2]:
                grown.append((path + (token,), mass * world.p(path)[token]))
        expected += sum(mass for _, mass in grown)
        paths = grown
    assert tree_exact.tree_expected_accepted(world, "target-only", 2, 2, (), "top-k") == pytest.approx(expected, abs=1e-13)


# Root with three children: the first has two children (the first of which has one child), the
# second is a leaf, the third has one child. Shapes fixed in advance are valid drafting plans.
IRREGULAR_SHAPE = ((((),), ()), (), ((),))


@pytest.mark.parametrize("method", ["hsd", "rrs", "target-only"])
@pytest.mark.parametrize("seed", [0, 1])
def test_lossless_on_an_irregular_tree_shape(method, seed):
    laws = {
        "hsd": tree_exact.traversal_outcomes,
        "rrs": tree_exact.rrs_outcomes,
        "target-only": tree_exact.target_only_outcomes,
    }
    law = functools.partial(laws[method], shape=IRREGULAR_SHAPE)
    world = exact.random_world(4, PREFIX_LEN - 1 + 3, seed=seed)
    tv = tree_exact.tree_prefix_tv(world, method, 3, 3, PREFIX_LEN, "without-replacement", law)
    assert tv < LOSSLESS_TV, f"{method} on an irregular tree: TV {tv:.3g}"
