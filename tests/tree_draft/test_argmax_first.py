"""Argmax-first children (``CHILD_SAMPLERS["argmax_first_cdf"]``, the server's, and its Gumbel twin
``"argmax_first"``; ``verify_tree(draft_mode="argmax-first")``).

A node's first child is q's argmax (deterministic, as the stock tree's top-1 child), its later
siblings are drawn without replacement from q without it; the verifier tests each child against
its own proposal (one-hot for the first). Exact: the batched ``LevelDrafter`` is driven on every
drafting outcome (``oracles/level_exact.py``) and the laws of the first 3-4 emitted tokens over
chained rounds are compared with the target's (TV < 1e-12), at every shape and lossless rule of
``test_exact.py``, with greedy rows and tempered drafts; the plausible slip of verifying the
deterministic first child as if it had been sampled from q (the ordinary without-replacement
verifier) is biased. Statistical: the drafter with the server's keyed noise and ``verify_tree``
itself, by chi-square. The Triton ``hsd`` kernel in this mode: ``tests/verify/tree/test_triton.py``.
"""

import numpy as np
import pytest
import torch

from sglang_hsd.tree_draft import CHILD_SAMPLERS, DEFAULT_LEVEL_RULE, LOSSLESS_LEVEL_RULES, DraftPlan, KeyedNoise, \
    LevelDrafter, TreeShape
from sglang_hsd.verify.oracles import exact
from sglang_hsd.verify.oracles.expand_exact import Shape, expand_round_law, perturbed_world
from sglang_hsd.verify.oracles.level_exact import drive, level_prefix_tv, level_round_law
from sglang_hsd.verify.oracles.simulate import simulate_tree, target_prefix_probs
from sglang_hsd.verify.oracles.stats import chi_square_p_value

SAMPLER = "argmax_first_cdf"
LOSSLESS_TV = 1e-12
LOSSY_TV = 1e-3
CASES = [  # (D, k, N), emitted tokens compared, draft context: as test_exact.py
    ((2, 2, 4), 4, "path"),
    ((2, 3, 5), 3, "path"),
    ((3, 2, 5), 3, "slot"),
    ((3, 2, 6), 3, "path"),
]
WRONG = "without-replacement"  # the first child verified as if it had been drawn from q


@pytest.mark.parametrize("name", [SAMPLER, "argmax_first"])
def test_sampler_takes_the_argmax_first_then_draws_without_it(name):
    sampler = CHILD_SAMPLERS[name]
    assert sampler.lossless and sampler.draft_mode == "argmax-first"
    gen = torch.Generator().manual_seed(0)
    q = torch.softmax(torch.randn(64, 6, generator=gen, dtype=torch.float64), -1)
    q[:8, 3:] = 0.0  # rows with 3 tokens of positive q
    draws = sampler.noise_draws(4)
    if sampler.noise == "uniform":
        noise = torch.rand(64, draws, generator=gen, dtype=torch.float64)
    else:
        noise = -torch.log(-torch.log(torch.rand(64, draws, 6, generator=gen, dtype=torch.float64)))
    det = torch.arange(64) % 5 == 0
    tokens, valid = sampler.draw(q, noise, det, 4)
    assert torch.equal(tokens[:, 0], q.argmax(-1))
    assert torch.equal(valid, (torch.arange(4) < torch.where(torch.arange(64) < 8, 3, 4).unsqueeze(-1)))
    assert all(len(set(row[ok].tolist())) == int(ok.sum()) for row, ok in zip(tokens, valid))
    assert torch.equal(tokens[det][:, :3], torch.topk(q[det], 3).indices)  # greedy rows: q's top k
    assert not torch.equal(tokens[~det & (torch.arange(64) >= 8)][:, 1], torch.topk(q, 2).indices[~det & (torch.arange(64) >= 8)][:, 1])


@pytest.mark.exact
@pytest.mark.parametrize("shape,length,context", CASES)
@pytest.mark.parametrize("rule", list(LOSSLESS_LEVEL_RULES))
def test_lossless_and_the_sampled_verifier_is_not(rule, shape, length, context):
    world = exact.random_world(3, length - 1 + shape[0], seed=sum(shape))
    cfg = TreeShape(*shape)
    tvs = level_prefix_tv(world, rule, cfg, length, methods=("hsd", "rrs"), context=context, sampler=SAMPLER)
    print(rule, shape, "argmax-first TV", tvs)
    assert max(tvs.values()) < LOSSLESS_TV, tvs
    wrong = level_prefix_tv(world, rule, cfg, length, methods=("hsd", "rrs"), context=context, sampler=SAMPLER,
                            verify_mode=WRONG)
    print(rule, shape, "first child verified as sampled TV", wrong)
    assert min(wrong.values()) > LOSSY_TV, wrong


@pytest.mark.exact
@pytest.mark.parametrize("rule", list(LOSSLESS_LEVEL_RULES))
def test_lossless_on_peaked_worlds(rule):
    """Peaked Dirichlet(0.3) targets, a drafter off by exp(N(0, 1)) factors, per-slot contexts."""
    world = perturbed_world(3, 3 - 1 + 3, seed=0, concentration=0.3, sigma=1.0)
    cfg = TreeShape(3, 2, 6)
    tvs = level_prefix_tv(world, rule, cfg, 3, methods=("hsd", "rrs"), context="slot", sampler=SAMPLER)
    assert max(tvs.values()) < LOSSLESS_TV, tvs
    wrong = level_prefix_tv(world, rule, cfg, 3, methods=("hsd", "rrs"), context="slot", sampler=SAMPLER,
                            verify_mode=WRONG)
    assert min(wrong.values()) > LOSSY_TV, wrong


@pytest.mark.exact
@pytest.mark.parametrize("rule", list(LOSSLESS_LEVEL_RULES))
def test_deterministic_rows_give_the_argmax_path(rule):
    world = exact.random_world(3, 3 + 3, seed=2)
    greedy = exact.TabularWorld(world.vocab_size, world.max_len, np.eye(3)[world.target.argmax(-1)], world.draft)
    tvs = level_prefix_tv(greedy, rule, TreeShape(3, 2, 6), 4, methods=("hsd", "rrs"), deterministic=True,
                          sampler=SAMPLER)
    assert max(tvs.values()) < LOSSLESS_TV, tvs


@pytest.mark.exact
@pytest.mark.parametrize("scale", [0.5, 2.0])
def test_tempered_draft(scale):
    """Children from q at T * S verified with those rows: lossless; with q at T: not."""
    world = exact.random_world(3, 2 + 3, seed=4)
    tempered = exact.tempered_draft(world, scale)
    cfg = TreeShape(3, 2, 6)
    tvs = level_prefix_tv(tempered, DEFAULT_LEVEL_RULE, cfg, 3, methods=("hsd", "rrs"), sampler=SAMPLER)
    assert max(tvs.values()) < LOSSLESS_TV, tvs
    wrong = level_prefix_tv(tempered, DEFAULT_LEVEL_RULE, cfg, 3, methods=("hsd", "rrs"), sampler=SAMPLER,
                            reported_q=world)
    assert min(wrong.values()) > LOSSY_TV, wrong


@pytest.mark.exact
@pytest.mark.parametrize("shape", [(2, 2, 4), (2, 3, 5), (3, 2, 6)])
@pytest.mark.parametrize("rule", list(LOSSLESS_LEVEL_RULES))
def test_round_law_is_the_sequential_rule(rule, shape):
    """The batched drafter's round law equals the sequential oracle's with argmax-first children."""
    world = exact.random_world(3, 2 + shape[0], seed=5)
    for prefix in [(), (1, 2)]:
        level = level_round_law(world, rule, TreeShape(*shape), prefix, sampler=SAMPLER).emitted
        sequential = expand_round_law(world, rule, Shape(*shape), prefix, children="argmax-first").emitted
        assert max(abs(level.get(b, 0.0) - sequential.get(b, 0.0)) for b in set(level) | set(sequential)) < 1e-14


NUM_SEQUENCES = 20_000
PREFIX_LEN = 3
CFG = TreeShape(depth=3, topk=2, num_draft_tokens=7)


def _simulate(world, rule, method, draft_mode, seed=11):
    def draft(q_fn, roots, gen):
        root_q = q_fn(roots.view(-1, 1, 1))[:, 0]
        noise = KeyedNoise.fresh(torch.zeros_like(roots), gen)
        drafter = LevelDrafter(DraftPlan.build(CFG, rule, sampler=SAMPLER), root_q,
                               torch.zeros_like(roots, dtype=torch.bool), noise, validate=False)
        return drive(drafter, q_fn, roots, context="slot")

    return simulate_tree(world, method, CFG.topk, CFG.depth, PREFIX_LEN, NUM_SEQUENCES, torch.Generator().manual_seed(seed),
                         dtype=torch.float64, draft_fn=draft, draft_mode=draft_mode)


@pytest.mark.statistical
@pytest.mark.parametrize("rule,method", [("spine_wide", "hsd"), ("spine_wide", "rrs"), ("beam", "hsd")])
def test_batched_round_matches_target(rule, method):
    world = exact.random_world(3, PREFIX_LEN - 1 + CFG.depth, seed=7)
    result = _simulate(world, rule, method, "argmax-first")
    p_value = chi_square_p_value(result.prefix_counts(3), target_prefix_probs(world, PREFIX_LEN))
    print(rule, method, "chi-square p", p_value)
    assert p_value > 1e-4
    mean = level_round_law(world, rule, CFG, (), method, context="slot", sampler=SAMPLER).expected_accepted
    accepted = result.first_round_accepted.double()
    assert abs(float(accepted.mean()) - mean) < 5 * float(accepted.std()) / NUM_SEQUENCES**0.5


@pytest.mark.statistical
@pytest.mark.parametrize("method", ["hsd", "rrs"])
def test_batched_round_verified_as_sampled_fails(method):
    world = exact.random_world(3, PREFIX_LEN - 1 + CFG.depth, seed=7)
    result = _simulate(world, "spine_wide", method, WRONG)
    p_value = chi_square_p_value(result.prefix_counts(3), target_prefix_probs(world, PREFIX_LEN))
    print("spine_wide", method, "verified as sampled: chi-square p", p_value)
    assert p_value < 1e-6
