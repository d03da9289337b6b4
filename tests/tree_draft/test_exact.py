"""Exact law of the server's whole round with ``LevelDrafter`` (``oracles/level_exact.py``).

Every drafting outcome of the batched drafter itself is enumerated (its uniforms split at every
draw), each tree gets the exact law of ``verify_tree``'s method (``hsd`` and ``rrs``, bonus token
included) with the tree's own q rows, and rounds are chained: the law of the first 2-3 emitted
tokens is compared with the target's on context-dependent worlds (V = 3). ``"slot"`` contexts
give beams the q of SGLang's per-slot draft KV cache (wrong parents for beams that changed slot).
"""

import numpy as np
import pytest

from sglang_hsd.verify.oracles import exact
from sglang_hsd.verify.oracles.expand_exact import Shape, expand_round_law, perturbed_world
from sglang_hsd.verify.oracles.level_exact import level_prefix_tv, level_round_law
from sglang_hsd.tree_draft import CHILD_SAMPLERS, DEFAULT_LEVEL_RULE, LEVEL_RULES, LOSSLESS_LEVEL_RULES, TreeShape
from sglang_hsd.verify.oracles.level_exact import SAMPLER_LAWS

pytestmark = pytest.mark.exact

LOSSLESS_TV = 1e-12
LOSSY_TV = 1e-3
LOSSLESS_RULES = list(LOSSLESS_LEVEL_RULES)
# The sequential oracle rule (``oracles/expand_exact.py``) with the same law.
SEQUENTIAL = {"spine": "spine", "spine_wide": "spine_wide", "beam": "beam", "pruned": "pruned_beam"}
CASES = [  # (D, k, N), emitted tokens compared, draft context
    ((2, 2, 4), 4, "path"),
    ((2, 3, 5), 3, "path"),
    ((3, 2, 5), 3, "slot"),
    ((3, 2, 6), 3, "path"),
]


def test_registry():
    assert LEVEL_RULES[DEFAULT_LEVEL_RULE].lossless and not LEVEL_RULES["pruned"].lossless
    assert set(SEQUENTIAL) == set(LEVEL_RULES)
    assert set(SAMPLER_LAWS) == set(CHILD_SAMPLERS)  # the oracle knows every sampler's law


@pytest.mark.parametrize("shape", [(2, 2, 4), (3, 2, 6)])
def test_with_replacement_sampler_is_lossy(shape):
    """Children drawn i.i.d. (duplicates possible) but verified as draws without replacement: biased."""
    assert not CHILD_SAMPLERS["with_replacement"].lossless
    world = exact.random_world(3, 2 + shape[0], seed=3)
    tvs = level_prefix_tv(world, DEFAULT_LEVEL_RULE, TreeShape(*shape), 3, methods=("hsd", "rrs"),
                          sampler="with_replacement")
    assert min(tvs.values()) > LOSSY_TV, tvs


@pytest.mark.parametrize("shape,length,context", CASES)
@pytest.mark.parametrize("rule", LOSSLESS_RULES)
def test_lossless(rule, shape, length, context):
    world = exact.random_world(3, length - 1 + shape[0], seed=sum(shape))
    tvs = level_prefix_tv(world, rule, TreeShape(*shape), length, methods=("hsd", "rrs"), context=context)
    assert max(tvs.values()) < LOSSLESS_TV, tvs


@pytest.mark.parametrize("shape,length,context", [CASES[0], CASES[2]])  # k < V: with k = V every node holds all tokens
def test_gumbel_twin_is_lossless_and_stepping_past_drawn_tokens_is_not(shape, length, context, monkeypatch):
    """The same drafter on Gumbel top-k children (the default's twin, same law) is lossless; the
    plausible slip of the inverse-transform sampler (invert the whole of q, step past tokens drawn
    already: ``test_noise.SKIP_DRAWN``), verified as draws without replacement, is not."""
    from tests.tree_draft.test_noise import SKIP_DRAWN

    world = exact.random_world(3, length - 1 + shape[0], seed=sum(shape))
    cfg = TreeShape(*shape)
    twin = level_prefix_tv(world, DEFAULT_LEVEL_RULE, cfg, length, methods=("hsd", "rrs"), context=context,
                           sampler="gumbel_topk")
    assert max(twin.values()) < LOSSLESS_TV, twin
    monkeypatch.setitem(CHILD_SAMPLERS, SKIP_DRAWN.name, SKIP_DRAWN)
    monkeypatch.setitem(SAMPLER_LAWS, SKIP_DRAWN.name, "without-replacement")  # what it claims
    wrong = level_prefix_tv(world, DEFAULT_LEVEL_RULE, cfg, length, methods=("hsd", "rrs"), context=context,
                            sampler=SKIP_DRAWN.name)
    assert min(wrong.values()) > LOSSY_TV, wrong


@pytest.mark.parametrize("seed", [0, 1])
def test_pruned_is_lossy(seed):
    """SGLang's selection on sampled children keeps nodes for their own and deeper scores: biased."""
    world = exact.random_world(3, 2 + 2, seed=seed)
    tvs = level_prefix_tv(world, "pruned", TreeShape(2, 2, 4), 3, methods=("hsd", "rrs"))
    assert min(tvs.values()) > LOSSY_TV, tvs


@pytest.mark.parametrize("shape", [(2, 2, 4), (2, 3, 5), (3, 2, 6)])
@pytest.mark.parametrize("rule", sorted(LEVEL_RULES))
def test_round_law_is_the_sequential_rule(rule, shape):
    """The batched level-synchronous drafter has the round law of the sequential rule it implements."""
    world = exact.random_world(3, 2 + shape[0], seed=5)
    for prefix in [(), (1, 2)]:
        level = level_round_law(world, rule, TreeShape(*shape), prefix).emitted
        sequential = expand_round_law(world, SEQUENTIAL[rule], Shape(*shape), prefix).emitted
        assert max(abs(level.get(b, 0.0) - sequential.get(b, 0.0)) for b in set(level) | set(sequential)) < 1e-14


@pytest.mark.parametrize("rule", LOSSLESS_RULES)
def test_deterministic_rows_give_the_argmax_path(rule):
    """Greedy requests: one-hot p, q's top-k children; every round emits the target's argmax path."""
    world = exact.random_world(3, 3 + 3, seed=2)
    one_hot = np.eye(3)[world.target.argmax(-1)]
    greedy = exact.TabularWorld(world.vocab_size, world.max_len, one_hot, world.draft)
    tvs = level_prefix_tv(greedy, rule, TreeShape(3, 2, 6), 4, methods=("hsd", "rrs"), deterministic=True)
    assert max(tvs.values()) < LOSSLESS_TV, tvs


@pytest.mark.parametrize("rule", LOSSLESS_RULES)
def test_lossless_on_peaked_worlds(rule):
    """Peaked Dirichlet(0.3) targets and a drafter off by exp(N(0, 1)) factors."""
    world = perturbed_world(3, 3 - 1 + 3, seed=0, concentration=0.3, sigma=1.0)
    tvs = level_prefix_tv(world, rule, TreeShape(3, 2, 6), 3, methods=("hsd", "rrs"), context="slot")
    assert max(tvs.values()) < LOSSLESS_TV, tvs


TABLE_SHAPES = [(3, 2, 7), (4, 2, 8), (5, 4, 8)]
TABLE_WORLDS = [(1.0, 0.5), (1.0, 1.0), (0.3, 0.5), (0.3, 1.0)]  # as test_expand_exact.py's table


def test_default_rule_accepts_the_most():
    """Exact expected accepted drafts per round (V = 4, first round, mean over the worlds) of the
    default and the spine, through their sequential twins (equal laws, tested above); the other
    columns of docs/verification.md's table come from ``test_expand_exact.py``. Prints (pytest -s)."""
    for shape in TABLE_SHAPES:
        means = {}
        for rule in ("spine", DEFAULT_LEVEL_RULE):
            values = [expand_round_law(perturbed_world(4, shape[0], seed, c, s), SEQUENTIAL[rule], Shape(*shape)).expected_accepted
                      for seed, (c, s) in enumerate(TABLE_WORLDS)]
            means[rule] = sum(values) / len(values)
        print(shape, {rule: round(value, 3) for rule, value in means.items()})
        assert means[DEFAULT_LEVEL_RULE] >= means["spine"] - 1e-12


@pytest.mark.parametrize("scale", [0.5, 2.0])
def test_tempered_draft_is_lossless_and_reporting_the_untempered_q_is_not(scale):
    """``--hsd-draft-temperature-scale`` S: children drawn from q at temperature T * S and verified
    with those rows keep the target's law; the plausible slip of verifying them with q at T
    (the rows the request's own temperature gives) does not."""
    world = exact.random_world(3, 2 + 3, seed=4)
    tempered = exact.tempered_draft(world, scale)
    cfg = TreeShape(3, 2, 6)
    tvs = level_prefix_tv(tempered, DEFAULT_LEVEL_RULE, cfg, 3, methods=("hsd", "rrs"))
    assert max(tvs.values()) < LOSSLESS_TV, tvs
    wrong = level_prefix_tv(tempered, DEFAULT_LEVEL_RULE, cfg, 3, methods=("hsd", "rrs"), reported_q=world)
    assert min(wrong.values()) > LOSSY_TV, wrong


def test_sharper_draft_accepts_more_from_a_flat_drafter():
    """A drafter flatter than the target (a noisy copy of p at twice the target's temperature):
    drafting at half its temperature accepts more tokens per round (2.46 -> 2.65 here)."""
    flat = exact.tempered_draft(perturbed_world(3, 2 + 3, seed=0, concentration=0.3, sigma=0.5), 2.0)
    cfg = TreeShape(3, 2, 6)
    accepted = {s: level_round_law(exact.tempered_draft(flat, s), DEFAULT_LEVEL_RULE, cfg, (1,)).expected_accepted
                for s in (1.0, 0.5)}
    assert accepted[0.5] > accepted[1.0] + 0.1, accepted
