"""The serving benchmark's bookkeeping: per-run level statistics from two ``/server_info``
snapshots, and the table (no server here)."""

from __future__ import annotations

from benchmarks.bench_sglang_serving import _levels_delta, markdown_table


def _levels(rounds, sub_rounds, accepted, proposed, target_proposed, target_accepted, emitted,
            seconds):
    return {"rounds": rounds, "exit_subrounds": sub_rounds, "exit_accepted": accepted,
            "exit_proposed": proposed, "target_proposed": target_proposed,
            "target_accepted": target_accepted, "emitted": emitted, "layer_forwards": 100,
            "layer_forwards_stock": 200, "seconds": {"lower_forward": seconds}}


def test_levels_delta_counts_only_the_benchmark_rounds_and_sub_rounds():
    before = _levels(10, 30, 5, 60, 25, 12, 20, 1.0)
    after = _levels(20, 70, 15, 140, 65, 32, 45, 3.5)
    after["layer_forwards"], after["layer_forwards_stock"] = 400, 600
    delta = _levels_delta(before, after)
    assert delta["rounds"] == 10 and delta["exit_subrounds"] == 40
    assert delta["exit_subrounds_per_round"] == 4.0
    assert delta["exit_accept_length"] == (10 + 40) / 40  # per exit sub-round
    assert delta["exit_accept_rate"] == 10 / 80
    assert delta["target_tokens_per_round"] == 4.0 and delta["tokens_per_round"] == 2.5
    assert delta["layer_forwards_saved"] == 1 - 300 / 400
    assert delta["seconds"] == {"lower_forward": 2.5}
    assert _levels_delta(None, None) is None


def test_table_has_one_row_per_config_and_marks_failures():
    meta = {"sglang_version": "0.5.23", "cpu_count": 2, "model": "tiny", "exit_layer": 2,
            "exit_heads": "logit lens", "num_prompts": 4, "input_len": 8, "output_len": 8,
            "temperature": 0.0, "max_concurrency": 2, "num_steps": 3, "prompt_source": "random",
            "caveat": "caveat", "command": "cmd"}
    levels = _levels_delta(None, _levels(4, 8, 2, 10, 9, 5, 7, 0.5))
    records = [
        {"config": "hsd-exit-window", "note": "n", "completed": 4, "output_throughput": 1.5,
         "request_throughput": 0.2, "mean_e2e_latency_ms": 900.0, "median_tpot_ms": 80.0,
         "accept_length": 1.4, "hsd_levels": levels},
        {"config": "none", "note": "m", "error": "server did not start"},
    ]
    table = markdown_table(records, meta)
    row = next(line for line in table.splitlines() if line.startswith("| hsd-exit-window"))
    assert "| 2.00 |" in row  # exit sub-rounds per round
    assert "| none | failed: server did not start |" in table
    header = next(line for line in table.splitlines() if line.startswith("| config"))
    assert header.count("|") == row.count("|")


def test_server_commands_of_the_exit_level_configurations(tmp_path):
    from argparse import Namespace

    from benchmarks.bench_sglang_serving import CONFIGS, server_command
    from benchmarks.serving_harness import ModelSetup

    setup = ModelSetup("tiny", tmp_path / "t", tmp_path / "h", None, 2, "random")
    args = Namespace(dtype="float32", num_steps=3)

    def tail(name):
        cmd = server_command(CONFIGS[name], setup, args)
        return cmd[cmd.index("--dtype"):]

    assert tail("none") == ["--dtype", "float32"]
    assert tail("hsd") == ["--dtype", "float32", "--hsd-verify-method", "hsd"]
    assert tail("hsd-exit")[-4:] == ["--hsd-exit-layer", "2", "--hsd-exit-heads", "none"]
    assert tail("hsd-exit-window")[-2:] == ["--hsd-exit-buffer", "4"]
    eagle3 = server_command(CONFIGS["eagle3"], setup, args)
    assert "--speculative-use-rejection-sampling" not in eagle3
