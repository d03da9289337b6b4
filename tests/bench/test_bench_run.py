"""``sglang-hsd bench`` run end to end against stand-ins: servers given by URL that answer
``/server_info`` (``fake_server``), SGLang's client replaced by canned results. Checks the
orchestration: a row per prompt set x concurrency x temperature with both sides, the ratio, the
accept length and the row's chosen draft budget, ``bench.json`` with the run's record, the PNG, the
printed table, and how a failed client, a hung server and a server that does not start are booked."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from sglang_hsd import cli
from sglang_hsd.bench import run
from sglang_hsd.bench.client import ClientError, ClientResult
from sglang_hsd.bench.config import BenchConfig
from sglang_hsd.bench.plan import BenchServer, prepare
from sglang_hsd.sglang_plugin.serve_launch import ServeLaunch, ServeModels
from tests.bench.fake_server import fake_sglang, hsd_info, plain_info


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"prompt {i}"}) + "\n" for i in range(2)))
    return path


def _canned_client(calls: list, fail: dict | None = None):
    """A ``run_client`` returning plain 2 tok/s and HSD 5 tok/s per unit of concurrency, HSD's
    requests accepting 2 and 3 tokens per pass; ``fail``: tag -> exception to raise instead."""

    def client(url, spec, workdir, tag, timeout):
        calls.append(tag)
        if fail and tag in fail:
            raise fail[tag]
        hsd = tag.startswith("hsd")
        throughput = (5.0 if hsd else 2.0) * spec.max_concurrency
        log = workdir / f"client_{tag}.log"
        log.write_text("canned")
        return ClientResult({"completed": spec.num_prompts, "output_throughput": throughput,
                             "median_tpot_ms": 1000 / throughput}, [2.0, 3.0] if hsd else [], log)

    return client


def test_a_run_books_every_row_and_writes_json_png_and_table(tmp_path, prompts, monkeypatch, capsys):
    calls: list[str] = []
    monkeypatch.setattr(run, "run_client", _canned_client(calls))
    out = tmp_path / "out"
    with fake_sglang(plain_info(str(tmp_path))) as plain, fake_sglang(hsd_info(str(tmp_path), [0])) as hsd:
        code = cli.main(["bench", "--url-plain", plain, "--url-hsd", hsd, "--prompt-sets", str(prompts),
                         "--concurrency", "1,2", "--temperature", "0,1", "--num-prompts", "2", "--out", str(out)])
    assert code == 0
    assert calls == [f"{side}_mine_c{c}_t{t}" for side in ("plain", "hsd") for c in (1, 2) for t in (0, 1)]
    saved = json.loads((out / "bench.json").read_text())
    assert saved["complete"] and len(saved["rows"]) == 4
    for row in saved["rows"]:
        assert row["ratio"] == pytest.approx(2.5) and row["hsd"]["accept_length_mean"] == pytest.approx(2.5)
        # 4 rounds of length 3 and 1 of length 0 between the two reads around each HSD row
        assert row["hsd"]["mean_draft_budget"] == pytest.approx(12 / 5)
        assert row["plain"]["output_throughput"] == 2.0 * row["concurrency"] and "error" not in row["plain"]
    assert [(r["concurrency"], r["temperature"]) for r in saved["rows"]] == [(1, 0), (1, 1), (2, 0), (2, 1)]
    recorded = saved["record"]
    for key in ("commit", "command", "cpu", "cpu_count", "vector_extensions", "load_average_start",
                "load_average_end", "started", "finished", "torch_version", "sglang_version"):
        assert key in recorded
    assert f"sglang-hsd bench --url-plain {plain} --url-hsd {hsd} --prompt-sets" in recorded["command"]
    assert saved["servers"]["hsd"] == {"url": hsd, "command": None, "started": False}
    assert (out / "bench.png").stat().st_size > 1000
    assert json.loads((out / "prompts_mine.json").read_text())[1]["conversations"][0]["value"] == "prompt 1"
    printed = capsys.readouterr().out
    assert "plain tok/s" in printed and "2.50x" in printed and str(out / "bench.json") in printed


def test_failures_are_booked_on_their_rows(tmp_path, prompts, monkeypatch, capsys):
    calls: list[str] = []
    fail = {"plain_mine_c2_t0": ClientError("client exited 1; see x.log"),
            "hsd_mine_c1_t0": subprocess.TimeoutExpired(["client"], 60)}
    monkeypatch.setattr(run, "run_client", _canned_client(calls, fail))
    out = tmp_path / "out"
    with fake_sglang(plain_info(str(tmp_path))) as plain, fake_sglang(hsd_info(str(tmp_path), [0])) as hsd:
        code = cli.main(["bench", "--url-plain", plain, "--url-hsd", hsd, "--prompt-sets", str(prompts),
                         "--concurrency", "1,2", "--num-prompts", "2", "--out", str(out)])
    assert code == 1
    assert calls == ["plain_mine_c1_t0", "plain_mine_c2_t0", "hsd_mine_c1_t0"]  # a hung server ends its rows
    rows = json.loads((out / "bench.json").read_text())["rows"]
    assert rows[1]["plain"] == {"error": "client exited 1; see x.log"} and rows[1]["ratio"] is None
    assert all("the server hung" in row["hsd"]["error"] for row in rows)
    captured = capsys.readouterr()
    assert "mine c=2 T=0, plain: client exited 1; see x.log" in captured.out
    assert "error: the client ran past 60s: the server hung" in captured.err


def test_a_server_that_does_not_start_fails_its_rows(tmp_path, prompts, monkeypatch, capsys):
    calls: list[str] = []
    monkeypatch.setattr(run, "run_client", _canned_client(calls))
    with fake_sglang(plain_info(str(tmp_path))) as plain, fake_sglang(hsd_info(str(tmp_path), [0])) as hsd:
        config = BenchConfig(url_plain=plain, url_hsd=hsd, prompt_sets=(str(prompts),), concurrency=(1,),
                             num_prompts=1, out=tmp_path / "out", startup_timeout=60)
        plan = prepare(config, fetch=None)
        dying = ServeLaunch([sys.executable, "-c", "print('no room'); raise SystemExit(3)"], {}, "cpu",
                            "http://127.0.0.1:9", ServeModels(tmp_path, tmp_path, "model"))
        plan = dataclasses.replace(plan, servers=(BenchServer("plain", dying.url, dying), plan.servers[1]))
        assert run.execute(plan, "sglang-hsd bench (test)") == 1
    assert calls == ["hsd_mine_c1_t0"]
    row = json.loads((tmp_path / "out" / "bench.json").read_text())["rows"][0]
    assert row["plain"]["error"].startswith("the plain server did not start: server exited with code 3")
    assert row["hsd"]["output_throughput"] == 5.0
    assert "no room" in capsys.readouterr().err  # the log's end is shown
