"""benchmarks/tree_root_bound.py on synthetic logits (no model)."""

import argparse

import torch

from benchmarks.tree_root_bound import markdown, measure, reduced, sampled_accepted


def test_reduced_keeps_the_mass_and_lumps_the_rest():
    p = torch.softmax(torch.randn(3, 40), -1)
    q = torch.softmax(torch.randn(3, 40), -1)
    ps, qs = reduced(p, q, 4)
    assert torch.allclose(ps.sum(-1), torch.ones(3, dtype=torch.float64))
    assert torch.allclose(qs.sum(-1), torch.ones(3, dtype=torch.float64))
    assert torch.allclose(ps[:, :-1].max(-1).values, p.max(-1).values.double())


def test_sampled_children_of_q_equal_to_p_are_always_accepted():
    p = torch.softmax(torch.randn(30, dtype=torch.float64), -1)
    out = sampled_accepted(p, p, 2, 64, torch.Generator().manual_seed(0))
    assert out == {"rrs": 1.0, "hsd": 1.0}


def test_rows_order_stock_sampled_and_bound():
    """Flat, unrelated p and q: sampled children accept more than the top-k of q, and the bound
    is above both verifiers (up to Monte Carlo noise)."""
    torch.manual_seed(1)
    group = {"pair": "synthetic", "set": "random", "target": torch.randn(24, 60), "draft": torch.randn(24, 60)}
    args = argparse.Namespace(chunk=8, support=16, trees=256)
    row = measure(group, 1.0, 2, args, torch.Generator().manual_seed(0))
    assert row["positions"] == 24
    assert row["bound"] >= row["hsd"] - 0.02 and row["bound"] >= row["rrs"] - 0.02
    assert 0.0 < row["stock"] < row["bound"]
    assert "| synthetic | random | 1.0 | 2 | 24 |" in markdown([row])
