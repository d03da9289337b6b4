"""Exact law of the server's whole round with ``LevelDrafter`` (``oracles/level_exact.py``).

Every drafting outcome of the batched drafter itself is enumerated (its uniforms split at every
draw), each tree gets the exact law of ``verify_tree``'s method (``hsd`` or ``rrs``, bonus token
included) with the tree's own q rows, and rounds are chained: the law of the first 3 emitted
tokens is compared with the target's on context-dependent worlds (V = 3).
"""

import pytest

from sglang_hsd.verify.oracles import exact
from sglang_hsd.verify.oracles.expand_exact import Shape, expand_round_law
from sglang_hsd.verify.oracles.level_exact import level_prefix_tv, level_round_law
from sglang_hsd.verify.tree.expand import ExpandConfig
from sglang_hsd.verify.tree.level_draft import DEFAULT_LEVEL_RULE, LEVEL_RULES

pytestmark = pytest.mark.exact

LOSSLESS_TV = 1e-12
LOSSY_TV = 1e-3
PREFIX_LEN = 3
LOSSLESS_RULES = [name for name, rule in LEVEL_RULES.items() if rule.lossless]
# The sequential oracle rule (``oracles/expand_exact.py``) with the same law.
SEQUENTIAL = {"spine": "spine", "beam": "beam", "pruned": "pruned_beam"}


def test_registry():
    assert LEVEL_RULES[DEFAULT_LEVEL_RULE].lossless and not LEVEL_RULES["pruned"].lossless
    assert set(SEQUENTIAL) == set(LEVEL_RULES)


@pytest.mark.parametrize("rule", LOSSLESS_RULES)
def test_lossless_small(rule):
    world = exact.random_world(3, PREFIX_LEN - 1 + 2, seed=3)
    assert level_prefix_tv(world, rule, ExpandConfig(2, 2, 4), PREFIX_LEN) < LOSSLESS_TV
