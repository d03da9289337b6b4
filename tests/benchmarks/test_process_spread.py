"""The fresh-process spread benchmark: each setting's processes really run apart, and the summary
is their least, median and largest."""

from __future__ import annotations

import json

import pytest

from benchmarks import process_spread


def test_summary_per_setting():
    rows = [{"setting": "default", "median_ms": v} for v in (10.0, 14.0, 12.0)]
    rows += [{"setting": "thp", "median_ms": 11.0}]
    stats = process_spread.summary(rows)
    assert stats["default"] == {"processes": 3, "least_ms": 10.0, "median_ms": 12.0, "largest_ms": 14.0,
                                "largest_over_least": 1.4}
    assert stats["thp"]["processes"] == 1


def test_a_tiny_run_writes_one_row_per_process_and_setting(tmp_path, monkeypatch):
    monkeypatch.setattr(process_spread, "RESULTS_DIR", tmp_path)
    assert process_spread.main(["--processes", "1", "--shape", "64", "128", "--layers", "2", "--passes", "2",
                                "--threads", "1", "--name", "spread"]) == 0
    payload = json.loads((tmp_path / "spread.json").read_text())
    assert [r["setting"] for r in payload["rows"]] == ["default", "thp"]
    assert all(len(r["passes_ms"]) == 2 and r["median_ms"] > 0 for r in payload["rows"])
    assert "| default | 1 |" in (tmp_path / "spread.md").read_text()


def test_bad_counts_are_refused_naming_the_flag(capsys):
    with pytest.raises(SystemExit):
        process_spread.main(["--processes", "0"])
    assert "--processes must be at least 1" in capsys.readouterr().err
