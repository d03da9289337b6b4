"""Exact law of controlled rounds of sampled trees: ``BudgetController`` choosing each round's tree budget.

With ``--hsd-adaptive`` on a sampled tree (``--speculative-eagle-topk`` > 1) the controller picks,
before each round, a depth d in 0..D of the configured shape (D, k, N): d = 0 is plain decoding,
d > 0 drafts the tree ``tree_draft.budget_shapes(shape, rule)[d]`` (about d / D of the N - 1
nodes) with the server's own batched ``LevelDrafter``, verified by ``verify_tree``'s method.

``tree_budget_round`` is that round as a policy of ``adaptive_rounds_exact.controlled_prefix_distribution``:
the controller's choice from the branch's past rounds, then the exact law of the drafter's round
at that budget (``level_exact.level_round_law``: every drafting outcome of the batched drafter
enumerated, each tree with the verifier's exact outcome law). The controller is told the round
drafted ``longest_path`` of the budget (the most it could accept) and accepted the path's
length, as the server tells it. ``adaptive_rounds_exact.truncated(tree_budget_round(...))`` is the
plausible wrong controller that shortens a round after its rejection.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from sglang_hsd.tree_draft import DEFAULT_CHILD_SAMPLER, DEFAULT_LEVEL_RULE, TreeShape, budget_shapes
from sglang_hsd.verify.oracles.adaptive_rounds_exact import PromptedWorld, RoundPolicy
from sglang_hsd.verify.oracles.level_exact import level_round_law

__all__ = ["tree_budget_round"]


@lru_cache(maxsize=None)
def _tree_round(world: PromptedWorld, rule: str, shape: TreeShape, prefix: tuple[int, ...], method: str,
                sampler: str) -> tuple[tuple[tuple[int, ...], float], ...]:
    """(emitted block: accepted path + next token, probability) of one round of ``shape``."""
    law = level_round_law(world.base, rule, shape, world.prompt + tuple(prefix), method, sampler=sampler)
    return tuple(law.emitted.items())


def tree_budget_round(shape: TreeShape, rule: str = DEFAULT_LEVEL_RULE,
                      sampler: str = DEFAULT_CHILD_SAMPLER) -> RoundPolicy:
    """The round policy of a sampled tree of configured ``shape`` under the controller, whose
    candidates must be 0..D (``shape.depth``); ``rule`` / ``sampler``: keys of ``LEVEL_RULES`` /
    ``CHILD_SAMPLERS``. The policy's ``method`` is the tree verifier (``hsd`` or ``rrs``)."""
    budgets = budget_shapes(shape, rule)

    def round_law(world: PromptedWorld, method: str, setup, state, prefix, choose):
        if setup.longest != shape.depth:
            raise ValueError(f"the controller's longest candidate ({setup.longest}) must be the "
                             f"tree's depth ({shape.depth})")
        depth = choose(state.controller.request_rate(state.estimate))
        if depth == 0:
            p = world.p(prefix)
            return {(0, (int(token),), 0, 0): float(p[token]) for token in np.nonzero(p)[0]}
        budget = budgets[depth]
        return {(depth, block, budget.longest_path, len(block) - 1): prob
                for block, prob in _tree_round(world, rule, budget, tuple(prefix), method, sampler)}

    return round_law
