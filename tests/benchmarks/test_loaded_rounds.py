"""``benchmarks/loaded_rounds.py``: what it reads from py-spy's samples and ``/server_info``."""

from __future__ import annotations

from benchmarks.loaded_rounds import markdown, phase_shares, round_table


def test_phase_shares_count_main_thread_samples_only():
    raw = "\n".join([
        "m;Scheduler.run_event_loop (s.py:1);HSDVerify.forward_batch_generation (v.py:2);"
        "run_eagle_verify (e.py:3) 30",
        "m;Scheduler.run_event_loop (s.py:1);HSDVerify.forward_batch_generation (v.py:2);"
        "EagleDraftWorker._draft_extend_for_decode (d.py:4) 20",
        "m;Scheduler.run_event_loop (s.py:1);Scheduler.process_batch_result (s.py:9) 10",
        "t;Thread.run (t.py:1);Event.wait (t.py:2) 500",  # an idle thread is not the scheduler's time
    ])
    spy = phase_shares(raw)
    assert spy["samples"] == 60
    shares = spy["shares"]
    assert shares["decode round (HSD)"] == round(50 / 60, 4)
    assert shares["verify"] == 0.5 and shares["draft extend"] == round(20 / 60, 4)
    assert shares["result processing"] == round(10 / 60, 4) and shares["draft steps"] == 0.0
    assert spy["inside"]["verify"] == {"run_eagle_verify": 1.0}  # its own frame is innermost
    assert spy["inside"]["decode round (HSD)"] == {
        "HSDVerify.forward_batch_generation > run_eagle_verify": 0.6,
        "HSDVerify.forward_batch_generation > EagleDraftWorker._draft_extend_for_decode": 0.4}
    assert phase_shares("") == {"samples": 0, "shares": {}, "inside": {}}


def test_round_table_puts_the_mean_beside_the_controllers_median():
    adaptive = {"round_ms_by_batch_bucket": {"4": {"2": 625.0}, "1": {"0": 250.0}},
                "rounds_and_total_ms_by_batch_bucket": {"4": {"2": [350, 247309.4]}, "1": {"0": [3, 900.0]}},
                "accepted_drafts_by_length": {"2": [383, 175, 883]}}
    rows = round_table(adaptive)
    assert rows == [{"bucket": 1, "length": 0, "rounds": 3, "mean_ms": 300.0, "median_ms": 250.0},
                    {"bucket": 4, "length": 2, "rounds": 350, "mean_ms": 706.6, "median_ms": 625.0}]
    text = markdown({"config": "hsd-adaptive-k8", "concurrency": 4, "server_command": "x",
                     "prompt_set": "sharegpt", "num_prompts": 48, "output_len": 64, "temperature": 0.0,
                     "client": {"output_throughput": 8.4, "median_tpot_ms": 394.0, "accept_length": 2.34},
                     "server_info": {"adaptive": adaptive}, "py_spy": None})
    assert "| 4 | 2 | 350 | 706.6 | 625.0 |" in text and "[383, 175, 883]" in text


def test_torch_step_summary_splits_the_median_step_into_ops_and_gaps(tmp_path):
    """``torch_trace``: a step's top-level ops (not those nested in another op) and the time between
    them, for the median step of a kind; the busiest thread is the scheduler's."""
    import gzip
    import json

    from benchmarks.torch_trace import read_trace, step_summary

    def op(name, ts, dur, cat="cpu_op", tid=1):
        return {"ph": "X", "name": name, "ts": ts, "dur": dur, "cat": cat, "tid": tid}

    events = [op("step[DRAFT bs=1]", 0, 100, "user_annotation"), op("aten::mm", 10, 50),
              op("aten::copy_", 20, 5),  # inside mm: not counted again
              op("aten::add", 70, 10),
              op("step[DRAFT bs=1]", 200, 300, "user_annotation"), op("aten::mm", 210, 250),
              op("step[DRAFT bs=1]", 600, 40, "user_annotation"), op("aten::mm", 600, 40),
              op("aten::other", 0, 1, tid=2)]
    path = tmp_path / "t.trace.json.gz"
    with gzip.open(path, "wt") as handle:
        json.dump({"traceEvents": events}, handle)
    summary = step_summary(read_trace(path), "step[DRAFT bs=1]")
    assert summary == {"count": 3, "median_ms": 0.1, "ops_ms": 0.06, "gaps_ms": 0.04,
                       "top_ops": {"aten::mm": [1, 0.05], "aten::add": [1, 0.01]}}
    assert step_summary(read_trace(path), "step[VERIFY bs=1]") is None
    text = markdown({"config": "c", "concurrency": 1, "server_command": "x", "prompt_set": "p",
                     "num_prompts": 1, "output_len": 1, "temperature": 0.0, "client": {},
                     "server_info": {}, "torch_profile": {"step[DRAFT bs=1]": summary}})
    assert "| step[DRAFT bs=1] | 3 | 0.1 | 0.06 | 0.04 | aten::mm 1x 0.05, aten::add 1x 0.01 |" in text
