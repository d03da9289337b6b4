"""Adaptive draft length (``sglang_hsd/draft_length.py``): exact law of the emitted tokens over
several rounds, with the cap adapting across rounds, equals the target's; a rule that decides on a
drafted token and then drops it does not."""

import functools

import numpy as np
import pytest
import torch

from sglang_hsd.draft_length import DraftLengthKind, DraftLengthRule, format_draft_length, parse_draft_length
from sglang_hsd.verify.oracles.adaptive_exact import (
    adaptive_prefix_distribution,
    adaptive_round_law,
    mean_draft_length,
    stopped_drafts,
)
from sglang_hsd.sampling import SamplingParams, logits_to_probs
from sglang_hsd.verify.oracles.exact import TabularWorld, random_world, target_prefix_distribution, total_variation

LENGTH = 3
RULE = DraftLengthRule(DraftLengthKind.ADAPTIVE, threshold=0.45, min_length=1, max_length=4, grow=2)


def dropping_drafts(world, rule, prefix, cap):
    """Wrong: a token below the threshold ends the draft and is dropped (stopping *before* it)."""
    stack = [((), 1.0)]
    while stack:
        draft, prob = stack.pop()
        q = world.q(prefix + draft)
        for token in np.nonzero(q)[0]:
            longer, mass = draft + (int(token),), prob * float(q[token])
            if q[token] < rule.threshold and len(draft) >= rule.min_length:
                yield draft, mass
            elif len(longer) >= cap:
                yield longer, mass
            else:
                stack.append((longer, mass))


def _tv(world, method, rule, drafts=stopped_drafts, first_cap=None):
    law = adaptive_prefix_distribution(world, method, rule, LENGTH, first_cap, drafts)
    assert sum(law.values()) == pytest.approx(1.0, abs=1e-12)
    return total_variation(law, target_prefix_distribution(world, LENGTH))


@pytest.mark.exact
@pytest.mark.parametrize("method", ["hsd", "tokenwise"])
@pytest.mark.parametrize("seed,draft", [(0, "mixture"), (1, "mixture"), (2, "independent")])
@pytest.mark.parametrize("first_cap", [2, 4])
def test_adaptive_rounds_are_lossless(method, seed, draft, first_cap):
    world = random_world(vocab_size=3, max_len=LENGTH - 1 + RULE.max_length, seed=seed, draft=draft)
    assert _tv(world, method, RULE, first_cap=first_cap) < 1e-12


@pytest.mark.exact
@pytest.mark.parametrize("method", ["hsd", "tokenwise"])
def test_dropping_the_low_probability_token_is_biased(method):
    world = random_world(vocab_size=3, max_len=LENGTH - 1 + RULE.max_length, seed=0)
    assert _tv(world, method, RULE, drafts=dropping_drafts) > 1e-3


@pytest.mark.exact
def test_the_rule_really_stops_early_and_adapts():
    # Guards the tests above: drafts of several lengths occur and the cap moves both ways.
    world = random_world(vocab_size=3, max_len=LENGTH - 1 + RULE.max_length, seed=0)
    lengths = {len(d) for d, _ in stopped_drafts(world, RULE, (), RULE.max_length)}
    assert lengths >= {1, 2, 4}
    assert 1 < mean_draft_length(world, RULE, (), RULE.max_length) < RULE.max_length
    law = adaptive_round_law(world, "tokenwise", RULE, (), 4)
    assert {cap for _, cap in law} == {1, 2, 3, 4}  # accepted + 1 after a rejection
    assert {cap for _, cap in adaptive_round_law(world, "hsd", RULE, (), 1)} == {1, 3}  # + 2 after full acceptance
    assert sum(law.values()) == pytest.approx(1.0, abs=1e-12)


def _transformed_world(base, params):
    """``base`` with q replaced by the sampling transform of its rows (``logits_to_probs`` of log q):
    the engine's q, while its stopping rule reads the raw row (``base.q``)."""
    logits = torch.from_numpy(np.log(base.draft))
    q = logits_to_probs(logits, params).double().numpy()
    return TabularWorld(base.vocab_size, base.max_len, base.target, q / q.sum(-1, keepdims=True))


@pytest.mark.exact
@pytest.mark.parametrize("method", ["hsd", "tokenwise"])
@pytest.mark.parametrize("params", [SamplingParams(temperature=0.0), SamplingParams(temperature=0.5, top_k=2)])
def test_stopping_on_raw_confidence_while_verifying_transformed_q_is_lossless(method, params):
    # The engine stops on softmax(logits)[x_t] but hands the verifier q = transform(logits): the
    # stopping decision is still a function of the drafted prefix, so the law is the target's.
    base = random_world(vocab_size=3, max_len=LENGTH - 1 + RULE.max_length, seed=4)
    world = _transformed_world(base, params)
    drafts = functools.partial(stopped_drafts, confidence=base.q)
    assert _tv(world, method, RULE, drafts=drafts) < 1e-12
    # Guard: the raw confidence really stops, at different lengths after different prefixes
    # (at T = 0, stopping on q alone never would: q(x_t) = 1).
    prefixes = [(), (0,), (1,), (2,)]
    lengths = [mean_draft_length(world, RULE, prefix, RULE.max_length, drafts) for prefix in prefixes]
    assert len(set(lengths)) > 1 and min(lengths) < RULE.max_length
    if params.greedy:
        assert all(mean_draft_length(world, RULE, prefix, RULE.max_length) == RULE.max_length for prefix in prefixes)


def test_fixed_rule_keeps_caps_and_never_stops():
    rule = DraftLengthRule()
    caps = rule.initial_caps(3, fixed_length=5)
    assert caps.tolist() == [5, 5, 5]
    assert rule.next_caps(caps, caps, torch.tensor([0, 2, 5])).tolist() == [5, 5, 5]
    assert not rule.stops(torch.tensor([0.0, 0.1, 0.9]), torch.tensor([1, 2, 3])).any()
    logits = torch.tensor([[0.0, 1.0, 2.0], [5.0, -1.0, 0.0]])
    expected = torch.softmax(logits, -1)[[0, 1], [2, 0]]
    assert torch.allclose(DraftLengthRule.confidence(logits, torch.tensor([2, 0])), expected)
    adaptive = DraftLengthRule("adaptive", max_length=6, min_length=2)
    assert adaptive.next_caps(torch.tensor([4, 4, 6]), torch.tensor([4, 3, 6]),
                              torch.tensor([4, 0, 6])).tolist() == [6, 2, 6]


@pytest.mark.parametrize(
    "kwargs,field",
    [({"kind": "short"}, "kind"), ({"threshold": 1.5}, "threshold"), ({"min_length": 0}, "min_length"),
     ({"max_length": 0}, "max_length"), ({"max_length": 100}, "max_length"), ({"grow": -1}, "grow")],
)
def test_bad_rules_raise_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        DraftLengthRule(**kwargs)


def test_parse_draft_length():
    assert parse_draft_length("fixed") == DraftLengthRule()
    assert parse_draft_length("adaptive") == DraftLengthRule("adaptive")
    assert parse_draft_length("adaptive:0.3:20") == DraftLengthRule("adaptive", threshold=0.3, max_length=20)
    for bad in ("adaptive:x", "fixed:3", "long", "adaptive:0.3:4:5"):
        with pytest.raises(ValueError, match="--draft-length"):
            parse_draft_length(bad)


@pytest.mark.parametrize("text", ["fixed", "adaptive:0.4:16", "adaptive:0.3:20", "adaptive:0.0:1", "adaptive:1.0:64"])
def test_format_draft_length_round_trips(text):
    assert format_draft_length(parse_draft_length(text)) == text
    rule = parse_draft_length(text)
    assert parse_draft_length(format_draft_length(rule)) == rule


def test_format_draft_length_refuses_a_rule_without_a_spelling():
    assert format_draft_length(parse_draft_length("adaptive")) == "adaptive:0.4:16"  # the defaults spelled out
    for rule in (DraftLengthRule("adaptive", min_length=2), DraftLengthRule("adaptive", grow=0),
                 DraftLengthRule(threshold=0.5)):
        with pytest.raises(ValueError, match="no --draft-length spelling"):
            format_draft_length(rule)
