"""The round planner's lookup shapes: greedy replays of ``lookup:n,target`` and
``lookup:n,model:D,target`` reproduce the engine's target rounds exactly, a wrong record replays
other rounds, the sampled replay's limits, the plan entry's levels, and the errors for inputs the
planner cannot replay."""

import dataclasses

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from sglang_hsd.draft_length import DraftLengthRule  # noqa: E402
from sglang_hsd.hierarchy.lookup_record import LookupRecord, lookup_record  # noqa: E402
from sglang_hsd.hierarchy.lookup_replay import LookupShape, replay_lookup  # noqa: E402
from sglang_hsd.hierarchy.replay import STOP_THRESHOLDS, AcceptanceRecord  # noqa: E402
from sglang_hsd.hierarchy.recording import record_acceptance  # noqa: E402
from sglang_hsd.hierarchy.round_costs import DrafterSpec, KernelSetting, RoundCosts  # noqa: E402
from sglang_hsd.hierarchy.round_planner import (  # noqa: E402
    RoundPlan, RoundShape, candidate_shapes, rank_candidates, replay,
)
from sglang_hsd.levels import LevelKind, LevelSpec  # noqa: E402
from sglang_hsd.runtime.config import parse_levels  # noqa: E402
from sglang_hsd.runtime.engine import SpeculativeGenerator  # noqa: E402
from sglang_hsd.sampling import SamplingParams  # noqa: E402

NEW_TOKENS = 24
# Prompts with repeats, so that the lookup finds earlier text to copy from the first round on.
PROMPTS = [[1, 2, 3, 4, 1, 2, 3], [5, 6, 5, 6, 5], [7, 8, 9, 10, 11, 12, 7, 8], [3, 3]]
SHAPES = [LookupShape(2, 3), LookupShape(1, 6), LookupShape(2, 2, 4), LookupShape(2, 4, 6), LookupShape(1, 3, 1)]


def _records(target, drafter, shape, params=SamplingParams(0.0)):
    return record_acceptance(target, DrafterSpec(model=drafter), PROMPTS, params, NEW_TOKENS + shape.longest,
                             lookup=(shape.ngram, shape.copies))["fp32"]


def _engine_rounds(target, drafter, shape):
    """(target rounds, tokens the target accepted, lookups that copied something) of the engine."""
    if shape.uses_model:
        config = parse_levels(f"lookup:{shape.ngram},model:tiny,target", buffers=[shape.copies, shape.model_buffer],
                              methods=["hsd", "hsd"], draft_length=DraftLengthRule())
    else:
        config = parse_levels(f"lookup:{shape.ngram},target", buffers=[shape.copies], methods=["hsd"])
    gen = SpeculativeGenerator(target, config, drafter=drafter if shape.uses_model else None)
    rounds = accepted = copied = 0
    for prompt in PROMPTS:
        levels = gen.generate([prompt], SamplingParams(0.0), max_new_tokens=NEW_TOKENS).levels
        rounds += levels[-1].rounds
        accepted += levels[-1].accepted
        copied += levels[0].proposed
    return rounds, accepted, copied


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.label)
def test_greedy_lookup_replay_equals_the_engine(target, drafter, shape):
    stats = replay(RoundShape(lookup=shape), _records(target, drafter, shape), NEW_TOKENS)
    rounds, accepted, copied = _engine_rounds(target, drafter, shape)
    assert copied > 0, "the prompts must give the lookup something to copy"
    assert stats.rounds == rounds, shape.label
    assert stats.tokens == NEW_TOKENS * len(PROMPTS)
    # The engine counts every accepted token, the replay the emitted ones (cut at max_new_tokens).
    assert stats.tokens <= accepted + rounds
    assert stats.tokens_per_round > 1.0  # some copies (or the small model's buffer) were accepted
    if not shape.uses_model:
        assert stats.lookups == stats.rounds and not stats.drafter_calls
        assert sum(stats.target_calls.values()) == rounds


def test_a_wrong_record_is_caught_by_the_lookup_replay_test(target, drafter):
    # The exactness test has teeth: the drafter's own continuation (not the target's) replays other
    # rounds, and so does a small model that accepted every copy.
    shape = LookupShape(2, 2, 4)
    right = _records(target, drafter, shape)
    wrong = record_acceptance(drafter, DrafterSpec(model=target), PROMPTS, SamplingParams(0.0),
                              NEW_TOKENS + shape.longest, lookup=(2, 2))["fp32"]
    trusting = [dataclasses.replace(r, lookup=dataclasses.replace(
        r.lookup, copy_q=(r.lookup.copy_len[:, None] > np.arange(r.lookup.max_copies)).astype(float)))
        for r in right]
    rounds = replay(RoundShape(lookup=shape), right, NEW_TOKENS).rounds
    assert rounds == _engine_rounds(target, drafter, shape)[0]
    assert replay(RoundShape(lookup=shape), wrong, NEW_TOKENS).rounds != rounds
    assert replay(RoundShape(lookup=shape), trusting, NEW_TOKENS).rounds != rounds


def test_lookup_record_reads_each_copy_along_the_path():
    # Prompt 1 2 3 1 2, continuation 3 1 9: at start 0 the suffix "1 2" matched earlier copies "3 1 2".
    context = torch.tensor([1, 2, 3, 1, 2, 3, 1, 9])
    p = torch.full((3, 10), 0.05)
    p[torch.arange(3), torch.tensor([3, 1, 9])] = 0.55
    record = lookup_record(context, 5, p, p.flip(-1), ngram=2, max_copies=4)
    assert record.copy_len.tolist() == [3, 2, 1]  # cut where the record ends
    assert record.copy_p[0].tolist() == pytest.approx([0.55, 0.55, 0.05, 0.0])  # copies 3 1 2 against 3 1 9
    assert record.copy_q[0, :3].tolist() == pytest.approx([0.05, 0.05, 0.05])


def _synthetic(length: int, copies: int, copy_p: float, copy_q: float, alpha: float) -> AcceptanceRecord:
    found = LookupRecord(3, np.full(length, copies), np.full((length, 16), copy_p), np.full((length, 16), copy_q))
    return AcceptanceRecord(False, np.full(length, alpha), np.zeros(length, dtype=np.int64),
                            np.zeros((len(STOP_THRESHOLDS), length)), found)


def test_sampled_lookup_replay_limits():
    sure = [_synthetic(80, 8, 1.0, 1.0, 1.0)]
    assert replay_lookup(sure, 45, LookupShape(3, 8)).tokens_per_round == pytest.approx(9.0)
    assert replay_lookup([_synthetic(80, 0, 1.0, 1.0, 1.0)], 40, LookupShape(3, 8)).tokens_per_round == 1.0
    # Three levels, every copy and token accepted: sub-rounds of 4 copies + 1 fill a buffer of 10
    # to 10, the target accepts it and adds its own.
    three = replay_lookup(sure, 40, LookupShape(3, 4, 10))
    assert three.tokens_per_round == pytest.approx(40 / 4)  # 11 per round, the last round cut
    # 1 + 4 rows per sub-round, 2 + 4 on a round's first after a whole buffer was accepted.
    assert three.drafter_calls == {5: 5.0, 6: 3.0} and three.target_calls == {11: 4.0}
    # The small model rejects every copy: one token per sub-round, a buffer of 10.
    assert replay_lookup([_synthetic(80, 4, 1.0, 0.0, 1.0)], 40, LookupShape(3, 4, 10)).drafted == pytest.approx(
        10 * 4)
    # Copies the target never accepts but the small model always does: one token per round.
    bad = replay_lookup([_synthetic(80, 4, 0.0, 1.0, 1.0)], 40, LookupShape(3, 4, 10))
    assert bad.tokens_per_round == 1.0
    half = replay_lookup([_synthetic(80, 8, 0.5, 1.0, 1.0)], 40, LookupShape(3, 8))
    assert 1.5 < half.tokens_per_round < 2.5


def _costs(draft_ratio: float, lookup_seconds: float = 1e-4) -> RoundCosts:
    rows = (1, 2, 4, 8, 17, 33)
    return RoundCosts(KernelSetting(1, "mkl"), rows, tuple(draft_ratio * (1 + 0.01 * n) for n in rows),
                      tuple(1.0 + 0.05 * (n - 1) for n in rows), 0.0, lookup_seconds)


def test_the_planner_chooses_a_lookup_and_writes_its_levels():
    lookups = [LookupShape(3, 8), LookupShape(3, 8, 16)]
    shapes = candidate_shapes(fixed=[4], adaptive=[], trees=[], lookups=lookups)
    # Copies always right and a drafter that is never: copies verified by the target win.
    copies_right = {"fp32": [_synthetic(80, 8, 1.0, 0.0, 0.0)]}
    ranked = rank_candidates(shapes, [_costs(0.3)], copies_right, 40)
    assert ranked[0].shape.lookup == LookupShape(3, 8)
    drafter = LevelSpec(LevelKind.MODEL, model_path="d")
    entry = RoundPlan({}, [_costs(0.3)], ranked).planned_hierarchy(drafter)
    assert entry.level_names == "lookup:3,target" and entry.buffers == [8]
    assert entry.knobs.drafter_precision is None and entry.knobs.draft_length == DraftLengthRule()
    # Copies rarely right, a cheap drafter always right: the three-level hierarchy fills 16 for
    # the target at a small model's cost.
    model_right = {"fp32": [_synthetic(80, 8, 0.2, 0.2, 1.0)]}
    ranked = rank_candidates(shapes, [_costs(0.02)], model_right, 40)
    assert ranked[0].shape.lookup == LookupShape(3, 8, 16)
    entry = RoundPlan({}, [_costs(0.02)], ranked).planned_hierarchy(drafter)
    assert entry.level_names == "lookup:3,model:d,target" and entry.buffers == [8, 16]
    assert entry.knobs.drafter_precision == "fp32"


def test_lookup_candidates_are_priced_once_per_kernel_setting_without_the_drafter():
    import dataclasses as dc

    fp32 = _costs(0.3)
    int4 = dc.replace(fp32, setting=KernelSetting(1, "mkl", "int4"))
    record = _synthetic(80, 8, 0.5, 0.5, 0.5)
    shapes = candidate_shapes(fixed=[2], adaptive=[], trees=[], lookups=[LookupShape(3, 8), LookupShape(3, 4, 8)])
    ranked = rank_candidates(shapes, [fp32, int4], {"fp32": [record], "int4": [record]}, 40)
    labels = [(p.shape.label, p.costs.setting.drafter_precision) for p in ranked]
    assert sorted(labels) == sorted([("plain", "fp32"), ("lookup:3 8 -> target", "fp32"),
                                     ("fixed 2", "fp32"), ("fixed 2", "int4"),
                                     ("lookup:3 4 -> model 8", "fp32"), ("lookup:3 4 -> model 8", "int4")])


def test_bad_lookup_input_is_refused(target, drafter):
    with pytest.raises(ValueError, match="--lookups must be <ngram>:<copies>"):
        LookupShape.parse("3:0", "--lookups")
    with pytest.raises(ValueError, match="--lookups must be"):
        LookupShape.parse("3", "--lookups")
    with pytest.raises(ValueError, match="share one n-gram"):
        candidate_shapes(lookups=[LookupShape(3, 4), LookupShape(2, 4)])
    with pytest.raises(ValueError, match="records need lookup copies"):
        replay_lookup([_synthetic(80, 4, 1.0, 1.0, 1.0)], 40, LookupShape(2, 4))
    with pytest.raises(ValueError, match="records need lookup copies"):
        replay_lookup([_synthetic(80, 4, 1.0, 1.0, 1.0)], 40, LookupShape(3, 32))
    with pytest.raises(ValueError, match="cannot replay"):
        replay_lookup([_synthetic(30, 4, 1.0, 1.0, 1.0)], 24, LookupShape(3, 4, 8))
    with pytest.raises(ValueError, match="lookup must be"):
        record_acceptance(target, DrafterSpec(model=drafter), PROMPTS, SamplingParams(0.0), 8, lookup=(0, 4))

