"""The draft-model serving benchmark (no server here): its table (ratios to plain decoding, server
and per-request accept lengths, the adaptive budget, failures), server commands, options, plot,
and a stopped run resumed by the same command."""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path

import pytest

import benchmarks.bench_serving_standalone as bench
from benchmarks.bench_serving_standalone import (
    CONFIGS, ServerOptions, add_ratios, markdown_table, parse_args, parse_extra_server_args,
    parse_skip, plot, server_command, skipped)
from benchmarks.common import start_run

META = {"sglang_version": "0.5.23", "cpu_count": 2, "target": "t", "draft": "d", "num_steps": 4,
        "num_prompts": 4, "output_len": 8, "dtype": "float32",
        "prompt_sources": ["humaneval (4 prompts)"],
        "configs": ["none-bf16", "none", "hsd", "hsd-adaptive"], "skipped": "hsd@c4"}
ROW = {"prompt_set": "humaneval", "temperature": 0.0, "concurrency": 1, "completed": 4,
       "output_throughput": 2.5, "median_tpot_ms": 400.0, "accept_length": None}


def _records():
    no_accept = {"accept_length_mean": math.nan, "accept_length_se": math.nan}
    return [{**ROW, **no_accept, "config": "none-bf16", "output_throughput": 2.0},
            {**ROW, **no_accept, "config": "none"},
            {**ROW, "config": "hsd", "accept_length_mean": 4.5, "accept_length_se": 0.25,
             "output_throughput": 5.0, "mean_chosen_budget": None},
            {**ROW, "config": "hsd-adaptive", "accept_length_mean": 4.0, "accept_length_se": 0.5,
             "output_throughput": 3.75, "row_mean_length": 2.5, "mean_chosen_budget": 3.25,
             "draft_copy": "int4 (layers 1-16, lm_head 1-8)", "machine_probe_ms": 6.25},
            {"config": "hsd", "prompt_set": "mtbench", "error": "client exited 1"}]


def test_table_shows_ratios_accept_lengths_budget_and_failures():
    table = markdown_table(_records(), META)
    assert ("| none | humaneval | 0 | 1 | 4/4 | 2.50 | 1.00x | 1.25x | 400.0 | n/a | n/a | n/a | n/a |"
            in table)
    assert ("| hsd | humaneval | 0 | 1 | 4/4 | 5.00 | 2.00x | 2.50x | 400.0 | n/a | 4.50 ± 0.25 "
            "| n/a | n/a |" in table)
    assert "| hsd-adaptive | humaneval | 0 | 1 | 4/4 | 3.75 | 1.50x | 1.88x |" in table
    adaptive = next(line for line in table.splitlines() if line.startswith("| hsd-adaptive"))
    # the row's own, the server's budget, the copy the server drafted on
    assert adaptive.endswith("| 4.00 ± 0.50 | 2.50 | 3.25 | int4 (layers 1-16, lm_head 1-8) | 6.25 |")
    assert "- machine probe ms:" in table  # the column says what it timed
    assert "failed: client exited 1" in table
    assert "rows not run (--skip): hsd@c4" in table
    header = next(line for line in table.splitlines() if line.startswith("| config"))
    assert all(line.count("|") == header.count("|") for line in table.splitlines()
               if line.startswith("| hsd") or line.startswith("| none"))


def test_table_lists_the_lookup_levels_work_per_row():
    assert "Lookup level" not in markdown_table(_records(), META)  # no row ran one
    lookup = {"forwards": 4, "chain_forwards": 7, "rows": 15, "chain_rows": 7, "proposed": 10, "accepted": 6}
    records = _records()
    records[3] = {**records[3], "draft_lookup": lookup}
    table = markdown_table(records, META)
    assert "| hsd-adaptive | humaneval | 0 | 1 | 6 / 10 | 4 / 7 | 15 / 7 |" in table


def test_ratios_are_to_the_none_row_of_the_same_set_temperature_and_concurrency():
    rows = _records() + [{**ROW, "config": "hsd", "concurrency": 4, "output_throughput": 9.0}]
    ratios = {(r["config"], r.get("concurrency")): r["ratio_to_none"] for r in add_ratios(rows)}
    assert ratios[("none", 1)] == 1.0 and ratios[("hsd", 1)] == 2.0
    assert ratios[("hsd", 4)] is None  # no none row at concurrency 4
    assert ratios[("hsd", None)] is None  # the failed row
    assert add_ratios(rows)[2]["ratio_to_none_bf16"] == 2.5
    assert "ratio_to_none" not in rows[0]  # the rows themselves are left alone


def test_server_commands_one_table_entry_per_configuration():
    options = ServerOptions("float32", "onednn-packed", 4, 2, 8, max_running_requests=16)

    def flags(name, extra=()):
        cmd = server_command(CONFIGS[name], Path("/T"), Path("/D"), options, extra)
        return cmd[cmd.index("--random-seed") + 2:]

    assert flags("hsd")[-4:] == ["--hsd-verify-method", "hsd", "--hsd-adaptive", "off"]
    assert flags("hsd-adaptive")[-4:] == ["--hsd-verify-method", "hsd", "--hsd-adaptive", "on"]
    for name, steps in (("hsd-adaptive", "4"), ("hsd-adaptive-k8", "8")):  # its own num_steps
        cmd = flags(name)
        assert cmd[cmd.index("--speculative-num-steps") + 1] == steps
    assert flags("none") == ["--max-running-requests", "16", "--dtype", "float32",
                             "--hsd-cpu-linear", "onednn-packed", "--mem-fraction-static", "0.9"]
    assert flags("none-bf16") == ["--max-running-requests", "16", "--dtype", "bfloat16"]
    assert flags("hsd", ["--x", "1"])[-2:] == ["--x", "1"]
    tree = flags("hsd-tree")
    assert tree[tree.index("--speculative-eagle-topk") + 1] == "2"
    assert tree[tree.index("--speculative-num-draft-tokens") + 1] == "8"
    standalone = flags("standalone")
    assert standalone[standalone.index("--speculative-algorithm") + 1] == "STANDALONE"


def test_options_concurrency_prompt_sets_extra_server_args():
    args = parse_args(["--concurrency", "1,4,16", "--extra-server-args", "hsd=--a 1 --b",
                       "--extra-server-args", "*=--c 2", "--configs", "none,hsd,hsd-adaptive"])
    assert args.concurrency == [1, 4, 16]
    assert args.prompt_sets == ["sharegpt", "humaneval"]
    assert args.extra_server_args["hsd"] == ("--c", "2", "--a", "1", "--b")
    assert args.extra_server_args["none"] == ("--c", "2")
    assert parse_extra_server_args([]) == {}
    for bad in (["bogus=--x"], ["hsd"]):
        with pytest.raises(SystemExit, match="--extra-server-args"):
            parse_extra_server_args(bad)
    with pytest.raises(SystemExit, match="--configs"):
        parse_args(["--configs", "none,bogus"])


def test_skip_rules_name_a_config_and_a_temperature_or_concurrency():
    rules = parse_skip("standalone@t1, none-bf16@c4")
    assert skipped(rules, "standalone", 1.0, 1) and skipped(rules, "none-bf16", 0.0, 4)
    assert not skipped(rules, "standalone", 0.0, 4) and not skipped(rules, "hsd", 1.0, 4)
    for bad in ("bogus@t1", "hsd@x1", "hsd@tq"):
        with pytest.raises(SystemExit, match="--skip"):
            parse_skip(bad)


def test_plot_of_ratio_against_concurrency(tmp_path):
    rows = [{**ROW, "config": config, "prompt_set": prompt_set, "temperature": t,
             "concurrency": c, "output_throughput": tok_s * c}
            for prompt_set in ("sharegpt", "humaneval") for t in (0.0, 1.0) for c in (1, 4, 16)
            for config, tok_s in (("none", 2.0), ("hsd", 3.0), ("tokenwise", 2.5))]
    meta = {**META, "configs": ["none", "hsd", "tokenwise"]}
    run = start_run(bench.__file__, [])
    path = tmp_path / "x.png"
    plot(rows, meta, path, run)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    nothing = tmp_path / "y.png"
    plot([r for r in rows if r["config"] != "none"], meta, nothing, run)  # no ratio: no plot
    assert not nothing.exists()


@contextlib.contextmanager
def _fake_server(cmd, env, log_path, timeout=600.0):
    yield "http://127.0.0.1:1"


def _fake_measure(calls: list, stop_at: str | None = None):
    def measure(server, row, target, datasets, args, workdir, config):
        if config == stop_at:
            raise KeyboardInterrupt  # the run is stopped here
        calls.append((config, row["concurrency"]))
        return {"completed": 1, "output_throughput": 2.0 * row["concurrency"],
                "median_tpot_ms": 10.0, "accept_length": None, "accept_length_mean": 3.0,
                "accept_length_se": 0.1, "mean_chosen_budget": None}
    return measure


def test_stopped_run_keeps_its_rows_and_the_same_command_resumes_it(tmp_path, monkeypatch):
    """Results are rewritten after every row: a run stopped in its third configuration leaves the
    first two configurations' rows, marked incomplete; the same command then runs only the rest."""
    import benchmarks.serving_harness as harness

    monkeypatch.setattr(harness, "running_server", _fake_server)
    monkeypatch.setattr(bench, "resolve_models", lambda *a: (tmp_path, tmp_path))
    monkeypatch.setattr(bench, "write_prompt_file", lambda path, *a: "prompts")
    calls: list = []
    monkeypatch.setattr(bench, "measure_row", _fake_measure(calls, stop_at="tokenwise"))
    argv = ["--configs", "none,hsd,tokenwise", "--out-dir", str(tmp_path), "--prompt-sets",
            "humaneval", "--temperatures", "0", "--workdir", str(tmp_path / "work")]
    with pytest.raises(KeyboardInterrupt):
        bench.main(argv)
    stem = tmp_path / f"serving_standalone_{tmp_path.name}"
    saved = json.loads(stem.with_suffix(".json").read_text())
    assert saved["meta"]["complete"] is False
    assert [(r["config"], r["concurrency"]) for r in saved["results"]] == [
        ("none", 1), ("none", 4), ("hsd", 1), ("hsd", 4)]
    assert [r["ratio_to_none"] for r in saved["results"]] == [1.0, 1.0, 1.0, 1.0]
    assert "**Partial run**" in stem.with_suffix(".md").read_text()
    assert stem.with_suffix(".png").exists()

    calls.clear()
    monkeypatch.setattr(bench, "measure_row", _fake_measure(calls))
    assert bench.main(argv) == 0
    assert calls == [("tokenwise", 1), ("tokenwise", 4)]
    saved = json.loads(stem.with_suffix(".json").read_text())
    assert saved["meta"]["complete"] is True and saved["meta"]["resumed"]["rows"] == 4
    assert len(saved["results"]) == 6
    assert "resumed run: 4 rows" in stem.with_suffix(".md").read_text()

    calls.clear()  # a complete run is not resumed: the same command measures again
    assert bench.main(argv) == 0
    assert len(calls) == 6
    # --name picks the stem, so a second run does not overwrite the first.
    assert bench.main(argv + ["--name", "second_run"]) == 0
    assert (tmp_path / "second_run.json").exists() and (tmp_path / "second_run.md").exists()
