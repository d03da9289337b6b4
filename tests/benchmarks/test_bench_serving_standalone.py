"""The draft-model serving benchmark's table: server and per-request accept lengths, failures
(no server here)."""

from __future__ import annotations

import math

import pytest

from benchmarks.bench_serving_standalone import markdown_table


def test_table_shows_per_request_accept_length_and_failures():
    meta = {"sglang_version": "0.5.23", "cpu_count": 2, "target": "t", "draft": "d",
            "num_steps": 4, "num_prompts": 4, "output_len": 8, "dtype": "float32",
            "prompt_sources": ["humaneval (4 prompts)"], "configs": ["none-bf16", "none", "hsd"],
            "skipped": "hsd@c4"}
    row = {"prompt_set": "humaneval", "temperature": 0.0, "concurrency": 1, "completed": 4,
           "output_throughput": 2.5, "median_tpot_ms": 400.0}
    records = [{**row, "config": "none-bf16", "output_throughput": 2.0, "accept_length": None,
                "accept_length_mean": math.nan, "accept_length_se": math.nan},
               {**row, "config": "none", "accept_length": None,
                "accept_length_mean": math.nan, "accept_length_se": math.nan},
               {**row, "config": "hsd", "accept_length": None,
                "accept_length_mean": 4.5, "accept_length_se": 0.25},
               {"config": "hsd", "prompt_set": "mtbench", "error": "client exited 1"}]
    table = markdown_table(records, meta)
    assert "| none | humaneval | 0 | 1 | 4/4 | 2.50 | 1.00x | 1.25x | 400.0 | n/a | n/a |" in table
    assert ("| hsd | humaneval | 0 | 1 | 4/4 | 2.50 | 1.00x | 1.25x | 400.0 | n/a | 4.50 ± 0.25 |"
            in table)
    assert "failed: client exited 1" in table
    assert "rows not run (--skip): hsd@c4" in table


def test_skip_rules_name_a_config_and_a_temperature_or_concurrency():
    from benchmarks.bench_serving_standalone import parse_skip, skipped

    rules = parse_skip("standalone@t1, none-bf16@c4")
    assert skipped(rules, "standalone", 1.0, 1) and skipped(rules, "none-bf16", 0.0, 4)
    assert not skipped(rules, "standalone", 0.0, 4) and not skipped(rules, "hsd", 1.0, 4)
    for bad in ("bogus@t1", "hsd@x1", "hsd@tq"):
        with pytest.raises(SystemExit, match="--skip"):
            parse_skip(bad)


def test_stopped_run_keeps_the_rows_it_measured(tmp_path, monkeypatch):
    """Results are rewritten after every row: a run stopped in its second configuration leaves
    the first configuration's rows, marked incomplete."""
    import json

    import benchmarks.bench_serving_standalone as bench

    row = {"prompt_set": "humaneval", "temperature": 0.0, "concurrency": 1, "completed": 1,
           "output_throughput": 2.0, "median_tpot_ms": 10.0, "accept_length": None,
           "accept_length_mean": 3.0, "accept_length_se": 0.1}

    def fake_run_config(config, target, draft, datasets, args, workdir, on_row):
        if config == "tokenwise":
            raise KeyboardInterrupt  # the run is stopped here
        records = []
        for concurrency in (1, 4):
            records.append({**row, "config": config, "concurrency": concurrency})
            on_row(records[-1])
        return records

    monkeypatch.setattr(bench, "run_config", fake_run_config)
    monkeypatch.setattr(bench, "resolve_models", lambda args, workdir: (tmp_path, tmp_path))
    monkeypatch.setattr(bench, "write_prompt_file", lambda path, *a: "prompts")
    argv = ["--configs", "none,hsd,tokenwise", "--out-dir", str(tmp_path), "--prompt-sets",
            "humaneval", "--workdir", str(tmp_path / "work")]
    try:
        bench.main(argv)
    except KeyboardInterrupt:
        pass
    saved = json.loads((tmp_path / f"serving_standalone_{tmp_path.name}.json").read_text())
    assert saved["meta"]["complete"] is False
    assert [(r["config"], r["concurrency"]) for r in saved["results"]] == [
        ("none", 1), ("none", 4), ("hsd", 1), ("hsd", 4)]
    assert "**Partial run**" in (tmp_path / f"serving_standalone_{tmp_path.name}.md").read_text()
    # --name picks the stem, so a second run does not overwrite the first.
    try:
        bench.main(argv + ["--name", "second_run"])
    except KeyboardInterrupt:
        pass
    assert (tmp_path / "second_run.json").exists() and (tmp_path / "second_run.md").exists()
