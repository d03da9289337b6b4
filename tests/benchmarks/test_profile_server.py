"""The server profile's bookkeeping (no server): cProfile entries summed per phase, rounds, table."""

from __future__ import annotations

import pytest

pytest.importorskip("sglang")

from benchmarks.profile_server import markdown, phase_seconds, phase_seconds_calls  # noqa: E402


def _entry(calls, self_s, cum_s):
    return (calls, calls, self_s, cum_s, {})


STATS = {
    ("/x/sglang/srt/managers/scheduler.py", 1, "run_batch"): _entry(10, 0.1, 10.0),
    ("/x/sglang/srt/speculative/eagle_worker_v2.py", 5, "verify"): _entry(4, 0.1, 6.0),
    ("/x/sglang_hsd/sglang_plugin/worker.py", 9, "verify"): _entry(4, 0.1, 6.5),  # not SGLang's
    ("/x/sglang_hsd/verify/chain/api.py", 21, "verify_chain"): _entry(4, 0.2, 0.4),
    ("/x/sglang/srt/speculative/eagle_worker_v2.py", 7, "draft"): _entry(4, 0.1, 3.0),
    ("~", 0, "<built-in method torch._C._nn.linear>"): _entry(100, 2.0, 2.0),
    ("~", 0, "<built-in method matmul of type object at 0x7f>"): _entry(5, 1.0, 1.0),
}


def test_phases_sum_the_matching_entries_and_rounds_count_sglang_verify_calls():
    phases = phase_seconds(STATS)
    assert phases["verify (target forward + verifier)"] == (6.0, 4)
    assert phases["  verifier: verify_chain"] == (0.4, 4)
    assert phases["linear: F.linear"] == (2.0, 100)
    assert phases["lm head matmul"] == (1.0, 5)
    assert phases["draft extend after verify"] == (0.0, 0)
    assert phase_seconds_calls(STATS, "speculative/eagle_worker_v2.py", "verify") == 4


def test_table_shows_shares_and_per_round_cost():
    result = {"meta": {"config": "hsd", "prompt_set": "mtbench", "target": "t", "draft": "d",
                       "dtype": "float32", "cpu_linear": "onednn-packed", "num_prompts": 1,
                       "output_len": 16, "temperature": 0.0},
              "rounds": 4, "tokens": 16,
              "requests": [{"seconds": 1.5, "completion_tokens": 16, "accept_length": 4.0}],
              "phases": {row: {"seconds": s, "calls": c} for row, (s, c) in phase_seconds(STATS).items()}}
    text = markdown(result)
    assert "4 rounds (16 tokens, 4.00 per round)" in text
    assert "| verify (target forward + verifier) | 6.00 | 60% | 1500 | 4 |" in text
    assert "draft extend" not in text  # phases that never ran are left out
    assert "16 tokens in 1.5 s (accept length 4.0)" in text
