"""Sampled draft trees: the one tree drafter the server and the runtime both drive.

``shape.py`` the tree's shape (D, k, N) and its ``"D:k:N"`` spelling; ``drafter.py`` the
level-synchronous drafter in SGLang's pool layout (``DraftPlan``, ``LevelDrafter``); ``rules.py``
which nodes are forwarded and kept; ``children.py`` how a node's children are drawn (without replacement,
the greedy-row rule); ``noise.py`` the keyed, counter-based noise they are drawn with. The
sequential drafters of the exact study (full trees, one node per step) live with the oracles in
``sglang_hsd/verify/oracles/``.
"""

from sglang_hsd.tree_draft.children import CHILD_SAMPLERS, DEFAULT_CHILD_SAMPLER, ChildSampler, greedy_draft_q
from sglang_hsd.tree_draft.drafter import DraftPlan, LevelDrafter, LevelTree, StepInput, budget_shapes, check_budget
from sglang_hsd.tree_draft.noise import (
    TREE_NOISE_TAG,
    KeyedNoise,
    NoiseSource,
    TableNoise,
    TargetKeyedNoise,
    forward_slice,
)
from sglang_hsd.tree_draft.rules import DEFAULT_LEVEL_RULE, LEVEL_RULES, LOSSLESS_LEVEL_RULES, LevelRule, LevelState
from sglang_hsd.tree_draft.shape import TreeShape

__all__ = [
    "CHILD_SAMPLERS",
    "DEFAULT_CHILD_SAMPLER",
    "DEFAULT_LEVEL_RULE",
    "LEVEL_RULES",
    "LOSSLESS_LEVEL_RULES",
    "TREE_NOISE_TAG",
    "ChildSampler",
    "DraftPlan",
    "KeyedNoise",
    "LevelDrafter",
    "LevelRule",
    "LevelState",
    "LevelTree",
    "NoiseSource",
    "StepInput",
    "TableNoise",
    "TargetKeyedNoise",
    "TreeShape",
    "budget_shapes",
    "check_budget",
    "forward_slice",
    "greedy_draft_q",
]
