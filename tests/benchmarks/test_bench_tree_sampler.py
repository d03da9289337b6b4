"""bench_tree_sampler.py at a tiny size: every lossless sampler gets its row and the files are written."""

import json

import pytest
import torch

from benchmarks import bench_tree_sampler
from sglang_hsd.tree_draft import CHILD_SAMPLERS


def test_tiny_run_writes_every_lossless_sampler(tmp_path, capsys):
    stem = tmp_path / "cost"
    threads = torch.get_num_threads()
    try:
        bench_tree_sampler.main(["--batch", "2", "--shape", "3:2:5", "--vocab", "64", "--repeats", "1",
                                 "--threads", "1", "--name", str(stem)])
    finally:
        torch.set_num_threads(threads)  # the script sets the process's thread count
    rows = json.loads(stem.with_suffix(".json").read_text())["results"]
    assert [r["sampler"] for r in rows] == [n for n, s in CHILD_SAMPLERS.items() if s.lossless]
    assert all(r[key] > 0 for r in rows for key in ("noise_ms", "draw_ms", "round_ms"))
    assert "| `inverse_cdf` |" in capsys.readouterr().out


def test_a_chain_shape_is_refused():
    with pytest.raises(SystemExit):
        bench_tree_sampler.main(["--shape", "none"])
