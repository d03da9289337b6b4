"""benchmarks/bench_tree_budget.py: exact budgeted rules on tiny worlds, its options and tables."""

import json

import pytest

from benchmarks import bench_tree_budget as budget
from sglang_hsd.verify.oracles import exact
from sglang_hsd.verify.oracles.expand_exact import Shape, expand_round_law


def test_budget_values_are_the_oracles_laws():
    world = exact.random_world(4, 3, seed=2, concentration=0.5)
    shape = Shape(3, 2, 5)
    values = budget.budget_values(world, shape, ["spine_wide", "beam"])
    laws = values.pop("accepted_law")
    assert set(values) == {"stock", "spine_wide", "beam", budget.ARGMAX_FIRST}
    assert values["beam"] == pytest.approx(expand_round_law(world, "beam", shape).expected_accepted, abs=1e-15)
    assert all(0.0 <= v <= shape.depth for v in values.values())
    # The switch's two laws of the accepted count: distributions with the rules' means.
    assert set(laws) == set(budget.SWITCHED)
    for name, law in laws.items():
        assert len(law) == shape.depth + 1 and sum(law) == pytest.approx(1.0, abs=1e-12)
        assert sum(a * p for a, p in enumerate(law)) == pytest.approx(values[name], abs=1e-12)
    # A different budget is a different law: the values must depend on N.
    assert budget.budget_values(world, Shape(3, 2, 3), ["spine_wide"])["spine_wide"] != values["spine_wide"]


def test_real_trees_lift_the_world_vocab_limit():
    args = budget.parse_args(["--shapes", "3,5,8", "--real-trees", "16", "--continuation-temperature", "0.7"])
    assert args.real_trees == 16 and args.continuation_temperature == 0.7


def test_the_default_rule_is_always_measured():
    assert budget.parse_args(["--rules", "beam"]).rules == ["beam", "spine_wide"]
    world = exact.random_world(4, 3, seed=4, concentration=0.5)
    values = budget.budget_values(world, Shape(3, 2, 5), ["beam"])
    assert set(values["accepted_law"]) == set(budget.SWITCHED)  # the default's law without its column


def test_context_rows_cover_every_shape_and_temperature():
    import torch

    vocab, depth = 4, 3
    nodes = sum(vocab**n for n in range(depth))
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(nodes, 12, generator=gen)
    recorded = {"target": logits, "draft": logits + 0.5 * torch.randn(nodes, 12, generator=gen),
                "tokens": torch.stack([torch.topk(row, vocab).indices for row in logits])}
    args = budget.parse_args(["--shapes", "3,2,5", "2,3,4", "--temperature", "0.7", "1.0", "--world-vocab", "4",
                              "--rules", "spine_wide"])
    rows = budget.context_rows(recorded, args, {"set": "s", "prompt": 0, "position": 0})
    assert sorted((tuple(r["shape"]), r["temperature"]) for r in rows) == sorted(
        (s, t) for s in [(3, 2, 5), (2, 3, 4)] for t in (0.7, 1.0))
    assert all(r["spine_wide"] > 0 and r["stock"] > 0 for r in rows)


@pytest.mark.parametrize("argv,match", [
    (["--shapes", "5,4"], "D,k,N"),
    (["--shapes", "2,2,12"], "2 <= N"),
    (["--rules", "pruned"], "--rules"),
    (["--temperature", "0"], "T = 0"),
    (["--shapes", "3,5,8"], "--world-vocab"),
    (["--continuation-temperature", "0"], "--continuation-temperature"),
    (["--real-trees", "1"], "--real-trees"),
])
def test_bad_options_are_refused(argv, match, capsys):
    with pytest.raises(SystemExit):
        budget.parse_args(argv)
    assert match in capsys.readouterr().err


def test_results_files_hold_the_summary_and_the_run(tmp_path, monkeypatch):
    from benchmarks import common

    monkeypatch.setattr(budget, "RESULTS_DIR", tmp_path)
    law = {"stock": [0, 1, 0, 0, 0, 0], "spine_wide": [0, 0.5, 0.5, 0, 0, 0]}
    rows = [{"set": "mtbench", "prompt": p, "position": 0, "shape": [5, 4, 8], "temperature": 0.7, "stock": 1.0,
             "spine_wide": 1.0 + 0.5 * p, budget.ARGMAX_FIRST: 0.9, "accepted_law": law} for p in range(2)]
    meta = {"target": "t", "drafter": "model:d", "world_vocab": 5, "rules": ["spine_wide", budget.ARGMAX_FIRST],
            "command": "python benchmarks/bench_tree_budget.py"}
    summary = budget.save_results("x", meta, rows, common.start_run(budget.__file__, ["--name", "x"]))
    assert summary[0]["mean"]["spine_wide"] == pytest.approx(1.25)
    assert summary[0]["ratio_to_stock"]["spine_wide"] == pytest.approx(2.25 / 2.0)
    assert summary[0]["below_stock"] == {"spine_wide": 0, budget.ARGMAX_FIRST: 2}
    text = (tmp_path / "x.md").read_text()
    assert "| (5, 4, 8) | 0.7 | 2 | 1.000 | 1.250 | 1.125 | 0 | 0.900 | 0.950 | 2 |" in text and "\n## Run\n" in text
    assert json.loads((tmp_path / "x.json").read_text())["summary"][0]["contexts"] == 2
    # One position per prompt: the switch drafts the default tree; the ceiling takes the better.
    assert summary[0]["switch_ratio_to_stock"] == pytest.approx(
        {"switch a>=D-1": 2.25 / 2.0, "switch a>=D": 2.25 / 2.0, "best of the two per context": 2.25 / 2.0})
    assert "| (5, 4, 8) | 0.7 | 1.125 | 1.125 | 1.125 |" in text


def test_switch_value_follows_the_mode_chain_over_positions():
    """A prompt at three positions (rows out of order), D = 2, threshold 2: the default tree first,
    then the stock tree with the probability that the previous round accepted both drafts."""
    def row(position, stock, default, stock_law, default_law):
        return {"set": "s", "prompt": 0, "position": position, "stock": stock, "spine_wide": default,
                "accepted_law": {"stock": stock_law, "spine_wide": default_law}}

    rows = [row(16, 2.0, 1.0, [0, 0, 1], [0, 1, 0]),
            row(0, 1.0, 1.2, [0.1, 0.8, 0.1], [0.2, 0.4, 0.4]),
            row(8, 1.8, 1.5, [0, 0.2, 0.8], [0.1, 0.3, 0.6])]
    # position 0: 1.2; P(stock) = 0.4 -> 0.4 * 1.8 + 0.6 * 1.5 = 1.62; P(stock) = 0.4 * 0.8 + 0.6 * 0.6 = 0.68
    # -> 0.68 * 2.0 + 0.32 * 1.0 = 1.68
    assert budget.switch_value(rows, 2) == pytest.approx((1.2 + 1.62 + 1.68) / 3, abs=1e-12)
    assert budget.switch_value(rows, 3) == pytest.approx((1.2 + 1.5 + 1.0) / 3, abs=1e-12)  # never switches


def test_confidence_value_takes_the_stock_tree_where_the_root_is_confident():
    rows = [{"stock": 3.0, "spine_wide": 2.0, "root_q_max": 0.9}, {"stock": 0.5, "spine_wide": 1.5, "root_q_max": 0.3}]
    assert budget.confidence_value(rows, 0.6) == pytest.approx((3.0 + 1.5) / 2)
    assert budget.confidence_value(rows, 0.95) == pytest.approx((2.0 + 1.5) / 2)
    full = [{**r, "set": "s", "prompt": i, "position": 0, "shape": [3, 2, 5], "temperature": 0.7,
             "accepted_law": {"stock": [0, 0, 0, 1], "spine_wide": [0, 0, 1, 0]}} for i, r in enumerate(rows)]
    switch = budget.summarize(full, ["spine_wide"])[0]["switch_ratio_to_stock"]
    assert switch["root q max>=0.6"] == pytest.approx((4.5 / 2 + 1) / (3.5 / 2 + 1))
