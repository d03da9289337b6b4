"""The serving benchmarks' shared harness (no server here): result rows and resuming, rows run
against a (fake) server, the client's arguments, ``/server_info`` parsing, prompt files, cells."""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path

import pytest

import benchmarks.serving_harness as harness
from benchmarks.common import start_run
from benchmarks.serving_harness import (
    ClientError, ClientSpec, ResultBook, ServerInfo, ServerSpec, client_arguments, fmt,
    lookup_delta, mean_se_cell, measure_rows, prompt_file_texts, rounds_mean_length, row_key, shown_command,
    throughput_ratios, write_prompt_file)


def _render(rows, meta):
    return f"{len(rows)} rows, complete {meta['complete']}"


def _row(config, concurrency, **more):
    return {"config": config, "prompt_set": "s", "temperature": 0.0, "concurrency": concurrency,
            "output_throughput": 2.0 * concurrency, **more}


def _book(stem, argv=("--a",), **kwargs):
    return ResultBook(stem, start_run(harness.__file__, list(argv)), {"m": 1}, _render, **kwargs)


def test_row_key_and_throughput_ratios():
    assert row_key(_row("hsd", 4)) == ("hsd", "s", 0.0, 4)
    rows = [_row("none", 1), _row("hsd", 1, output_throughput=3.0), _row("hsd", 4),
            _row("none", 4, error="boom"), {"config": "hsd", "error": "server"}]
    assert throughput_ratios(rows, "none") == [1.0, 1.5, None, None, None]


def test_book_rewrites_after_every_row_and_resumes_the_same_unfinished_command(tmp_path):
    stem = tmp_path / "r"
    book = _book(stem)
    book.add(_row("none", 1))
    book.add(_row("hsd", 1, error="client exited 1"))
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["meta"] == {"m": 1, "complete": False} and len(saved["results"]) == 2
    assert "**Partial run**" in (tmp_path / "r.md").read_text()
    assert book.failed()

    resumed = _book(stem)  # same command, unfinished: its successful rows are kept
    assert resumed.rows == [_row("none", 1)]
    assert resumed.measured(_row("none", 1)) and not resumed.measured(_row("hsd", 1))
    assert resumed.meta["resumed"]["rows"] == 1
    assert _book(stem, argv=("--b",)).rows == []  # another command starts afresh
    assert _book(stem, resume=False).rows == []
    resumed.add(_row("hsd", 1))
    assert resumed.finish() == "2 rows, complete True"
    assert not resumed.failed()
    assert _book(stem).rows == []  # a finished run is not resumed


def test_book_annotates_and_plots_every_write(tmp_path):
    plotted = []
    book = _book(tmp_path / "r", key=lambda row: (row["config"],),
                 annotate=lambda rows: [{**r, "extra": 1} for r in rows],
                 plot=lambda rows, meta, path, run: plotted.append((len(rows), path.name)))
    book.add({"config": "a"})
    book.finish()
    assert json.loads((tmp_path / "r.json").read_text())["results"] == [{"config": "a", "extra": 1}]
    assert book.rows == [{"config": "a"}] and plotted == [(1, "r.png"), (1, "r.png")]
    assert book.measured({"config": "a", "anything": "else"})


@contextlib.contextmanager
def _fake_server(cmd, env, log_path, timeout=600.0):
    yield "http://127.0.0.1:1"


def test_measure_rows_runs_only_missing_rows_and_books_failures(tmp_path, monkeypatch):
    started = []

    @contextlib.contextmanager
    def server(cmd, env, log_path, timeout=600.0):
        started.append(cmd)
        with _fake_server(cmd, env, log_path, timeout) as url:
            yield url

    monkeypatch.setattr(harness, "running_server", server)
    probes = iter([7.5, 7.0, 9.0])
    monkeypatch.setattr(harness, "machine_probe_ms", lambda: next(probes))
    book = _book(tmp_path / "r")
    book.add(_row("hsd", 1))
    spec = ServerSpec("hsd", ["python", "serve"], {"config": "hsd", "prompt_set": "s",
                                                   "temperature": 0.0})

    def measure(server, row):
        assert server.url == "http://127.0.0.1:1"
        if row["concurrency"] == 16:
            raise ClientError("client exited 1; see log")
        return {"output_throughput": 5.0}

    rows = [{"concurrency": c} for c in (1, 4, 16)]
    measure_rows(spec, rows, measure, book, tmp_path)
    assert [(r["concurrency"], r.get("error")) for r in book.rows] == [
        (1, None), (4, None), (16, "client exited 1; see log")]
    assert book.rows[1] == {"config": "hsd", "prompt_set": "s", "temperature": 0.0,
                            "concurrency": 4, "machine_probe_ms": 7.5, "output_throughput": 5.0}
    assert book.rows[2]["machine_probe_ms"] == 7.0  # each measured row timed the machine before it
    measure_rows(spec, rows[:2], measure, book, tmp_path)
    assert len(started) == 1  # every row measured: no server started

    def broken(cmd, env, log_path, timeout=600.0):
        raise TimeoutError("not healthy")

    monkeypatch.setattr(harness, "running_server", broken)
    measure_rows(spec, rows, measure, book, tmp_path)
    assert book.rows[-1]["error"] == "TimeoutError: not healthy"
    assert "concurrency" not in book.rows[-1]  # a failed server: one record of its fields


def test_client_arguments_for_sharegpt_and_random_datasets():
    spec = ClientSpec(Path("/m"), Path("/d.json"), 4, 8, 1.0, 16, context_len=4096,
                      extra_request_body={"ignore_eos": True})
    args = client_arguments(spec, "http://h:1", Path("/o.jsonl"))

    def value(args, flag):
        return args[args.index(flag) + 1]

    assert value(args, "--dataset-name") == "sharegpt"
    assert value(args, "--sharegpt-context-len") == "4096"
    assert value(args, "--max-concurrency") == "16"
    assert json.loads(value(args, "--extra-request-body")) == {"ignore_eos": True}
    assert "--random-input-len" not in args
    random = ClientSpec(Path("/m"), Path("/d.json"), 32, 8, 1.0, 32, dataset_name="random",
                        input_len=24, random_range_ratio=0.5, seed=1)
    args = client_arguments(random, "http://h:1", Path("/o.jsonl"))
    assert value(args, "--random-input-len") == "24" and value(args, "--random-range-ratio") == "0.5"
    assert value(args, "--seed") == "1" and "--extra-request-body" not in args


def test_server_info_reads_accept_length_hsd_and_a_budget_only_when_reported():
    info = ServerInfo.parse({"internal_states": [{"avg_spec_accept_length": 2.5, "hsd": {
        "kv_available_size": 100, "adaptive": {"mean_steps": 3}}}]})
    assert info.accept_length == 2.5 and info.hsd["kv_available_size"] == 100
    assert info.mean_chosen_budget == 3.0
    for state in ({}, {"hsd": None}, {"hsd": {"adaptive": None}}, {"hsd": {"adaptive": {}}},
                  {"hsd": {"adaptive": {"mean_steps": "x"}}}):
        assert ServerInfo.parse({"internal_states": [state]}).mean_chosen_budget is None
    assert ServerInfo.parse({}) == ServerInfo(None, {})


def test_server_info_names_the_draft_copy_and_the_rows_it_serves():
    def copy(copies):
        return ServerInfo(None, {"draft_copies": copies}).draft_copy

    assert copy({"precision": "int4", "copy_rows": {"layers": 16, "lm_head": 8}}) == "int4 (layers 1-16, lm_head 1-8)"
    assert copy({"precision": "w8a8", "copy_rows": {"layers": "all", "lm_head": "all"}}) == "w8a8 (layers all, lm_head all)"
    assert copy({"precision": "fp32", "copy_rows": {}}) == "fp32"
    assert ServerInfo(None, {}).draft_copy is None  # no draft model of its own


def test_row_mean_length_is_the_change_of_the_servers_choice_counts():
    def info(choices):
        return ServerInfo(None, {"adaptive": {"choices_by_batch_bucket": choices}})

    before = info({"1": {"0": 2, "4": 10}})
    after = info({"1": {"0": 2, "4": 13}, "16": {"0": 6, "1": 1}})
    # the row ran 3 rounds of length 4 at batch 1 and 7 rounds (6 of 0, 1 of 1) at batch 16
    assert rounds_mean_length(before, after) == (3 * 4 + 1) / 10
    assert rounds_mean_length(after, after) is None  # no decode round in between
    assert rounds_mean_length(ServerInfo(None, {}), ServerInfo(None, {})) is None  # not adaptive


def test_lookup_delta_is_the_rows_change_of_the_lookup_counters():
    def info(**counters):
        return ServerInfo(None, {"draft_lookup": {"enabled": True, "ngram": 3, **counters}})

    keys = ("forwards", "chain_forwards", "rows", "chain_rows", "proposed", "accepted")
    before = info(**dict(zip(keys, (10, 20, 30, 20, 15, 5))))
    after = info(**dict(zip(keys, (14, 27, 45, 27, 25, 11))))
    assert lookup_delta(before, after) == dict(zip(keys, (4, 7, 15, 7, 10, 6)))
    off = ServerInfo(None, {"draft_lookup": {"enabled": False}})
    assert lookup_delta(off, off) is None and lookup_delta(ServerInfo(None, {}), ServerInfo(None, {})) is None


def test_prompt_files_in_sharegpt_format(tmp_path, monkeypatch):
    import sglang_hsd.runtime.loading as loading

    path = tmp_path / "p.json"
    assert write_prompt_file(path, "sharegpt", 3, tiny=True) == "tiny corpus (3 prompts)"
    record = json.loads(path.read_text())[0]
    assert [turn["from"] for turn in record["conversations"]] == ["human", "gpt"]
    monkeypatch.setattr(loading, "prompt_set_texts", lambda name, count: ["a", " ", "b", "c"][:count])
    assert write_prompt_file(path, "humaneval", 3) == "humaneval (2 prompts)"  # blank one dropped
    assert prompt_file_texts(path) == ["a", "b"]
    assert write_prompt_file(path, "humaneval", 2, offset=2) == "humaneval from prompt 2 (2 prompts)"
    assert prompt_file_texts(path) == ["b", "c"]
    with pytest.raises(ValueError, match="offset must be >= 0"):
        write_prompt_file(path, "humaneval", 2, offset=-1)

    def offline(name, count):
        raise OSError("offline")

    monkeypatch.setattr(loading, "prompt_set_texts", offline)
    with pytest.raises(OSError):
        write_prompt_file(path, "sharegpt", 3)
    assert write_prompt_file(path, "sharegpt", 3, fallback=True).startswith(
        "tiny corpus (sharegpt unavailable: OSError)")


def test_cells_and_shown_command(tmp_path):
    assert fmt(None) == fmt(math.nan) == "n/a" and fmt(1.234, 1) == "1.2"
    assert mean_se_cell(2.0, 0.5) == "2.00 ± 0.50" and mean_se_cell(2.0, math.nan) == "2.00"
    assert mean_se_cell(math.nan, math.nan) == mean_se_cell(None, None) == "n/a"
    cmd = ["python", "-m", "serve", "--model", str(tmp_path / "m"), str(Path.home() / "x")]
    assert shown_command(cmd, tmp_path) == "-m serve --model $WORK/m ~/x"
