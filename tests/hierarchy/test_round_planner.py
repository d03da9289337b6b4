"""The round planner: greedy replays reproduce the engine's rounds exactly (fixed, adaptive and
tree drafts, a separate drafter model and an exit drafter), the top-k tree's kept paths, the
sampled replay's limits, the choice between plain decoding and speculation from costs, and the
errors for inputs the planner cannot replay."""

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from sglang_hsd.draft_length import DraftLengthRule, parse_draft_length  # noqa: E402
from sglang_hsd.hierarchy.replay import STOP_THRESHOLDS, AcceptanceRecord, kept_rank_paths, replay_chain  # noqa: E402
from sglang_hsd.hierarchy.recording import record_acceptance  # noqa: E402
from sglang_hsd.hierarchy.round_costs import DrafterSpec, KernelSetting, RoundCosts  # noqa: E402
from sglang_hsd.hierarchy.round_planner import (  # noqa: E402
    RoundShape, best_plain, candidate_shapes, rank_candidates, replay,
)
from sglang_hsd.runtime.config import parse_levels  # noqa: E402
from sglang_hsd.runtime.engine import SpeculativeGenerator  # noqa: E402
from sglang_hsd.sampling import SamplingParams  # noqa: E402
from sglang_hsd.tree_draft import TreeShape  # noqa: E402
from tests.runtime.helpers import PROMPTS  # noqa: E402

NEW_TOKENS = 20


SHAPES = [RoundShape(fixed=1), RoundShape(fixed=3), RoundShape(fixed=6),
          RoundShape(adaptive=parse_draft_length("adaptive:0.6:8")),
          RoundShape(adaptive=parse_draft_length("adaptive:0.9:4")),
          RoundShape(tree=TreeShape(3, 2, 6)), RoundShape(tree=TreeShape(4, 2, 8)),
          RoundShape(tree=TreeShape(2, 3, 5))]


@pytest.mark.parametrize("spec", ["model:tiny,target", "exit:2,target"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.label)
def test_greedy_replay_equals_the_engine(target, drafter, spec, shape):
    spec_drafter = DrafterSpec(model=drafter) if spec.startswith("model") else DrafterSpec(layer=2)
    records = record_acceptance(target, spec_drafter, PROMPTS, SamplingParams(0.0), NEW_TOKENS + 10)["fp32"]
    stats = replay(shape, records, NEW_TOKENS)
    rule = shape.adaptive or DraftLengthRule()
    config = parse_levels(spec, buffers=[shape.buffer], methods=["hsd"], draft_length=rule, tree=shape.tree)
    gen = SpeculativeGenerator(target, config, drafter=drafter if spec.startswith("model") else None)
    rounds = accepted = 0
    for prompt in PROMPTS:
        top = gen.generate([prompt], SamplingParams(0.0), max_new_tokens=NEW_TOKENS).levels[-1]
        rounds += top.rounds
        accepted += top.accepted
    assert stats.rounds == rounds, (spec, shape.label)
    assert stats.tokens == NEW_TOKENS * len(PROMPTS)
    # The engine counts every accepted draft, the replay the emitted tokens (cut at max_new_tokens).
    assert stats.tokens <= accepted + rounds
    if shape.fixed is not None:
        assert stats.drafted == rounds * shape.fixed


def test_replay_counts_a_chains_accepted_drafts_like_the_engine(target, drafter):
    # Stronger than rounds alone: every round's accepted count, for a chain of 4.
    records = record_acceptance(target, DrafterSpec(model=drafter), PROMPTS, SamplingParams(0.0), NEW_TOKENS + 10)["fp32"]
    gen = SpeculativeGenerator(target, parse_levels("model:tiny,target", buffers=[4]), drafter=drafter)
    for prompt, record in zip(PROMPTS, records):
        result = gen.generate([prompt], SamplingParams(0.0), max_new_tokens=NEW_TOKENS)
        stats = replay_chain([record], NEW_TOKENS, DraftLengthRule(), 4)
        top = result.levels[-1]
        assert (stats.rounds, stats.drafted) == (top.rounds, top.proposed)


def test_a_wrong_record_is_caught_by_the_replay_test(target, drafter):
    # The exactness test has teeth: records of the drafter's *own* continuation (not the target's)
    # replay other rounds than the engine runs.
    spec = DrafterSpec(model=drafter)
    right = record_acceptance(target, spec, PROMPTS, SamplingParams(0.0), NEW_TOKENS + 10)["fp32"]
    wrong = record_acceptance(drafter, DrafterSpec(model=target), PROMPTS, SamplingParams(0.0), NEW_TOKENS + 10)["fp32"]
    shape = RoundShape(fixed=3)
    assert replay(shape, right, NEW_TOKENS).rounds != replay(shape, wrong, NEW_TOKENS).rounds


def test_kept_rank_paths_of_a_small_tree():
    # D = 3, k = 2, N = 6: the argmax chain, then the root's second draw, then c_1's second draw.
    assert kept_rank_paths(TreeShape(3, 2, 6)) == ((0,), (0, 0), (0, 0, 0), (1,), (0, 1))
    # A larger budget reaches the children of the root's second draw (the spare beam's).
    paths = kept_rank_paths(TreeShape(3, 2, 8))
    assert (1, 0) in paths and (1, 1) in paths and len(paths) == 7


def test_forwarded_prefix_of_an_accepted_path():
    from sglang_hsd.hierarchy.replay import forwarded_prefix

    # D = 4: beams forward depths 1-3, the chain's draws only.
    assert forwarded_prefix((0, 0, 0, 0), 4) == 3
    assert forwarded_prefix((0, 1, 0), 4) == 2  # the sibling at depth 2 was a beam, its child not
    assert forwarded_prefix((1, 0), 4) == 1
    assert forwarded_prefix((), 4) == 0 and forwarded_prefix((0,), 1) == 0


def _record(alpha: float, length: int = 64, stop: float = 0.0) -> AcceptanceRecord:
    return AcceptanceRecord(False, np.full(length, alpha), np.zeros(length, dtype=np.int64),
                            np.full((len(STOP_THRESHOLDS), length), stop))


def test_sampled_replay_limits():
    full, none = [_record(1.0)], [_record(0.0)]
    assert replay(RoundShape(fixed=4), full, 40).tokens_per_round == pytest.approx(5.0)
    assert replay(RoundShape(fixed=4), none, 40).tokens_per_round == pytest.approx(1.0)
    # A tree with two children per node at alpha 0.5 accepts more per round than the chain.
    half = [_record(0.5)]
    chain = replay(RoundShape(fixed=3), half, 40).tokens_per_round
    tree = replay(RoundShape(tree=TreeShape(3, 2, 6)), half, 40).tokens_per_round
    assert 1.5 < chain < tree
    # An adaptive rule that always stops drafts one token per round.
    always = [_record(1.0, stop=1.0)]
    assert replay(RoundShape(adaptive=parse_draft_length("adaptive:0.4:16")), always, 40).drafted == pytest.approx(20)


def _costs(draft_ratio: float, verify_growth: float = 0.05) -> RoundCosts:
    rows = (1, 2, 4, 8, 17, 33)
    return RoundCosts(KernelSetting(1, "mkl"), rows, tuple(draft_ratio * (1 + 0.01 * n) for n in rows),
                      tuple(1.0 + verify_growth * (n - 1) for n in rows), 0.0)


def test_choice_follows_costs_and_acceptance():
    shapes = candidate_shapes()
    cheap = rank_candidates(shapes, [_costs(0.05)], {"fp32": [_record(1.0, 80)]}, 40)
    # Every draft accepted and drafts nearly free: the longest chains win.
    assert cheap[0].shape.tree is None and not cheap[0].shape.plain and cheap[0].drafted_per_round >= 16
    assert cheap[0].seconds_per_token < best_plain(cheap).seconds_per_token
    costly = rank_candidates(shapes, [_costs(1.0)], {"fp32": [_record(0.3, 80)]}, 40)
    assert costly[0].shape.plain


def test_bad_candidates_are_refused():
    with pytest.raises(ValueError, match="threshold"):
        candidate_shapes(adaptive=["adaptive:0.45:16"])
    with pytest.raises(ValueError, match="tree candidate 2:2:9"):
        candidate_shapes(trees=[(2, 2, 9)])
    with pytest.raises(ValueError, match="cannot replay"):
        replay(RoundShape(fixed=8), [_record(1.0, 20)], 16)
    with pytest.raises(ValueError, match="exactly one"):
        DrafterSpec()
    with pytest.raises(ValueError, match="kernel_path"):
        KernelSetting(1, "int8")
    with pytest.raises(ValueError, match="drafter_precision must be one of fp32, bf16, fp16, int8, int4, w8a8"):
        KernelSetting(1, "mkl", "int3")


def test_a_cheaper_drafter_precision_is_chosen_and_plain_is_not_repeated():
    import dataclasses

    fp32 = _costs(0.3)
    bf16 = dataclasses.replace(fp32, setting=KernelSetting(1, "mkl", "bf16"),
                               draft_seconds=tuple(d / 2 for d in fp32.draft_seconds))
    ranked = rank_candidates(candidate_shapes(), [fp32, bf16], {"fp32": [_record(1.0, 80)], "bf16": [_record(1.0, 80)]}, 40)
    assert ranked[0].costs.setting.drafter_precision == "bf16" and "drafter bf16" in ranked[0].label
    assert [p.costs.setting.drafter_precision for p in ranked if p.shape.plain] == ["fp32"]
    from sglang_hsd.hierarchy.round_planner import RoundPlan
    from sglang_hsd.levels import LevelKind, LevelSpec

    entry = RoundPlan({}, [fp32, bf16], ranked).planned_hierarchy(LevelSpec(LevelKind.MODEL, model_path="d"))
    assert entry.knobs.drafter_precision == "bf16"


def test_the_plan_file_entry_carries_the_chosen_knobs():
    from sglang_hsd.runtime.plan_file import CHAINS, PlannedHierarchy, RunKnobs
    from sglang_hsd.hierarchy.round_planner import RoundPlan
    from sglang_hsd.levels import LevelKind, LevelSpec

    drafter = LevelSpec(LevelKind.MODEL, model_path="drafter-folder")
    cheap = RoundPlan({}, [_costs(0.05)], rank_candidates(candidate_shapes(), [_costs(0.05)], {"fp32": [_record(1.0, 80)]}, 40))
    entry = cheap.planned_hierarchy(drafter)
    best = cheap.best
    assert entry.level_names == "model:drafter-folder,target" and entry.buffers == [best.shape.buffer]
    assert entry.knobs == RunKnobs(best.shape.draft_rule, best.shape.tree or CHAINS, 1, "mkl", "fp32")
    knobs = entry.to_json()
    assert (knobs["draft_length"], knobs["tree"], knobs["threads"], knobs["kernel_path"]) == (
        best.shape.draft_length, best.shape.tree_text, 1, "mkl")
    assert entry.predicted_speedup > 1
    assert PlannedHierarchy.from_json(entry.to_json()) == entry
    costly = RoundPlan({}, [_costs(1.0)], rank_candidates(candidate_shapes(), [_costs(1.0)], {"fp32": [_record(0.3, 80)]}, 40))
    plain = costly.planned_hierarchy(drafter)
    assert plain.autoregressive and plain.knobs == RunKnobs(threads=1, kernel_path="mkl")
    assert plain.predicted_speedup == 1.0


def test_round_costs_time_each_drafter_precision_and_restore_the_models(target, drafter, monkeypatch):
    from sglang_hsd.hierarchy import call_timer, round_costs

    timed = []
    call = call_timer.CallTimer.call
    monkeypatch.setattr(call_timer.CallTimer, "call", lambda self, model, *a, **k: timed.append(
        ("target" if model is target else "drafter", type(model.lm_head).__name__)) or call(self, model, *a, **k))
    settings = [KernelSetting(1, "mkl"), KernelSetting(1, "mkl", "bf16")]
    costs = round_costs.measure_round_costs(target, DrafterSpec(model=drafter), settings, context_len=8, rows=(1, 2),
                                            repeats=1)
    assert [c.setting for c in costs] == settings
    # The drafter is timed under each precision, the target once (its calls do not depend on it).
    assert timed == [("drafter", "Linear")] * 2 + [("target", "Linear")] * 2 + [("drafter", "CopyRowsLinear")] * 2
    assert type(drafter.lm_head) is torch.nn.Linear and type(target.lm_head) is torch.nn.Linear
    with pytest.raises(ValueError, match="an exit drafter runs the target's own weights"):
        round_costs.measure_round_costs(target, DrafterSpec(layer=2), settings, context_len=8, rows=(1, 2), repeats=1)


def test_each_drafter_precision_replays_its_own_records(target, drafter):
    import dataclasses

    records = record_acceptance(target, DrafterSpec(model=drafter), PROMPTS, SamplingParams(1.0), NEW_TOKENS + 10,
                                drafter_precisions=("fp32", "int4", "int4+w8a8"))
    assert type(drafter.lm_head) is torch.nn.Linear  # the copy is gone after recording
    # A mix drafts on its single-row part: its records are that part's, recorded once.
    assert all(a is b for a, b in zip(records["int4"], records["int4+w8a8"]))
    fp32_only = record_acceptance(target, DrafterSpec(model=drafter), PROMPTS, SamplingParams(1.0), NEW_TOKENS + 10)
    assert all(np.array_equal(a.alpha, b.alpha) for a, b in zip(records["fp32"], fp32_only["fp32"]))
    assert not all(np.array_equal(a.alpha, b.alpha) for a, b in zip(records["fp32"], records["int4"]))  # the copy's q
    # A cheaper precision whose drafts are rarely accepted loses to one whose drafts always are.
    fp32 = _costs(0.3)
    int4 = dataclasses.replace(fp32, setting=KernelSetting(1, "mkl", "int4"),
                               draft_seconds=tuple(d / 4 for d in fp32.draft_seconds))
    ranked = rank_candidates(candidate_shapes(), [fp32, int4], {"fp32": [_record(1.0, 80)], "int4": [_record(0.1, 80)]},
                             40)
    assert ranked[0].costs.setting.drafter_precision == "fp32"
    with pytest.raises(ValueError, match="records: none for drafter precision 'int4'"):
        rank_candidates(candidate_shapes(), [fp32, int4], {"fp32": [_record(1.0, 80)]}, 40)
    with pytest.raises(ValueError, match="an exit drafter runs the target's own weights"):
        record_acceptance(target, DrafterSpec(layer=2), PROMPTS, SamplingParams(1.0), 8, drafter_precisions=("int4",))


def test_the_prefill_enters_the_prediction_once_per_prompt():
    import dataclasses

    from sglang_hsd.hierarchy.round_planner import predict

    costs = dataclasses.replace(_costs(0.05), prefill_lengths=(10, 20), target_prefill_seconds=(1.0, 2.0),
                                drafter_prefill_seconds=(0.5, 1.0))
    records = [_record(1.0, 80), _record(1.0, 80)]
    assert costs.prefill(15, drafter=False) == pytest.approx(1.5)
    assert costs.prefill(15, drafter=True) == pytest.approx(2.25)
    assert costs.prefill(30, drafter=False) == pytest.approx(3.0)  # extrapolated from the last two
    for shape, per_prompt in ((RoundShape(), 1.5), (RoundShape(fixed=4), 2.25)):
        without = predict(shape, costs, records, 40)
        # Two records of 40 tokens: each prompt's prefill (the mean of lengths 10 and 20) once.
        with_prefill = predict(shape, costs, records, 40, prompt_lengths=[10, 20])
        assert with_prefill.prefill_seconds == pytest.approx(per_prompt)
        assert with_prefill.seconds_per_token == pytest.approx(without.seconds_per_token + 2 * per_prompt / 80)
    one = dataclasses.replace(costs, prefill_lengths=(10,), target_prefill_seconds=(1.0,), drafter_prefill_seconds=())
    assert one.prefill(25, drafter=True) == pytest.approx(2.5)  # one length: proportional, no drafter part
    assert RoundCosts.from_dict(costs.as_dict()) == costs
    with pytest.raises(ValueError, match="one entry per prefill length"):
        dataclasses.replace(costs, target_prefill_seconds=(1.0,))
    with pytest.raises(ValueError, match="prefill_lengths must be increasing"):
        dataclasses.replace(costs, prefill_lengths=(20, 10))


def test_a_costly_drafter_prefill_turns_the_choice_away_from_the_drafter():
    import dataclasses

    shapes = candidate_shapes()
    cheap = dataclasses.replace(_costs(0.05), prefill_lengths=(100,), target_prefill_seconds=(1.0,),
                                drafter_prefill_seconds=(0.1,))
    costly = dataclasses.replace(cheap, drafter_prefill_seconds=(1000.0,))
    records = {"fp32": [_record(1.0, 80)]}
    assert rank_candidates(shapes, [cheap], records, 40, prompt_lengths=[100])[0].shape.uses_drafter
    assert rank_candidates(shapes, [costly], records, 40, prompt_lengths=[100])[0].shape.plain


def test_round_costs_time_prefills_once_per_model_and_kernels(target, drafter):
    from sglang_hsd.hierarchy import round_costs

    settings = [KernelSetting(1, "mkl"), KernelSetting(1, "mkl", "bf16")]
    costs = round_costs.measure_round_costs(target, DrafterSpec(model=drafter), settings, context_len=8, rows=(1, 2),
                                            repeats=1, prefill_lengths=(12, 6))
    for cost in costs:
        assert cost.prefill_lengths == (6, 12) and len(cost.drafter_prefill_seconds) == 2
        assert all(s > 0 for s in cost.target_prefill_seconds + cost.drafter_prefill_seconds)
    assert costs[0].target_prefill_seconds == costs[1].target_prefill_seconds  # the target's: timed once
    exit_costs = round_costs.measure_round_costs(target, DrafterSpec(layer=2), settings[:1], context_len=8,
                                                 rows=(1, 2), repeats=1, prefill_lengths=(6,))
    assert exit_costs[0].drafter_prefill_seconds == () and len(exit_costs[0].target_prefill_seconds) == 1
