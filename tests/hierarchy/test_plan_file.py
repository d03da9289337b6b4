"""The plan file (``sglang_hsd.hierarchy.plan_file``): what the planner writes reads back equal,
hand-written minimal plans work, and bad files raise errors naming the field."""

import dataclasses
import json

import pytest

from sglang_hsd.levels import LevelKind
from sglang_hsd.hierarchy.plan_file import PlanFile, PlanMeasurement, PlannedHierarchy
from sglang_hsd.hierarchy.planner import Plan, PlanResult

EXITS = [4, 8, 12]


def _measurement(ar=0.5):
    return PlanMeasurement(
        model="tiny", temperature=0.0, top_k=0, top_p=1.0, candidates=EXITS,
        alpha=[[0.0, 0.8, 0.7, 0.6], [0.0, 0.0, 0.9, 0.8], [0.0] * 4, [0.0] * 4],
        costs={"num_layers": 16, "sample_seconds": 0.001}, prefix_seconds={"4": 0.1, "16": 0.4},
        autoregressive_seconds_per_token=ar,
    )


def _result(best_speedup):
    best = Plan(levels=(0, 2, 3), buffers=(3, 5), latency=0.25, speedup=best_speedup, exact_latency=0.3)
    single = Plan(levels=(1, 3), buffers=(4,), latency=0.3, speedup=1.2, exact_latency=0.35)
    return PlanResult(best=best, best_single_draft=single)


def test_planner_plan_round_trips_through_json_and_disk(tmp_path):
    plan = PlanFile.from_planner(_result(2.0), EXITS, _measurement())
    assert (plan.best.level_names, plan.best.buffer_text) == ("exit:4,exit:12,target", "3,5")
    assert (plan.runner_up_single_draft.level_names, plan.runner_up_single_draft.buffers) == ("exit:8,target", [4])
    data = plan.to_json()
    assert list(data) == [
        "levels", "buffers", "predicted_speedup", "predicted_seconds_per_token", "exact_model_speedup",
        "exact_model_seconds_per_token", "runner_up_single_draft", "model", "temperature", "top_k", "top_p",
        "candidates", "alpha", "costs", "prefix_seconds", "autoregressive_seconds_per_token",
    ]
    assert data["exact_model_speedup"] == pytest.approx(2.0 * 0.25 / 0.3)
    assert PlanFile.from_json(json.loads(json.dumps(data))) == plan
    plan.write(tmp_path / "plan.json")
    assert PlanFile.read(tmp_path / "plan.json") == plan


def test_no_faster_hierarchy_plans_the_target_alone():
    plan = PlanFile.from_planner(_result(0.8), EXITS, _measurement(ar=0.5))
    assert plan.best.autoregressive and plan.best.levels[0].kind is LevelKind.TARGET
    assert (plan.best.level_names, plan.best.buffer_text) == ("target", "")
    assert (plan.best.predicted_speedup, plan.best.predicted_seconds_per_token) == (1.0, 0.5)
    assert plan.best.exact_model_seconds_per_token == 0.3  # the best hierarchy's, as before
    assert plan.runner_up_single_draft.level_names == "exit:8,target"
    assert PlanFile.from_json(plan.to_json()) == plan


def test_a_hand_written_plan_needs_only_levels_and_buffers():
    data = {"levels": "exit:4,exit:12,target", "buffers": "2,4"}
    plan = PlanFile.from_json(data)
    assert plan.runner_up_single_draft is None and plan.measurement is None
    assert [level.layer for level in plan.best.levels[:-1]] == [4, 12]
    assert plan.to_json() == data
    assert PlanFile.from_json({"levels": "target", "buffers": ""}).best.autoregressive


@pytest.mark.parametrize("change,says", [
    (dict(levels=None), r"plan field levels is missing"),
    (dict(buffers=[2, 4]), r"plan field buffers must be a str, got \[2, 4\]"),
    (dict(buffers="2"), r"plan field buffers must hold 2 values .*got '2'"),
    (dict(buffers="2,x"), r"plan field buffers must be comma-separated integers"),
    (dict(buffers="2,0"), r"plan field buffers: buffer must be >= 1"),
    (dict(levels="exit:4,draft:1,target"), r"plan field levels: unknown level 'draft:1'"),
    (dict(levels="exit:4,exit:12", buffers="2"), r"plan field levels: the last level must be the target"),
    (dict(predicted_speedup="fast"), r"plan field predicted_speedup must be a float, got 'fast'"),
    (dict(runner_up_single_draft={"levels": "exit:8,target", "buffers": "a"}),
     r"plan field runner_up_single_draft\.buffers must be comma-separated integers"),
    (dict(runner_up_single_draft="exit:8,target"), r"plan field runner_up_single_draft must be a dict"),
    (dict(alpha=None), r"plan field alpha is missing"),
    (dict(top_k="0"), r"plan field top_k must be a int"),
])
def test_bad_fields_are_named(change, says):
    data = PlanFile.from_planner(_result(2.0), EXITS, _measurement()).to_json()
    for key, value in change.items():
        if value is None:
            del data[key]
        else:
            data[key] = value
    with pytest.raises(ValueError, match=says):
        PlanFile.from_json(data)


def test_bad_files_name_the_path(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match=rf"{path}: a plan file must be JSON"):
        PlanFile.read(path)
    path.write_text(json.dumps(["exit:4,target"]))
    with pytest.raises(ValueError, match=rf"{path}: a plan must be a JSON object, got list"):
        PlanFile.read(path)
    path.write_text(json.dumps({"levels": "exit:4,target"}))
    with pytest.raises(ValueError, match=rf"{path}: plan field buffers is missing"):
        PlanFile.read(path)


def test_planned_levels_are_typed():
    planned = PlannedHierarchy.from_plan(_result(2.0).best, EXITS)
    assert [level.kind for level in planned.levels] == [LevelKind.EXIT, LevelKind.EXIT, LevelKind.TARGET]
    assert dataclasses.replace(planned, predicted_speedup=None).to_json() == {
        "levels": "exit:4,exit:12,target", "buffers": "3,5",
        "predicted_seconds_per_token": 0.25, "exact_model_speedup": planned.exact_model_speedup,
        "exact_model_seconds_per_token": 0.3,
    }


def test_round_planner_knobs_round_trip_and_bad_knobs_are_named(tmp_path):
    data = {"levels": "model:qwen2.5-coder-0.5b,target", "buffers": "16", "draft_length": "adaptive:0.4:16",
            "tree": "none", "threads": 2, "kernel_path": "onednn-packed", "drafter_precision": "bf16",
            "predicted_speedup": 1.7}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    best = PlanFile.read(path).best
    assert (best.draft_length, best.tree, best.threads, best.kernel_path, best.drafter_precision) == (
        "adaptive:0.4:16", "none", 2, "onednn-packed", "bf16")
    assert best.to_json() == data
    for key, value, message in [("draft_length", "sometimes", "draft_length"), ("tree", "4:2", "tree"),
                                ("threads", 0, "threads"), ("kernel_path", "int8", "kernel_path"),
                                ("threads", "two", "threads"), ("drafter_precision", "int3", "drafter_precision")]:
        path.write_text(json.dumps({**data, key: value}))
        with pytest.raises(ValueError, match=message):
            PlanFile.read(path)
