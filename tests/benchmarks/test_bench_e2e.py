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
