"""The goodput goals table: per row, the adaptive default against no speculation and against the
fastest fixed configuration of the same row, each against its goal."""

from __future__ import annotations

import json

import pytest

from benchmarks.goodput_goals import ROW_FLOOR, goal_rows, main, markdown_goals


def _row(config, tok_s, prompt_set="sharegpt", temperature=0.0, concurrency=1):
    return {"config": config, "prompt_set": prompt_set, "temperature": temperature,
            "concurrency": concurrency, "output_throughput": tok_s}


def _records():
    return [_row("none", 2.0), _row("hsd-adaptive-k8", 3.2), _row("hsd", 3.0), _row("hsd-tree", 3.5),
            _row("standalone", 2.5),
            _row("none", 10.0, concurrency=16), _row("hsd-adaptive-k8", 9.6, concurrency=16),
            _row("hsd", 8.0, concurrency=16),
            _row("none", 2.0, "humaneval"), _row("hsd-adaptive-k8", 5.2, "humaneval"),
            {"config": "hsd", "prompt_set": "humaneval", "temperature": 0.0, "concurrency": 1,
             "error": "client exited 1"},
            _row("hsd-adaptive-k8", 4.0, concurrency=4)]  # no plain row: left out


def test_each_row_compares_with_plain_and_the_fastest_fixed_of_the_same_row():
    rows = {(g["prompt_set"], g["concurrency"]): g for g in goal_rows(_records())}
    assert set(rows) == {("sharegpt", 1), ("sharegpt", 16), ("humaneval", 1)}
    single = rows[("sharegpt", 1)]
    assert single["vs_plain"] == pytest.approx(1.6) and single["goal"] == 1.5
    assert single["best_fixed"] == "hsd-tree" and single["vs_best_fixed"] == pytest.approx(3.2 / 3.5)
    assert single["met"] is False  # 1.6x plain holds, 0.914 of the tree does not
    loaded = rows[("sharegpt", 16)]
    assert loaded["goal"] == ROW_FLOOR and loaded["vs_plain"] == pytest.approx(0.96)
    assert loaded["best_fixed"] == "hsd" and loaded["met"] is True
    code = rows[("humaneval", 1)]  # its only fixed row failed: nothing to compare with
    assert code["goal"] == 2.5 and code["best_fixed"] is None and code["met"] is None


def test_table_marks_misses_and_the_cli_reads_a_result(tmp_path, capsys):
    table = markdown_goals(goal_rows(_records()))
    assert "| sharegpt | 0 | 1 | 2.00 | 3.20 | 1.60x (>= 1.5x) | hsd-tree (1.75x) | 0.914 | **no** |" in table
    assert "| sharegpt | 0 | 16 | 10.00 | 9.60 | 0.96x (>= 0.95x) | hsd (0.80x) | 1.200 | yes |" in table
    assert "| humaneval | 0 | 1 | 2.00 | 5.20 | 2.60x (>= 2.5x) | n/a | n/a | n/a |" in table
    assert markdown_goals([]) == ""
    path = tmp_path / "result.json"
    path.write_text(json.dumps({"results": _records()}))
    assert main([str(path)]) == 0
    assert "hsd-tree (1.75x)" in capsys.readouterr().out


def test_machine_probes_of_the_compared_rows_are_shown_when_recorded():
    records = [{**r, "machine_probe_ms": probe} for r, probe in
               zip(_records()[:5], (6.0, 6.2, 6.1, 4.1, 6.3))]
    (row,) = goal_rows(records)
    assert row["probe_ms"] == (6.0, 6.2, 4.1)  # plain, default, the fastest fixed (the tree)
    table = markdown_goals([row])
    assert "machine probe ms |" in table and "| **no** | 6.00 / 6.20 / 4.10 |" in table
    assert "machine probe" not in markdown_goals(goal_rows(_records()))  # none recorded: no column
