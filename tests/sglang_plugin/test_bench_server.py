"""``sglang-hsd bench`` for real on the tiny random pair: both servers started in turn (the plain
one, then the HSD one as serve builds it), SGLang's own client against each, the results written.

It checks function, not speed (random weights, a loaded 2-core host): the command exits 0;
``bench.json`` has a row per prompt set x concurrency with positive output tok/s on both servers,
an accept length of at least 1 token per target pass on HSD's side (the bonus token counts), every
request completed; the plain server's recorded command speculates in no way, the HSD one's does;
the record has the commit, the command, the machine and the load; ``bench.png`` exists. The two
servers take about a minute each to start on 2 cores.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("sglang")
pytestmark = [pytest.mark.sglang, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
# Text prompts (the client's sharegpt path tokenizes text; the tiny tokenizer was trained on a
# small English corpus, so these are several tokens each).
PROMPTS = ["the quick brown fox jumps over the lazy dog", "a tiny model reads a short sentence",
           "speculative decoding drafts tokens and the target verifies them", "hello world, once more"]


def test_bench_measures_both_servers_of_the_tiny_pair(tmp_path):
    from sglang_hsd.sglang_plugin.cpu.tiny_models import build_tiny_draft_pair

    target, draft = build_tiny_draft_pair(str(tmp_path / "pair"))
    prompts = tmp_path / "tiny_prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "sglang_hsd.cli", "bench", "--target", target, "--draft", draft,
         "--prompt-sets", str(prompts), "--concurrency", "1,2", "--num-prompts", "4", "--max-new-tokens", "16",
         "--out", str(out), "--startup-timeout", "900"],
        cwd=REPO, capture_output=True, text=True, timeout=2400)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr (end):\n{proc.stderr[-4000:]}"
    saved = json.loads((out / "bench.json").read_text())
    assert saved["complete"]
    assert [(r["prompt_set"], r["concurrency"]) for r in saved["rows"]] == [("tiny_prompts", 1), ("tiny_prompts", 2)]
    for row in saved["rows"]:
        plain, hsd = row["plain"], row["hsd"]
        assert plain["output_throughput"] > 0 and hsd["output_throughput"] > 0
        assert plain["completed"] == hsd["completed"] == 4
        assert hsd["accept_length_mean"] >= 1 and len(hsd["per_request_accept_length"]) == 4
        assert row["ratio"] == pytest.approx(hsd["output_throughput"] / plain["output_throughput"])
        assert plain["median_tpot_ms"] > 0 and hsd["median_tpot_ms"] > 0
    servers = saved["servers"]
    assert "--speculative" not in servers["plain"]["command"] and "--hsd-draft-kind" not in servers["plain"]["command"]
    assert "--speculative-algorithm HSD" in servers["hsd"]["command"] and servers["hsd"]["started"]
    recorded = saved["record"]
    assert recorded["commit"] and "sglang-hsd bench --target" in recorded["command"]
    assert recorded["cpu"] and recorded["cpu_count"] >= 1 and isinstance(recorded["vector_extensions"], list)
    assert recorded["load_average_start"] and recorded["load_average_end"] and recorded["finished"]
    assert (out / "bench.png").stat().st_size > 1000
    assert "tiny_prompts" in proc.stdout and "HSD tok/s" in proc.stdout
