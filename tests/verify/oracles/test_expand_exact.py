"""Exact-enumeration checks of budgeted sampled trees (``tree/expand.py``'s rules; float64 oracle in
``oracles/expand_exact.py``, no sampling).

Each round enumerates every tree the rule can draft (children without replacement from q, every
drafted node kept) and applies the paired verifier's exact law to each; rounds are chained and the
law of the first 3 emitted tokens is compared with the target's on context-dependent worlds.
"""

import pytest

from sglang_hsd.verify.oracles import exact
from sglang_hsd.verify.oracles.expand_exact import (
    ORACLE_RULES,
    Shape,
    expand_prefix_tv,
    expand_round_law,
    perturbed_world,
)
from sglang_hsd.verify.oracles.expand_draft import DEFAULT_RULE, EXPANSION_RULES

pytestmark = pytest.mark.exact

LOSSLESS_TV = 1e-12  # float64 enumeration reaches ~1e-16
LOSSY_TV = 1e-3
PREFIX_LEN = 3

CASES = [  # (vocab, D, k, N): the server's flags, N counting the root
    (3, 2, 2, 5),
    (3, 3, 2, 7),
    (3, 3, 1, 4),
    (3, 2, 3, 7),  # k = V: a full expansion takes every token
    (4, 2, 3, 6),
    (4, 3, 2, 5),  # budget smaller than a level: the rule's order decides
]
LOSSLESS_RULES = [name for name, rule in EXPANSION_RULES.items() if rule.lossless]


def test_oracle_covers_every_rule():
    assert set(ORACLE_RULES) == set(EXPANSION_RULES)
    for name, rule in EXPANSION_RULES.items():
        assert ORACLE_RULES[name].method == rule.verify_method
        assert (ORACLE_RULES[name].sampled, ORACLE_RULES[name].prune) == (rule.sampled, rule.prune)
    assert EXPANSION_RULES[DEFAULT_RULE].lossless


@pytest.mark.parametrize("vocab,depth,topk,num_draft_tokens", CASES)
@pytest.mark.parametrize("rule", LOSSLESS_RULES)
def test_budgeted_rules_are_lossless(rule, vocab, depth, topk, num_draft_tokens):
    world = exact.random_world(vocab, PREFIX_LEN - 1 + depth, seed=vocab + depth + topk)
    assert expand_prefix_tv(world, rule, Shape(depth, topk, num_draft_tokens), PREFIX_LEN) < LOSSLESS_TV


@pytest.mark.parametrize("seed", [0, 1])
def test_lossless_on_peaked_worlds(seed):
    world = perturbed_world(3, PREFIX_LEN - 1 + 3, seed, concentration=0.3, sigma=1.0)
    for rule in LOSSLESS_RULES:
        assert expand_prefix_tv(world, rule, Shape(3, 2, 7), PREFIX_LEN) < LOSSLESS_TV, rule


@pytest.mark.parametrize("seed", [0, 1])
def test_score_pruning_of_a_sampled_tree_is_lossy(seed):
    """SGLang's final pruning (keep the N - 1 best by path q of the k + (D - 1) k^2 sampled
    candidates) keeps nodes because of deeper tokens it then throws away: biased."""
    world = exact.random_world(3, PREFIX_LEN - 1 + 2, seed=seed)
    assert not EXPANSION_RULES["pruned_beam"].lossless
    assert expand_prefix_tv(world, "pruned_beam", Shape(2, 2, 5), PREFIX_LEN) > LOSSY_TV


def test_topk_one_is_chain_hsd():
    """k = 1: every rule drafts a chain of D tokens; its round law is chain hsd's."""
    world = exact.random_world(3, 3, seed=4)
    chain = exact.round_law(world, "hsd", 3).emitted
    for rule in LOSSLESS_RULES[:3]:
        law = expand_round_law(world, rule, Shape(3, 1, 4)).emitted
        assert set(law) == set(chain)
        assert max(abs(law[block] - chain[block]) for block in chain) < 1e-14


TABLE_SHAPES = [(3, 2, 7), (4, 2, 8), (5, 4, 8)]
TABLE_WORLDS = [(1.0, 0.5), (1.0, 1.0), (0.3, 0.5), (0.3, 1.0)]  # (Dirichlet concentration, sigma)
TABLE_RULES = ["spine", "beam", "best_first", "stock"]


def test_expected_accepted_table():
    """Exact expected accepted draft tokens per round (V = 4, first round), mean over the worlds.

    Prints the table (pytest -s). Asserts only invariants: 0 <= E <= min(D, N - 1)."""
    print("\n(D, k, N)  " + "  ".join(f"{rule:>10}" for rule in TABLE_RULES))
    for depth, topk, num_draft_tokens in TABLE_SHAPES:
        shape = Shape(depth, topk, num_draft_tokens)
        means = []
        for rule in TABLE_RULES:
            values = []
            for seed, (concentration, sigma) in enumerate(TABLE_WORLDS):
                world = perturbed_world(4, depth, seed, concentration, sigma)
                values.append(expand_round_law(world, rule, shape).expected_accepted)
            assert all(0.0 <= v <= min(depth, num_draft_tokens - 1) + 1e-12 for v in values)
            means.append(sum(values) / len(values))
        print(f"{(depth, topk, num_draft_tokens)!s:10} " + "  ".join(f"{m:10.3f}" for m in means))
