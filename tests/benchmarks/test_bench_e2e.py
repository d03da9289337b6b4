"""bench_e2e's options (no model is loaded and nothing is timed)."""

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
    with pytest.raises(ValueError, match="--drafter-precision must be one of fp32, bf16, fp16, got 'int8'"):
        bench_e2e.parse_args(["--configs", "model:x,target", "--drafter-precision", "int8"])
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
