"""The draft-model serving benchmark's table: server and per-request accept lengths, failures
(no server here)."""

from __future__ import annotations

import math

from benchmarks.bench_serving_standalone import markdown_table


def test_table_shows_per_request_accept_length_and_failures():
    meta = {"sglang_version": "0.5.23", "cpu_count": 2, "target": "t", "draft": "d",
            "num_steps": 4, "num_prompts": 4, "output_len": 8, "dtype": "float32",
            "prompt_sources": ["humaneval (4 prompts)"], "configs": ["none", "hsd"]}
    row = {"prompt_set": "humaneval", "temperature": 0.0, "concurrency": 1, "completed": 4,
           "output_throughput": 2.5, "median_tpot_ms": 400.0}
    records = [{**row, "config": "none", "accept_length": None,
                "accept_length_mean": math.nan, "accept_length_se": math.nan},
               {**row, "config": "hsd", "accept_length": None,
                "accept_length_mean": 4.5, "accept_length_se": 0.25},
               {"config": "hsd", "prompt_set": "mtbench", "error": "client exited 1"}]
    table = markdown_table(records, meta)
    assert "| none | humaneval | 0 | 1 | 4/4 | 2.50 | 400.0 | n/a | n/a |" in table
    assert "| hsd | humaneval | 0 | 1 | 4/4 | 2.50 | 400.0 | n/a | 4.50 ± 0.25 |" in table
    assert "failed: client exited 1" in table
