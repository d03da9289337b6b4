"""benchmarks/real_trees.py: the server's drafter and verifier driven by models, against the exact laws.

A tabular world stands in for the models (its log-probabilities as logits), so the Monte Carlo
means of the sampled rules and the stock tree's exact law can be held against the sequential
oracles' laws of the same shapes (``oracles/expand_exact.py``), including argmax-first children.
"""

import math

import numpy as np
import pytest
import torch

from benchmarks import real_trees
from sglang_hsd.sampling import SamplingParams
from sglang_hsd.tree_draft import DraftPlan, TreeShape
from sglang_hsd.verify.oracles import exact
from sglang_hsd.verify.oracles.expand_exact import Shape, expand_round_law

Z_TOLERANCE = 4.5


class WorldModel:
    """A ``PrefixModel`` stand-in: logits = log of a tabular world's rows (p or q)."""

    def __init__(self, rows):
        self.rows = rows
        self.memo = {(): self._logits(())}

    def _logits(self, path):
        return torch.tensor(np.log(np.maximum(self.rows(path), 1e-300)), dtype=torch.float64)

    def tree_logits(self, tokens, parents, depths):
        paths = []
        for token, parent in zip(tokens, parents):
            paths.append((() if parent < 0 else paths[parent]) + (token,))
        return torch.stack([self._logits(path) for path in paths])


@pytest.mark.parametrize("shape", [(3, 2, 5), (2, 3, 6)])
def test_stock_law_and_sampled_means_match_the_oracles(shape):
    world = exact.random_world(4, shape[0] + 1, seed=sum(shape), concentration=0.6)
    target, drafter = WorldModel(world.p), WorldModel(world.q)
    params = SamplingParams(temperature=1.0)
    tree_shape, oracle_shape = TreeShape(*shape), Shape(*shape)
    law = real_trees.stock_accepted_law(target, real_trees.stock_tree(drafter, tree_shape), params, shape[0])
    assert sum(law) == pytest.approx(1.0, abs=1e-12)
    assert sum(a * p for a, p in enumerate(law)) == pytest.approx(
        expand_round_law(world, "stock", oracle_shape).expected_accepted, abs=1e-6)  # float32 sampling rows
    gen = torch.Generator().manual_seed(1)
    for rule, sampler, children in [("spine_wide", "inverse_cdf", "sampled"), ("beam", "inverse_cdf", "sampled"),
                                    ("spine_wide", "argmax_first_cdf", "argmax-first")]:
        trees = real_trees.draft_trees(drafter, DraftPlan.build(tree_shape, rule, sampler=sampler), 3000, params, gen)
        counts = real_trees.accepted(target, trees, params, sampler, gen).double()
        want = expand_round_law(world, rule, oracle_shape, children=children).expected_accepted
        se = float(counts.std()) / math.sqrt(len(counts))
        assert abs(float(counts.mean()) - want) <= Z_TOLERANCE * se + 1e-3, (rule, sampler, float(counts.mean()), want)


def test_a_mismatched_drafting_mode_is_caught():
    """argmax-first trees verified as if every child had been sampled: the same comparison fails."""
    world = exact.random_world(4, 4, seed=5, concentration=0.6)
    target, drafter = WorldModel(world.p), WorldModel(world.q)
    params, gen = SamplingParams(temperature=1.0), torch.Generator().manual_seed(2)
    plan = DraftPlan.build(TreeShape(3, 2, 5), "spine_wide", sampler="argmax_first_cdf")
    trees = real_trees.draft_trees(drafter, plan, 3000, params, gen)
    counts = real_trees.accepted(target, trees, params, "inverse_cdf", gen).double()
    want = expand_round_law(world, "spine_wide", Shape(3, 2, 5), children="argmax-first").expected_accepted
    se = float(counts.std()) / math.sqrt(len(counts))
    assert abs(float(counts.mean()) - want) > Z_TOLERANCE * se + 1e-3
