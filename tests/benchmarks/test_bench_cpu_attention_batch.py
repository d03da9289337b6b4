"""bench_cpu_attention_batch on small shapes: both forms agree, every row is timed."""

from benchmarks import bench_cpu_attention_batch as bench


def test_batched_and_looped_rounds_agree_and_are_timed():
    rows = bench.measure([1, 3], [16], [0, 1, 4], repeats=1, layers=2, pool=256)
    assert [(r["batch"], r["queries"]) for r in rows] == [(b, q) for b in (1, 3) for q in (0, 1, 4)]
    for row in rows:
        assert row["max_abs_diff"] < 1e-4
        assert row["batched_ms"] > 0 and row["looped_ms"] > 0
    assert "| 3 | 16 | decode |" in bench.markdown(rows, 2)
