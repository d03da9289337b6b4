"""The plan file (``sglang_hsd.runtime.plan_file``): what the planner writes reads back equal,
hand-written minimal plans work, every runtime knob is read typed and written back unchanged, and
bad files raise errors naming the field."""

import dataclasses
import json
import re

import pytest

from sglang_hsd.draft_length import DraftLengthRule
from sglang_hsd.hierarchy.planner import Plan, PlanResult
from sglang_hsd.levels import LevelKind
from sglang_hsd.runtime.kernel_paths import PATH_MKL, PATH_PACKED
from sglang_hsd.runtime.kernel_setup import DRAFTER_PRECISIONS
from sglang_hsd.runtime.plan_file import CHAINS, PlanFile, PlanMeasurement, PlannedHierarchy, RunKnobs
from sglang_hsd.tree_draft import TreeShape

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


ROUND_PLANNER_PLAN = {
    "levels": "model:qwen2.5-coder-0.5b,target", "buffers": "16", "draft_length": "adaptive:0.4:16", "tree": "none",
    "threads": 2, "kernel_path": "onednn-packed", "drafter_precision": "bf16", "predicted_speedup": 1.7,
}


def test_round_planner_knobs_are_read_typed_and_written_back_unchanged(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(ROUND_PLANNER_PLAN))
    best = PlanFile.read(path).best
    assert best.knobs == RunKnobs(
        draft_length=DraftLengthRule("adaptive", threshold=0.4, max_length=16), tree=CHAINS, threads=2,
        kernel_path=PATH_PACKED, drafter_precision="bf16")
    assert best.to_json() == ROUND_PLANNER_PLAN
    assert list(best.to_json()) == list(ROUND_PLANNER_PLAN)  # the file's key order too


@pytest.mark.parametrize("key,text,typed", [
    ("draft_length", "fixed", DraftLengthRule()),
    ("draft_length", "adaptive:0.4:16", DraftLengthRule("adaptive")),
    ("draft_length", "adaptive:0.25:32", DraftLengthRule("adaptive", threshold=0.25, max_length=32)),
    ("tree", "none", CHAINS),
    ("tree", "4:2:8", TreeShape(4, 2, 8)),
    ("tree", "6:3:16", TreeShape(6, 3, 16)),
    ("threads", 1, 1),
    ("threads", 4, 4),
    ("kernel_path", "mkl", PATH_MKL),
    ("kernel_path", "onednn-packed", PATH_PACKED),
    *[("drafter_precision", name, name) for name in DRAFTER_PRECISIONS],
])
def test_each_knob_round_trips_json_typed_json(key, text, typed):
    data = {key: text}
    knobs = RunKnobs.from_json(data)
    assert getattr(knobs, key) == typed and knobs.present() == {key: typed}
    assert knobs.to_json() == data
    plan = {"levels": "exit:4,target", "buffers": "2", key: text}
    assert PlanFile.from_json(plan).to_json() == plan


def test_a_plan_without_knobs_has_none_and_writes_none():
    assert PlanFile.from_json({"levels": "exit:4,target", "buffers": "2"}).best.knobs == RunKnobs()
    assert RunKnobs().to_json() == {} and RunKnobs().present() == {}


@pytest.mark.parametrize("key,value,says", [
    ("draft_length", "sometimes", r"plan field draft_length must be fixed or adaptive"),
    ("draft_length", "adaptive:1.5", r"plan field draft_length: threshold must be in \[0, 1\]"),
    ("draft_length", 3, r"plan field draft_length must be a str, got 3"),
    ("tree", "4:2", r"plan field tree must be none or D:k:N"),
    ("tree", "4:2:1", r"plan field tree '4:2:1': num_draft_tokens must be an int >= 2"),
    ("threads", 0, r"plan field threads must be >= 1, got 0"),
    ("threads", "two", r"plan field threads must be a int, got 'two'"),
    ("threads", True, r"plan field threads must be a int, got True"),
    ("kernel_path", "int8", r"plan field kernel_path must be one of \['mkl', 'onednn-packed'\], got 'int8'"),
    ("drafter_precision", "int3", r"plan field drafter_precision must be one of fp32, bf16"),
    ("drafter_precision", "auto", r"plan field drafter_precision must be one of"),  # measured, not planned
])
def test_each_bad_knob_is_refused_naming_its_field(tmp_path, key, value, says):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({**ROUND_PLANNER_PLAN, key: value}))
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}: {says}"):
        PlanFile.read(path)
    runner_up = {"levels": "exit:8,target", "buffers": "4", key: value}
    with pytest.raises(ValueError, match=says.replace("plan field ", "plan field runner_up_single_draft.")):
        PlanFile.from_json({"levels": "target", "buffers": "", "runner_up_single_draft": runner_up})


@pytest.mark.parametrize("knobs,says", [
    (dict(draft_length=DraftLengthRule("adaptive", min_length=2)), "no --draft-length spelling"),
    (dict(draft_length=DraftLengthRule(grow=3)), "no --draft-length spelling"),
    (dict(draft_length="fixed"), "draft_length must be a DraftLengthRule"),
    (dict(tree="4:2:8"), "tree must be a TreeShape or CHAINS"),
    (dict(threads=0), "threads must be >= 1"),
    (dict(kernel_path="inductor"), "kernel_path must be one of"),
    (dict(drafter_precision="int3"), "drafter_precision must be one of"),
])
def test_typed_knobs_refuse_values_the_file_cannot_hold(knobs, says):
    with pytest.raises(ValueError, match=says):
        RunKnobs(**knobs)


def _generate_args(*options):
    from sglang_hsd.cli import build_parser

    return build_parser().parse_args(["generate", "--model", "tiny", *options])


EXPLICIT = ("--levels", "model:other,target", "--buffers", "3", "--draft-length", "adaptive:0.2:8",
            "--tree", "4:2:8", "--threads", "3", "--drafter-precision", "fp16")


def test_generate_without_a_plan_parses_its_options():
    from sglang_hsd.runtime.cli import DEFAULT_LEVELS, GenerateOptions, generate_options

    assert generate_options(_generate_args(), None) == GenerateOptions(
        DEFAULT_LEVELS, None, DraftLengthRule(), None, threads=1, drafter_precision="fp32", pack_linears=False)
    assert generate_options(_generate_args(*EXPLICIT), None) == GenerateOptions(
        "model:other,target", [3], DraftLengthRule("adaptive", threshold=0.2, max_length=8), TreeShape(4, 2, 8),
        threads=3, drafter_precision="fp16", pack_linears=False)


def test_generate_takes_every_knob_the_plan_has_over_the_options():
    from sglang_hsd.runtime.cli import GenerateOptions, generate_options

    args = _generate_args(*EXPLICIT)
    given = vars(args).copy()
    plan = PlanFile.from_json(ROUND_PLANNER_PLAN).best
    assert generate_options(args, plan) == GenerateOptions(
        "model:qwen2.5-coder-0.5b,target", [16], DraftLengthRule("adaptive"), None,  # tree "none": chains
        threads=2, drafter_precision="bf16", pack_linears=True)
    assert vars(args) == given  # the plan's values are used, not written back into the options
    tree_plan = dataclasses.replace(plan, knobs=dataclasses.replace(plan.knobs, tree=TreeShape(6, 3, 16)))
    assert generate_options(args, tree_plan).tree == TreeShape(6, 3, 16)
    mkl_plan = dataclasses.replace(plan, knobs=dataclasses.replace(plan.knobs, kernel_path=PATH_MKL))
    assert not generate_options(args, mkl_plan).pack_linears


def test_generate_keeps_the_options_a_plan_leaves_out():
    from sglang_hsd.runtime.cli import GenerateOptions, generate_options

    plan = PlanFile.from_json({"levels": "model:qwen2.5-coder-0.5b,target", "buffers": "16"}).best
    assert generate_options(_generate_args(*EXPLICIT), plan) == GenerateOptions(
        "model:qwen2.5-coder-0.5b,target", [16], DraftLengthRule("adaptive", threshold=0.2, max_length=8),
        TreeShape(4, 2, 8), threads=3, drafter_precision="fp16", pack_linears=False)
    # a separate drafter's default precision is measured ("auto"), with or without a plan
    assert generate_options(_generate_args(), plan).drafter_precision == "auto"


def test_generate_checks_a_plans_precision_against_its_levels():
    from sglang_hsd.runtime.cli import generate_options

    plan = PlanFile.from_json({"levels": "exit:4,target", "buffers": "2", "drafter_precision": "bf16"}).best
    with pytest.raises(ValueError, match="--drafter-precision bf16 needs a model:<name> level"):
        generate_options(_generate_args(), plan)
