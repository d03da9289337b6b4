"""``benchmarks/bench_linear.py`` on one tiny shape: its files, run record, exactness check and choices.

The inductor path compiles once per row count (seconds each), so it runs only with
``SGLANG_HSD_TEST_INDUCTOR=1``.
"""

import json
import os

import pytest
import torch
from PIL import Image

from benchmarks import bench_linear
from sglang_hsd.runtime.kernel_paths import PATH_MKL, PATH_PACKED, SAME_PRODUCT_ATOL, KernelTable, Measurement
from sglang_hsd.runtime.layers import packed_linear_supported

pytestmark = pytest.mark.skipif(not packed_linear_supported(torch.nn.Linear(2, 2)),
                                reason="torch built without oneDNN linear ops")


def _run(tmp_path, paths):
    argv = ["--shapes", "64x96", "--rows", "1-3", "--threads", "1", "--repeats", "1", "--warmup", "0",
            "--flush-mb", "1", "--paths", *paths, "--name", "lin", "--out-dir", str(tmp_path)]
    return bench_linear.main(argv)


def test_bench_linear_writes_json_markdown_and_plot_with_the_run(tmp_path):
    result = _run(tmp_path, [PATH_MKL, PATH_PACKED])
    data = json.loads((tmp_path / "lin.json").read_text())
    assert data["run"]["command"].endswith("--name lin --out-dir " + str(tmp_path))
    assert len(data["measurements"]) == 3 * 2 and data["fastest"] == result["fastest"]
    base = [r for r in data["rows"] if r["path"] == PATH_MKL and r["rows"] == 1][0]
    assert base["ratio"] == 1.0
    for row in data["rows"]:
        assert row["error"] is None and row["max_abs_diff"] <= SAME_PRODUCT_ATOL and row["ms"] > 0
    assert [f["rows"] for f in data["fastest"]] == [1, 2, 3]
    for best in data["fastest"]:  # the fastest entry of its (shape, rows)
        assert best["ms"] == min(r["ms"] for r in data["rows"] if r["rows"] == best["rows"])
    text = (tmp_path / "lin.md").read_text()
    assert "## 64x96: 64 x 96 (in x out)" in text and "| rows | mkl t1 | onednn-packed t1 |" in text
    assert "## Same numbers as F.linear" in text and "## Run" in text and data["run"]["commit"] in text
    png = Image.open(tmp_path / "lin.png")
    assert json.loads(png.text["Comment"])["command"] == data["run"]["command"]


def test_drafter_copy_paths_are_timed_but_never_in_the_runtime_table(tmp_path):
    result = _run(tmp_path, [PATH_MKL, "drafter-int4", "drafter-fp16"])
    rows = json.loads((tmp_path / "lin.json").read_text())["rows"]
    copies = [r for r in rows if r["path"].startswith(bench_linear.DRAFTER_COPY_PREFIX)]
    assert {r["path"] for r in copies} == {"drafter-int4", "drafter-fp16"} and len(copies) == 2 * 3
    assert all(r["error"] is None and 0 < r["max_abs_diff"] < 0.5 for r in copies)  # the copy's own product
    assert {c["path"] for c in result["runtime_table"]} == {PATH_MKL}


def test_runtime_table_of_a_result_picks_the_fastest_entry():
    shape = bench_linear.LayerShape("w", 64, 96)
    costs = {(PATH_MKL, 1): [1.0, 3.0, 5.0], (PATH_PACKED, 1): [2.0, 2.5, 2.0], (PATH_PACKED, 2): [1.5, 1.0, 2.5],
             (bench_linear.PATH_INDUCTOR, 1): [0.5, 0.5, 0.5]}
    ms = [Measurement(64, 96, i + 1, path, threads, c) for (path, threads), per in costs.items() for i, c in enumerate(per)]
    result = bench_linear.summarize([shape], ms)
    assert [(f["rows"], f["path"], f["threads"]) for f in result["fastest"]] == [
        (1, "inductor", 1), (2, "inductor", 1), (3, "inductor", 1)]
    runtime = [(c["min_rows"], c["max_rows"], c["path"], c["threads"]) for c in result["runtime_table"]]
    assert runtime == [(1, 1, PATH_MKL, 1), (2, 2, PATH_PACKED, 2), (3, None, PATH_PACKED, 1)]
    one_thread = KernelTable.from_measurements(ms, threads=1)
    assert [(c.min_rows, c.path) for c in one_thread.choices] == [(1, PATH_MKL), (2, PATH_PACKED)]
    text = bench_linear.format_markdown(result, "t")
    assert "| 2 | 3.000 (3.00x) | 2.500 (2.50x) | 1.000 (1.00x) | 0.500 (0.50x) | inductor t1 | onednn-packed t2 |" in text


def test_model_total_sums_each_shape_times_its_count():
    shapes = [bench_linear.LayerShape("a", 8, 16, 3), bench_linear.LayerShape("b", 16, 8, 1)]
    ms = [Measurement(8, 16, 1, PATH_MKL, 1, 1.0), Measurement(16, 8, 1, PATH_MKL, 1, 2.0),
          Measurement(8, 16, 4, PATH_MKL, 1, 2.0), Measurement(16, 8, 4, PATH_MKL, 1, 4.0),
          Measurement(8, 16, 4, PATH_PACKED, 2, 1.0), Measurement(16, 8, 4, PATH_PACKED, 2, 0.5),
          # a path missing a shape has no total
          Measurement(8, 16, 4, bench_linear.PATH_MKL_BF16, 1, 0.1)]
    totals = {(t["path"], t["threads"], t["rows"]): (t["ms"], t["ratio"])
              for t in bench_linear.model_totals(shapes, ms)}
    assert totals == {(PATH_MKL, 1, 1): (5.0, 1.0), (PATH_MKL, 1, 4): (10.0, 2.0),
                      (PATH_PACKED, 2, 4): (3.5, 0.7)}
    text = bench_linear.format_markdown(bench_linear.summarize(shapes, ms, whole_model=True), "t")
    assert "## One forward's linear layers" in text and "a x3, b x1" in text
    assert "| 4 | 10.0 (2.00x) | 3.5 (0.70x) |" in text


def test_shapes_rows_and_model_config_parsing(tmp_path, monkeypatch):
    assert bench_linear.parse_rows(["1-3", "8", "2"]) == (1, 2, 3, 8)
    with pytest.raises(ValueError, match="--rows"):
        bench_linear.parse_rows(["3-1"])
    assert [(s.in_features, s.out_features) for s in bench_linear.parse_shapes("1536x8960, 8960X1536")] == [
        (1536, 8960), (8960, 1536)]
    with pytest.raises(ValueError, match="--shapes"):
        bench_linear.parse_shapes("1536x")
    qwen = {"hidden_size": 1536, "num_attention_heads": 12, "num_key_value_heads": 2,
            "intermediate_size": 8960, "vocab_size": 151936, "num_hidden_layers": 28}
    assert [(s.label, s.in_features, s.out_features, s.count) for s in bench_linear.model_shapes(qwen)] == [
        ("q_proj, o_proj", 1536, 1536, 56), ("k_proj, v_proj", 1536, 256, 56),
        ("gate_proj, up_proj", 1536, 8960, 56), ("down_proj", 8960, 1536, 28), ("lm_head", 1536, 151936, 1)]
    assert [(s.label, s.in_features, s.out_features, s.count)
            for s in bench_linear.model_shapes(qwen, "sglang")] == [
        ("qkv_proj", 1536, 2048, 28), ("o_proj", 1536, 1536, 28), ("gate_up_proj", 1536, 17920, 28),
        ("down_proj", 8960, 1536, 28), ("lm_head", 1536, 151936, 1)]
    with pytest.raises(ValueError, match="layout"):
        bench_linear.model_shapes(qwen, "vllm")
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(qwen))
    assert bench_linear.load_model_shapes(str(folder)) == bench_linear.model_shapes(qwen)
    monkeypatch.setenv("SGLANG_HSD_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(ValueError, match="sglang-hsd fetch qwen2.5-coder-1.5b"):
        bench_linear.load_model_shapes("qwen2.5-coder-1.5b")


@pytest.mark.skipif(os.environ.get("SGLANG_HSD_TEST_INDUCTOR") != "1",
                    reason="compiles once per row count (~10 s each); set SGLANG_HSD_TEST_INDUCTOR=1")
def test_bench_linear_inductor_path_computes_f_linear(tmp_path):
    result = _run(tmp_path, [PATH_MKL, bench_linear.PATH_INDUCTOR])
    inductor = [r for r in result["rows"] if r["path"] == bench_linear.PATH_INDUCTOR]
    assert len(inductor) == 3
    for row in inductor:
        assert row["error"] is None and row["max_abs_diff"] <= SAME_PRODUCT_ATOL and row["setup_s"] > 0
