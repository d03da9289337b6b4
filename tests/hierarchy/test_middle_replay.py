"""The round planner's middle-exit shape ``model:D,exit:L,target``: greedy replays reproduce the
engine's target rounds exactly, wrong records replay other rounds, the sampled replay's limits,
the costs of the exit's and the target's calls, the plan entry's levels, and the errors for
inputs the planner cannot replay."""

import dataclasses

import numpy as np
import pytest

pytest.importorskip("transformers")

from sglang_hsd.draft_length import DraftLengthRule  # noqa: E402
from sglang_hsd.hierarchy.middle_record import MiddleRecord  # noqa: E402
from sglang_hsd.hierarchy.middle_replay import MiddleShape, replay_middle  # noqa: E402
from sglang_hsd.hierarchy.recording import record_acceptance  # noqa: E402
from sglang_hsd.hierarchy.replay import STOP_THRESHOLDS, AcceptanceRecord  # noqa: E402
from sglang_hsd.hierarchy.round_costs import DrafterSpec, KernelSetting, RoundCosts, measure_round_costs  # noqa: E402
from sglang_hsd.hierarchy.round_planner import (  # noqa: E402
    RoundPlan, RoundShape, candidate_shapes, middle_candidates, plan_rounds, rank_candidates, replay,
)
from sglang_hsd.levels import LevelKind, LevelSpec  # noqa: E402
from sglang_hsd.runtime.config import parse_levels  # noqa: E402
from sglang_hsd.runtime.engine import SpeculativeGenerator  # noqa: E402
from sglang_hsd.sampling import SamplingParams  # noqa: E402

NEW_TOKENS = 24
PROMPTS = [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12], [3, 3]]
SHAPES = [MiddleShape(3, 2, 3), MiddleShape(4, 3, 2), MiddleShape(2, 1, 4), MiddleShape(5, 4, 1)]


def _records(target, drafter, layers, params=SamplingParams(0.0), longest=16):
    return record_acceptance(target, DrafterSpec(model=drafter), PROMPTS, params, NEW_TOKENS + longest,
                             middle_layers=layers)["fp32"]


def _engine_rounds(target, drafter, shape):
    """(target rounds, exit rounds) of the engine running ``model:tiny,exit:L,target``."""
    config = parse_levels(f"model:tiny,exit:{shape.layer},target", buffers=[shape.draft, shape.buffer],
                          methods=["hsd", "hsd"], draft_length=DraftLengthRule())
    gen = SpeculativeGenerator(target, config, drafter=drafter)
    rounds = middle_rounds = 0
    for prompt in PROMPTS:
        levels = gen.generate([prompt], SamplingParams(0.0), max_new_tokens=NEW_TOKENS).levels
        rounds += levels[-1].rounds
        middle_rounds += levels[1].rounds
    return rounds, middle_rounds


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.label)
def test_greedy_middle_replay_equals_the_engine(target, drafter, shape):
    stats = replay(RoundShape(middle=shape), _records(target, drafter, [shape.layer]), NEW_TOKENS)
    rounds, middle_rounds = _engine_rounds(target, drafter, shape)
    assert stats.rounds == rounds, shape.label
    assert stats.tokens == NEW_TOKENS * len(PROMPTS)
    assert stats.tokens_per_round > 1.0
    # Sub-rounds past the first token the target rejects are priced, not replayed: their count
    # is close to the engine's, not equal.
    assert sum(stats.middle_calls.values()) == pytest.approx(middle_rounds, rel=0.35)
    assert set(stats.middle_calls) == {shape.draft + 1}
    assert sum(stats.target_calls.values()) == rounds


def test_wrong_middle_records_are_caught_by_the_replay_test(target, drafter):
    # The exactness test has teeth: another exit's record, and an exit that the target always
    # accepts (the drafter then decides nothing the target sees), replay other rounds.
    shape = MiddleShape(3, 2, 3)
    records = _records(target, drafter, [2, 3])
    rounds = _engine_rounds(target, drafter, shape)[0]
    assert replay(RoundShape(middle=shape), records, NEW_TOKENS).rounds == rounds
    other_layer = [dataclasses.replace(r, middles=(dataclasses.replace(r.middle(2), layer=3),)) for r in records]
    trusted = [dataclasses.replace(r, middles=(dataclasses.replace(
        r.middle(3), target_pass=np.ones(r.length)),)) for r in records]
    assert replay(RoundShape(middle=shape), other_layer, NEW_TOKENS).rounds != rounds
    assert replay(RoundShape(middle=shape), trusted, NEW_TOKENS).rounds != rounds


def _synthetic(length: int, draft_pass: float, target_pass: float, layer: int = 3) -> AcceptanceRecord:
    middle = MiddleRecord(layer, np.full(length, draft_pass), np.full(length, target_pass))
    return AcceptanceRecord(False, np.full(length, 0.5), np.zeros(length, dtype=np.int64),
                            np.zeros((len(STOP_THRESHOLDS), length)), middles=(middle,))


def test_sampled_middle_replay_limits():
    # Every draft and token accepted: sub-rounds of 4 drafts + the exit's bonus fill 10 to 10,
    # the target accepts all and adds its own: 11 per round.
    sure = replay_middle([_synthetic(80, 1.0, 1.0)], 44, MiddleShape(3, 4, 10))
    assert sure.tokens_per_round == pytest.approx(11.0)
    assert sure.middle_calls == {5: 8.0} and sure.target_calls == {11: 4.0}
    # The drafter's first call: one row at the start, two (the last draft and the bonus token)
    # after every sub-round or round that accepted everything; then one row per draft.
    assert sure.drafter_calls == {1: 1.0 + 24.0, 2: 7.0} and sure.drafted == 32.0
    # The exit rejects every draft: one token per sub-round, a buffer of 10 takes 10 sub-rounds.
    stubborn = replay_middle([_synthetic(80, 0.0, 1.0)], 44, MiddleShape(3, 4, 10))
    assert stubborn.tokens_per_round == pytest.approx(11.0) and stubborn.middle_calls == {5: 40.0}
    # The target never accepts the exit's tokens: one token per round, whatever the drafter does.
    assert replay_middle([_synthetic(80, 1.0, 0.0)], 40, MiddleShape(3, 4, 10)).tokens_per_round == 1.0
    half = replay_middle([_synthetic(80, 1.0, 0.5)], 40, MiddleShape(3, 4, 10))
    assert 1.5 < half.tokens_per_round < 2.5


def _costs(draft_ratio: float, middle_ratio: float, layer: int = 3) -> RoundCosts:
    rows = (1, 2, 4, 8, 17, 33)
    verify = tuple(1.0 + 0.05 * (n - 1) for n in rows)
    return RoundCosts(KernelSetting(1, "mkl"), rows, tuple(draft_ratio * (1 + 0.01 * n) for n in rows), verify, 0.0,
                      middle_layers=(layer,), middle_seconds=(tuple(middle_ratio * v for v in verify),),
                      tail_seconds=(tuple((1 - middle_ratio) * v for v in verify),))


def test_middle_calls_are_priced_as_the_exit_and_the_target_above_it():
    costs = _costs(0.1, 0.25)
    assert costs.middle(3, 8) == pytest.approx(0.25 * costs.verify(8))
    assert costs.tail(3, 8) == pytest.approx(0.75 * costs.verify(8))
    seconds = costs.round_seconds({1: 2.0}, {9: 1.0}, 2.0, middle_calls={5: 2.0}, middle_layer=3)
    assert seconds == pytest.approx(2 * costs.draft(1) + costs.tail(3, 9) + 2 * costs.middle(3, 5))
    assert RoundCosts.from_dict(costs.as_dict()) == costs
    with pytest.raises(ValueError, match="no middle exit timed at layer 4"):
        costs.middle(4, 2)
    with pytest.raises(ValueError, match="middle_calls need the middle_layer"):
        costs.round_seconds({}, {2: 1.0}, 0.0, middle_calls={5: 1.0})
    with pytest.raises(ValueError, match="middle_layers must increase"):
        RoundCosts(KernelSetting(1, "mkl"), (1, 2), (1.0, 1.0), (1.0, 1.0), 0.0, middle_layers=(3,))


def test_the_planner_chooses_a_middle_exit_only_where_it_pays():
    shapes = candidate_shapes(fixed=[4, 8], adaptive=[], trees=[], middles=[MiddleShape(3, 4, 8)])
    drafter = LevelSpec(LevelKind.MODEL, model_path="d")
    # A drafter the target accepts half the time, an exit that takes a quarter of the target's
    # layers and agrees with both: the exit filters for the target cheaply.
    good = [dataclasses.replace(_synthetic(80, 1.0, 1.0), alpha=np.full(80, 0.5))]
    ranked = rank_candidates(shapes, [_costs(0.05, 0.25)], {"fp32": good}, 40)
    assert ranked[0].shape.middle == MiddleShape(3, 4, 8)
    entry = RoundPlan({}, [_costs(0.05, 0.25)], ranked).planned_hierarchy(drafter)
    assert entry.level_names == "model:d,exit:3,target" and entry.buffers == [4, 8]
    assert entry.knobs.drafter_precision == "fp32" and entry.knobs.draft_length == DraftLengthRule()
    # The same exit at nine tenths of the target's cost, agreeing with the target less than the
    # drafter does: the chain wins.
    poor = [dataclasses.replace(_synthetic(80, 1.0, 0.6), alpha=np.full(80, 0.9))]
    ranked = rank_candidates(shapes, [_costs(0.05, 0.9)], {"fp32": poor}, 40)
    assert ranked[0].shape.middle is None and ranked[0].shape.fixed is not None


def test_middle_costs_and_records_on_tiny_models(target, drafter):
    costs = measure_round_costs(target, DrafterSpec(model=drafter), [KernelSetting(1, "mkl")], context_len=8,
                                rows=(1, 2, 4), repeats=1, middle_layers=(2, 4))
    assert costs[0].middle_layers == (2, 4)
    assert all(len(r) == 3 and min(r) > 0 for r in (*costs[0].middle_seconds, *costs[0].tail_seconds))
    records = _records(target, drafter, [2, 4], SamplingParams(1.0))
    assert [m.layer for m in records[0].middles] == [2, 4]
    assert all(0 <= m.draft_pass.min() and m.target_pass.max() <= 1 + 1e-9 for r in records for m in r.middles)


def test_bad_middle_input_is_refused(target, drafter):
    with pytest.raises(ValueError, match="--middles must be <exit layer>:<drafts>:<exit buffer>"):
        MiddleShape.parse("3:4", "--middles")
    with pytest.raises(ValueError, match="--middles must be"):
        MiddleShape.parse("3:0:4", "--middles")
    with pytest.raises(ValueError, match="needs a separate drafter model"):
        middle_candidates("3:4:8", separate_drafter=False)
    assert middle_candidates(None, True) == [] and middle_candidates("3:4:8,2:2:4", True)[1] == MiddleShape(2, 2, 4)
    with pytest.raises(ValueError, match="records need the exit at layer 4"):
        replay_middle([_synthetic(80, 1.0, 1.0, layer=3)], 40, MiddleShape(4, 4, 8))
    with pytest.raises(ValueError, match="cannot replay"):
        replay_middle([_synthetic(30, 1.0, 1.0)], 24, MiddleShape(3, 4, 8))
    with pytest.raises(ValueError, match=r"middle_layers must lie in \[1, 6\)"):
        record_acceptance(target, DrafterSpec(model=drafter), PROMPTS, SamplingParams(0.0), 8, middle_layers=[6])
    with pytest.raises(ValueError, match="needs a separate drafter model"):
        record_acceptance(target, DrafterSpec(layer=2), PROMPTS, SamplingParams(0.0), 8, middle_layers=[3])
    with pytest.raises(ValueError, match="needs a separate drafter model"):
        plan_rounds(target, DrafterSpec(layer=2), PROMPTS, SamplingParams(0.0), 8,
                    [RoundShape(middle=MiddleShape(3, 2, 4))], [KernelSetting(1, "mkl")])
