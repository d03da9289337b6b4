"""``sglang-hsd bench``'s results from canned rows: the ratio, the table, ``bench.json``'s writing,
``bench.png`` and the run record (commit, command, machine, load, dates)."""

from __future__ import annotations

import json
import math
import re

import pytest

from sglang_hsd.bench import record
from sglang_hsd.bench.report import COLUMNS, format_table, plot_ratios, throughput_ratio, write_json


def _row(prompt_set="humaneval", concurrency=1, plain=None, hsd=None, **more):
    plain = {"completed": 4, "output_throughput": 3.0, "median_tpot_ms": 330.0} if plain is None else plain
    hsd = {"completed": 4, "output_throughput": 6.6, "median_tpot_ms": 150.0, "accept_length_mean": 3.25,
           "mean_draft_budget": 4.5} if hsd is None else hsd
    return {"prompt_set": prompt_set, "concurrency": concurrency, "temperature": 0.0, "num_prompts": 4,
            "max_new_tokens": 48, "plain": plain, "hsd": hsd, "ratio": throughput_ratio(plain, hsd), **more}


def test_ratio_is_hsd_over_plain_and_none_where_either_failed():
    assert throughput_ratio({"output_throughput": 3.0}, {"output_throughput": 6.6}) == pytest.approx(2.2)
    for plain, hsd in (({"error": "x"}, {"output_throughput": 1.0}), ({"output_throughput": 1.0}, {"error": "x"}),
                       ({"output_throughput": 0.0}, {"output_throughput": 1.0}), ({}, {"output_throughput": 1.0}),
                       ({"output_throughput": math.nan}, {"output_throughput": 1.0}),
                       ({"output_throughput": 1.0}, {"output_throughput": None})):
        assert throughput_ratio(plain, hsd) is None


def test_table_has_a_row_per_row_and_notes_failures_and_short_rows():
    rows = [_row(), _row("mtbench", 4, hsd={"error": "client exited 1; see x.log"}),
            _row("mtbench", 8, plain={"completed": 3, "output_throughput": 9.0, "median_tpot_ms": 90.0})]
    text = format_table(rows)
    lines = text.splitlines()
    assert re.split(r"\s{2,}", lines[0]) == list(COLUMNS)
    first = lines[2].split()
    assert first == ["humaneval", "1", "0", "3.00", "6.60", "2.20x", "3.25", "330", "150", "4.50"]
    assert lines[3].split()[:6] == ["mtbench", "4", "0", "3.00", "failed", "n/a"]
    assert "mtbench c=4 T=0, hsd: client exited 1; see x.log" in text
    assert "mtbench c=8 T=0, plain: 3 of 4 requests completed" in text
    assert len({len(line) for line in lines[:5]}) == 1  # aligned columns


def test_json_is_written_whole_with_nan_as_null(tmp_path):
    path = write_json(tmp_path / "sub" / "bench.json", {"rows": [{"a": math.nan, "b": [1.5, math.inf]}]})
    assert json.loads(path.read_text()) == {"rows": [{"a": None, "b": [1.5, None]}]}
    assert [p.name for p in path.parent.iterdir()] == ["bench.json"]  # no partial file left


def test_png_has_a_bar_per_row_and_the_run_in_its_text(tmp_path):
    from PIL import Image

    run = record.start_run(__file__, command="sglang-hsd bench --num-prompts 4").finish().as_dict()
    path = plot_ratios([_row(), _row("mtbench", 4, hsd={"error": "x"})], tmp_path / "bench.png", run)
    image = Image.open(path)
    assert image.format == "PNG" and image.size[0] > 400
    assert json.loads(image.text["Comment"]) == run and image.text["Source"] == run["command"]


def test_run_record_names_commit_command_machine_load_and_dates():
    run = record.start_run(__file__, command=record.recorded_command(["sglang-hsd", "bench", "--out", "a b"]))
    fields = run.finish().as_dict()
    assert re.fullmatch(r"[0-9a-f]{12}( \+ uncommitted changes)?|unknown", fields["commit"])
    assert fields["command"].endswith("sglang-hsd bench --out 'a b'")
    assert re.fullmatch(r"\d+\.\d\d \d+\.\d\d \d+\.\d\d", fields["load_average_start"])
    assert fields["load_average_end"] and fields["cpu_count"] >= 1 and "torch CPU capability" in fields["cpu"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", fields["started"]) and fields["finished"]


def test_vector_extensions_from_cpuinfo():
    cpuinfo = "processor\t: 0\nmodel name\t: X\nflags\t\t: fpu sse4_2 avx avx2 fma avx512f avx512_bf16 amx_tile\n"
    assert record.vector_extensions(cpuinfo) == ["sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_bf16", "amx_tile"]
    assert record.vector_extensions("Features\t: fp asimd sve\n") == ["asimd", "sve"]
    assert record.vector_extensions("") == []
    assert record.git_commit(record.PACKAGE_ROOT / "no-such-folder") == "unknown"
