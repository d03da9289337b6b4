"""The tree serving benchmark's bookkeeping: shapes, server flags, mean and standard error, the
table's lookup of chains by depth (no server here)."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks.bench_sglang_tree import CONFIGS, markdown_table, parse_shape, server_flags
from benchmarks.serving_client import mean_se, read_per_request


def test_parse_shape_and_flags():
    assert parse_shape("5,4,8") == (5, 4, 8)
    with pytest.raises(SystemExit, match="D,k,N"):
        parse_shape("5,4")
    flags = server_flags(CONFIGS["stock-tree"], (5, 4, 8))
    assert flags == ["--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "8",
                     "--hsd-tree-draft", "topk", "--hsd-verify-method", "target-only",
                     "--hsd-adaptive", "off"]
    assert server_flags(CONFIGS["hsd-chain"], (5, 4, 8)) == [
        "--speculative-eagle-topk", "1", "--hsd-verify-method", "hsd", "--hsd-adaptive", "off"]
    assert server_flags(CONFIGS["hsd-tree-sharp"], (5, 4, 8))[-2:] == [
        "--hsd-draft-temperature-scale", "0.5"]
    assert "--hsd-draft-temperature-scale" not in server_flags(CONFIGS["hsd-tree"], (5, 4, 8))
    assert server_flags(CONFIGS["hsd-tree-beam"], (5, 4, 8))[-2:] == ["--hsd-tree-rule", "beam"]
    assert "--hsd-tree-rule" not in server_flags(CONFIGS["hsd-tree"], (5, 4, 8))
    assert server_flags(CONFIGS["argmax-first-tree"], (5, 4, 8))[-6:] == [
        "--hsd-tree-draft", "argmax-first", "--hsd-verify-method", "hsd", "--hsd-adaptive", "off"]


def test_mean_and_standard_error():
    mean, se = mean_se([1.0, 2.0, 3.0, 4.0])
    assert mean == 2.5 and se == pytest.approx(math.sqrt((2.25 + 0.25 + 0.25 + 2.25) / 3 / 4))
    assert math.isnan(mean_se([2.0])[1]) and math.isnan(mean_se([])[0])


def test_per_request_file_keeps_successful_requests_with_an_accept_length(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text('[{"success": true, "output_len": 8, "accept_length": 2.5},'
                    ' {"success": false, "output_len": 0, "accept_length": 0.0},'
                    ' {"success": true, "output_len": 8, "accept_length": 0.0}]')
    assert read_per_request(path) == [2.5]


def test_table_ratio_chain_by_depth_and_failures():
    def record(config, shape, temperature, mean):
        return {"config": config, "shape": shape, "temperature": temperature,
                "accept_length_mean": mean, "accept_length_se": 0.1, "output_throughput": 4.0 * mean}

    records = [record("stock-tree", [5, 4, 8], 1.0, 1.5), record("hsd-tree", [5, 4, 8], 1.0, 1.8),
               record("hsd-chain", [5, 4, 8], 1.0, 1.6),
               {"config": "hsd-tree", "shape": [4, 2, 8], "error": "boom"}]
    meta = {"configs": ["stock-tree", "hsd-tree", "hsd-chain"], "shapes": [(5, 4, 8), (4, 2, 8)],
            "temperatures": [1.0], "model": "m", "num_prompts": 2, "prompt_source": "s",
            "output_len": 4, "max_concurrency": 2, "sglang_version": "0.5.23",
            "config_notes": {n: CONFIGS[n].note for n in CONFIGS}}
    table = markdown_table(records, meta)
    assert "| 5,4,8 | 1 | 1.500 ± 0.100 | 1.800 ± 0.100 | 1.600 ± 0.100 | 1.200 |" in table
    assert "| 4,2,8 | 1 | n/a | failed | n/a | n/a |" in table
    assert "hsd-tree [4, 2, 8]: boom" in table
    assert "| 5,4,8 | 1 | 6.00 | 7.20 (1.20x) | 6.40 (1.07x) |" in table  # output tok/s, ratio to stock
    assert "| 4,2,8 | 1 | n/a | n/a | n/a |" in table


def test_paired_per_prompt_lines():
    """Sampled configurations are paired with stock-tree prompt by prompt, thirds ranked by stock."""
    stock = [1.0, 1.2, 1.4, 1.6, 1.8, 2.0]
    hsd = [1.5, 1.5, 1.6, 1.6, 1.7, 1.7]

    def record(config, values):
        return {"config": config, "shape": [5, 4, 8], "temperature": 0.7, "accept_length_mean": 1.5,
                "accept_length_se": 0.1, "per_request_accept_length": values}

    meta = {"configs": ["stock-tree", "hsd-tree"], "shapes": [(5, 4, 8)], "temperatures": [0.7, 0.0],
            "model": "m", "num_prompts": 6, "prompt_source": "s", "output_len": 4,
            "max_concurrency": 2, "sglang_version": "0.5.23",
            "config_notes": {n: CONFIGS[n].note for n in CONFIGS}}
    table = markdown_table([record("stock-tree", stock), record("hsd-tree", hsd)], meta)
    diff = mean_se([b - a for a, b in zip(stock, hsd)])
    assert (f"| 5,4,8 | 0.7 | hsd-tree | {diff[0]:+.3f} ± {diff[1]:.3f} | 3/6 | 1.100 -> 1.500 | "
            f"1.500 -> 1.600 | 1.900 -> 1.700 |") in table
    assert "| 5,4,8 | 0 | hsd-tree |" not in table  # greedy rows are not paired
    # with a T = 0 stock row the thirds follow its ranking (here the reverse of the sampled one's)
    greedy = dict(record("stock-tree", [6.0, 5.0, 4.0, 3.0, 2.0, 1.0]), temperature=0.0)
    table = markdown_table([record("stock-tree", stock), record("hsd-tree", hsd), greedy], meta)
    assert "| 3/6 | 1.900 -> 1.700 | 1.500 -> 1.600 | 1.100 -> 1.500 |" in table


def test_combine_joins_comparable_runs_and_refuses_others(tmp_path):
    import json

    from benchmarks.bench_sglang_tree import combine

    base = {"model": "m", "num_prompts": 4, "output_len": 8, "max_concurrency": 2,
            "prompt_source": "s", "sglang_version": "0.5.23", "temperatures": [1.0]}

    def write(name, configs, shapes, rows, **meta):
        path = tmp_path / name
        path.write_text(json.dumps({"meta": {**base, "configs": configs, "shapes": shapes, **meta},
                                    "results": rows, "run": {"commit": name[:3], "command": "c"}}))
        return path

    row = {"config": "stock-tree", "shape": [5, 4, 8], "temperature": 1.0,
           "accept_length_mean": 1.5, "accept_length_se": 0.1}
    a = write("aaa.json", ["stock-tree"], [[5, 4, 8]], [row])
    b = write("bbb.json", ["hsd-chain", "hsd-tree-sharp"], [[5, 4, 8], [4, 2, 8]],
              [dict(row, config="hsd-chain", accept_length_mean=1.7)],
              config_notes={"hsd-chain": "chain", "hsd-tree-sharp": "sharp, S = 0.5"})
    records, meta = combine([a, b])
    assert meta["configs"] == ["stock-tree", "hsd-tree-sharp", "hsd-chain"]  # registry order
    assert meta["shapes"] == [(5, 4, 8), (4, 2, 8)]
    assert meta["config_notes"]["hsd-tree-sharp"] == "sharp, S = 0.5"
    assert [r["from_run"] for r in records] == ["aaa.json @ aaa", "bbb.json @ bbb"]
    table = markdown_table(records, meta)
    assert "| 5,4,8 | 1 | 1.500 ± 0.100 | n/a | 1.700 ± 0.100 | n/a |" in table
    assert "rows of run `bbb.json` (commit `bbb`)" in table
    other = write("ccc.json", ["hsd-tree"], [[5, 4, 8]], [], output_len=64)
    with pytest.raises(SystemExit, match="output_len"):
        combine([a, other])


def test_rows_are_keyed_by_config_shape_and_temperature():
    from benchmarks.bench_sglang_tree import tree_row_key

    row = {"config": "hsd-tree", "shape": [5, 4, 8], "temperature": 1.0, "note": "n"}
    assert tree_row_key(row) == ("hsd-tree", (5, 4, 8), 1.0)
    assert tree_row_key(json.loads(json.dumps(row))) == tree_row_key(row)  # resumed from JSON


def test_combine_takes_runs_from_before_the_shared_harness(tmp_path):
    from benchmarks.bench_sglang_tree import combine

    row = {"config": "stock-tree", "shape": [5, 4, 8], "temperature": 1.0,
           "accept_length_mean": 1.5, "accept_length_se": 0.1}
    paths = []
    for name, source in (("old.json", "sharegpt (sglang_hsd.assets)"),
                         ("new.json", "sharegpt (200 prompts)")):
        meta = {"model": "m", "num_prompts": 4, "output_len": 8, "max_concurrency": 2,
                "prompt_source": source, "sglang_version": "0.5.23", "temperatures": [1.0],
                "configs": ["stock-tree"], "shapes": [[5, 4, 8]]}
        paths.append(tmp_path / name)
        paths[-1].write_text(json.dumps({"meta": meta, "results": [row],
                                         "run": {"commit": "c", "command": "x"}}))
    records, _ = combine(paths)
    assert len(records) == 2


def test_a_draft_language_model_server_gets_the_tree_flags_and_extra_arguments(tmp_path):
    from benchmarks.bench_sglang_tree import parse_args, server_spec
    from benchmarks.serving_harness import ModelSetup

    args = parse_args(["--draft-model", "d", "--extra-server-args", "--hsd-draft-precision int4"])
    setup = ModelSetup("m", tmp_path / "target", tmp_path / "draft", None, 0, "sharegpt")
    cmd = server_spec(CONFIGS["argmax-first-tree"], (5, 4, 8), setup, args, tmp_path).command
    assert cmd[cmd.index("--speculative-draft-model-path") + 1] == str(tmp_path / "draft")
    assert cmd[cmd.index("--hsd-draft-kind") + 1] == "model"
    assert cmd[cmd.index("--hsd-tree-draft") + 1] == "argmax-first"
    assert cmd[cmd.index("--speculative-eagle-topk") + 1] == "4"
    assert cmd[-2:] == ["--hsd-draft-precision", "int4"]
    head = server_spec(CONFIGS["stock-tree"], (5, 4, 8), setup, parse_args([]), tmp_path).command
    assert "--hsd-draft-kind" not in head  # the EAGLE-3 head: SGLang detects it


def _heads_with_training_prompts(tmp_path, names):
    import torch

    from benchmarks.serving_harness import ModelSetup

    heads = tmp_path / "heads"
    (heads / "eagle3").mkdir(parents=True)
    torch.save({"meta": {"names": names}}, heads / "features-train-sharegpt-3x8.pt")
    return ModelSetup("m", tmp_path / "target", heads / "eagle3", None, 16, "sharegpt")


def test_prompt_offset_skips_past_the_heads_training_prompts(tmp_path, monkeypatch):
    """auto: served prompts start after the set's last training prompt; a fixed offset that
    overlaps is counted (and warned about); a draft model has no training prompts."""
    import argparse

    import sglang_hsd.assets.prompts as prompts
    from benchmarks import bench_sglang_tree as bench

    ids = [f"id{i}" for i in range(400)]
    monkeypatch.setattr(prompts, "load_prompts", lambda name, limit=None, **kw: [
        argparse.Namespace(id=i) for i in ids[:limit]])
    setup = _heads_with_training_prompts(tmp_path, ["sharegpt/id0", "sharegpt/id3", "alpacaeval/id9", "sharegpt/id7"])

    def args(offset, draft_model=None):
        return argparse.Namespace(prompt_offset=offset, prompt_set="sharegpt", draft_model=draft_model)

    assert bench.prompt_offset(args("auto"), setup) == (8, 0)
    assert bench.prompt_offset(args("0"), setup) == (0, 3)  # id9 trained as an alpacaeval prompt
    assert bench.prompt_offset(args("4"), setup) == (4, 1)
    assert bench.prompt_offset(args("auto", draft_model="d"), setup) == (0, 0)
    for bad in ("-1", "x"):
        with pytest.raises(SystemExit, match="--prompt-offset must be"):
            bench.prompt_offset(args(bad), setup)

    def offline(name, limit=None, **kw):
        raise OSError("offline")

    monkeypatch.setattr(prompts, "load_prompts", offline)  # the prompt file falls back to the tiny corpus
    assert bench.prompt_offset(args("auto"), setup) == (0, 0)
