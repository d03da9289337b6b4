"""bench_cpu_attention on small shapes: both forms agree, every row is timed, the table is written."""

from benchmarks import bench_cpu_attention as bench


def test_both_forms_agree_and_every_row_is_written(tmp_path):
    rows = bench.main(["--contexts", "16", "--queries", "1", "3", "--repeats", "2",
                       "--name", "attn", "--out-dir", str(tmp_path)])
    assert len(rows) == len(bench.SHAPES) * 2
    assert all(r["max_abs_diff"] < 1e-4 and r["fused_ms"] > 0 and r["repeated_ms"] > 0 for r in rows)
    table = (tmp_path / "attn.md").read_text()
    assert table.count("| qwen2.5-coder") == len(rows) and "repeated / fused" in table
