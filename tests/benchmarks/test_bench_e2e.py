"""bench_e2e's options (no model is loaded and nothing is timed)."""

import json
from dataclasses import asdict
from types import SimpleNamespace

import pytest

from benchmarks import bench_e2e


def test_draft_length_per_config_is_checked_before_any_model_work():
    args = bench_e2e.parse_args(["--configs", "target", "exit:2,target", "--draft-length", "fixed", "adaptive:0.3:8"])
    assert args.draft_length == ["fixed", "adaptive:0.3:8"]
    with pytest.raises(ValueError, match="--draft-length: threshold must be a number"):
        bench_e2e.parse_args(["--configs", "exit:2,target", "--draft-length", "adaptive:x"])
    with pytest.raises(ValueError, match="--draft-length needs one value per --configs entry"):
        bench_e2e.parse_args(["--configs", "target", "exit:2,target", "--draft-length", "fixed"])


def test_tree_per_config_is_checked_before_any_model_work():
    args = bench_e2e.parse_args(["--configs", "target", "exit:2,target", "--tree", "none", "4:2:8"])
    assert args.tree == ["none", "4:2:8"]
    with pytest.raises(ValueError, match="--tree must be none or D:k:N"):
        bench_e2e.parse_args(["--configs", "exit:2,target", "--tree", "4:2"])
    with pytest.raises(ValueError, match="--tree '4:0:8': topk must be an int >= 1"):
        bench_e2e.parse_args(["--configs", "exit:2,target", "--tree", "4:0:8"])
    with pytest.raises(ValueError, match="--tree needs one value per --configs entry"):
        bench_e2e.parse_args(["--configs", "target", "exit:2,target", "--tree", "none"])


def test_tree_rows_are_labelled_and_compared_by_their_tree():
    from benchmarks.bench_report import check_batch_outputs, config_label

    base = {"temperature": 0, "config": "exit:2,target", "method": "hsd", "buffers": "", "draft_length": "fixed"}
    rows = [{**base, "batch_size": 1, "tree": "none", "outputs": [[1, 2]]},
            {**base, "batch_size": 1, "tree": "3:2:6", "outputs": [[1, 3]]},
            {**base, "batch_size": 4, "tree": "3:2:6", "outputs": [[1, 3]]}]
    check_batch_outputs(rows)
    assert rows[2]["matches_b1"] is True  # compared with the B = 1 tree row, not the chain row
    assert config_label(rows[1]) == "exit:2,target hsd [- tree 3:2:6]"
    assert config_label(rows[0]) == "exit:2,target hsd"


def test_drafter_precision_per_config_is_checked_and_labelled():
    args = bench_e2e.parse_args(["--configs", "target", "model:x,target", "--drafter-precision", "fp32", "bf16"])
    assert args.drafter_precision == ["fp32", "bf16"]
    with pytest.raises(ValueError, match="--drafter-precision must be one of fp32, bf16, fp16, int8, int4, w8a8, "
                       "int4\\+w8a8, got 'int3'"):
        bench_e2e.parse_args(["--configs", "model:x,target", "--drafter-precision", "int3"])
    from benchmarks.bench_report import check_batch_outputs, config_label

    base = {"temperature": 0, "config": "model:x,target", "method": "hsd", "buffers": "15", "draft_length": "fixed",
            "tree": "none"}
    rows = [{**base, "batch_size": 1, "drafter_precision": "fp32", "outputs": [[1, 2]]},
            {**base, "batch_size": 1, "drafter_precision": "bf16", "outputs": [[1, 3]]},
            {**base, "batch_size": 4, "drafter_precision": "bf16", "outputs": [[1, 3]]}]
    check_batch_outputs(rows)
    assert rows[2]["matches_b1"] is True  # compared with the bf16 B = 1 row
    assert config_label(rows[1]) == "model:x,target hsd [15 bf16]"


def test_the_hf_assistant_is_shared_only_with_its_own_level():
    class Loaded:
        name = "qwen2.5-coder-0.5b"

    assistant = Loaded()
    assert bench_e2e._shared(assistant, "model:qwen2.5-coder-0.5b,target") is assistant
    assert bench_e2e._shared(assistant, "model:other,target") is None
    assert bench_e2e._shared(None, "model:qwen2.5-coder-0.5b,target") is None


def test_rows_cover_every_temperature_and_batch_size_with_the_hf_peers_at_batch_one():
    args = bench_e2e.parse_args(["--configs", "target", "hf-assisted", "hf-prompt-lookup", "model:x,target",
                                 "--buffers", "", "", "", "4", "--drafter-precision", "fp32", "fp32", "fp32", "fp16",
                                 "--temperatures", "0", "1", "--batch-sizes", "1", "4"])
    specs = bench_e2e.row_specs(args, has_assistant=True)
    assert [(s.temperature, s.batch_size, s.config) for s in specs[:6]] == [
        (0, 1, "target"), (0, 1, "hf-assisted"), (0, 1, "hf-prompt-lookup"), (0, 1, "model:x,target"),
        (0, 4, "target"), (0, 4, "model:x,target")]
    assert len(specs) == 12 and specs[3].buffers == "4" and specs[3].drafter_precision == "fp16"
    assert "hf-assisted" not in [s.config for s in bench_e2e.row_specs(args, has_assistant=False)]


def test_repeats_are_interleaved_and_each_row_keeps_its_median():
    specs = [bench_e2e.RowSpec(0.0, 1, config, "hsd", "", "fixed", "none", "fp32") for config in ("a", "b")]
    seconds = {"a": iter([4.0, 1.0, 2.0]), "b": iter([9.0, 3.0, 6.0])}
    calls, snapshots = [], []

    def make_runner(spec):
        def run(seed, prompts, max_new):
            calls.append((spec.config, seed, max_new))
            if max_new == bench_e2e.WARMUP_TOKENS:
                return [[0]], 0.5, None  # the warm-up is never counted
            return [[1] * 12, [2] * 12], next(seconds[spec.config]), [{"rounds": seed}]
        return run

    rows = bench_e2e.interleaved(specs, 3, make_runner, [[5], [6]], 24, on_row=lambda r: snapshots.append(
        [(row["config"], row["repeats"]) for row in r]))
    timed = [(config, seed) for config, seed, new in calls if new == 24]
    assert timed == [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("a", 2), ("b", 2)]  # repeat r of all before r + 1
    assert len(calls) == 12  # a warm-up before every timed run
    assert [row["seconds"] for row in rows] == [2.0, 6.0]  # medians
    assert rows[0]["seconds_per_repeat"] == [4.0, 1.0, 2.0] and rows[1]["tokens_per_second"] == 24 / 6.0
    assert rows[0]["tokens_per_second_per_repeat"] == [6.0, 24.0, 12.0]
    assert rows[1]["levels"] == [{"rounds": 2}]  # the last repeat's statistics
    assert snapshots[0] == [("a", 1)] and snapshots[1] == [("a", 1), ("b", 1)] and snapshots[-1] == [("a", 3), ("b", 3)]


def test_a_resumed_run_times_only_the_missing_repeats():
    specs = [bench_e2e.RowSpec(0.0, 1, config, "hsd", "", "fixed", "none", "fp32") for config in ("a", "b")]
    # The earlier run was cut short after repeat 1 of "a": "a" holds two repeats, "b" one.
    done = {specs[0]: {"seconds_per_repeat": [4.0, 1.0], "tokens_per_second_per_repeat": [6.0, 24.0]},
            specs[1]: {"seconds_per_repeat": [9.0], "tokens_per_second_per_repeat": [24 / 9.0]}}
    seconds = {"a": iter([2.0]), "b": iter([3.0, 6.0])}
    calls = []

    def make_runner(spec):
        def run(seed, prompts, max_new):
            calls.append((spec.config, seed, max_new))
            return [[1] * 12, [2] * 12], next(seconds[spec.config]) if max_new == 24 else 0.5, None
        return run

    rows = bench_e2e.interleaved(specs, 3, make_runner, [[5], [6]], 24, done=done)
    assert [(config, seed) for config, seed, new in calls if new == 24] == [("b", 1), ("a", 2), ("b", 2)]
    assert rows[0]["seconds_per_repeat"] == [4.0, 1.0, 2.0] and rows[0]["seconds"] == 2.0
    assert rows[1]["seconds_per_repeat"] == [9.0, 3.0, 6.0] and rows[1]["repeats"] == 3


def _earlier_result(tmp_path, meta, cpu="AMD EPYC; torch CPU capability AVX2; none", torch_version="2.13.0+cpu"):
    run = {"commit": "abc", "command": "python benchmarks/bench_e2e.py", "load_average_start": "1.00 1.00 1.00",
           "load_average_end": "2.00 2.00 2.00", "cpu_count": 2, "torch_version": torch_version,
           "started": "s", "finished": "f", "cpu": cpu}
    row = {**asdict(bench_e2e.RowSpec(0.0, 1, "target", "hsd", "", "fixed", "none", "fp32")),
           "seconds_per_repeat": [1.0], "tokens_per_second_per_repeat": [2.0]}
    path = tmp_path / "e2e.json"
    path.write_text(json.dumps({"meta": meta, "rows": [row], "run": run, "earlier_runs": [{**run, "commit": "old"}]}))
    return path


def test_resume_continues_only_the_same_measurement_on_the_same_machine(tmp_path):
    meta = {"model": "m", "num_prompts": 8}
    current = SimpleNamespace(cpu="AMD EPYC; torch CPU capability AVX2; none", torch_version="2.13.0+cpu")
    specs = [bench_e2e.RowSpec(0.0, 1, "target", "hsd", "", "fixed", "none", "fp32"),
             bench_e2e.RowSpec(0.0, 1, "exit:2,target", "hsd", "", "fixed", "none", "fp32")]  # a row added
    runs, done = bench_e2e.load_earlier(_earlier_result(tmp_path, meta), meta, current, specs)
    assert [r["commit"] for r in runs] == ["old", "abc"]  # oldest first, each run named in the result
    assert list(done) == [bench_e2e.RowSpec(0.0, 1, "target", "hsd", "", "fixed", "none", "fp32")]
    assert "commit `abc`" in bench_e2e.earlier_runs_markdown(runs)
    with pytest.raises(SystemExit, match="num_prompts"):
        bench_e2e.load_earlier(_earlier_result(tmp_path, meta), {**meta, "num_prompts": 4}, current, specs)
    with pytest.raises(SystemExit, match="cpu"):
        bench_e2e.load_earlier(_earlier_result(tmp_path, meta, cpu="AMD EPYC; torch CPU capability AVX512"),
                               meta, current, specs)
    with pytest.raises(SystemExit, match="torch_version"):
        bench_e2e.load_earlier(_earlier_result(tmp_path, meta, torch_version="2.12.0"), meta, current, specs)
    with pytest.raises(SystemExit, match="no earlier result"):
        bench_e2e.load_earlier(tmp_path / "missing.json", meta, current, specs)
    with pytest.raises(SystemExit, match="does not ask for"):  # a resumed run never drops measured rows
        bench_e2e.load_earlier(_earlier_result(tmp_path, meta), meta, current, specs[1:])
