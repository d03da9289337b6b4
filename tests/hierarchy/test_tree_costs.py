"""A sampled tree round's drawing and verification in the planner's prices (``tree_costs.py``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from sglang_hsd.hierarchy.replay import STOP_THRESHOLDS, AcceptanceRecord  # noqa: E402
from sglang_hsd.hierarchy.round_costs import DrafterSpec, KernelSetting, RoundCosts, measure_round_costs  # noqa: E402
from sglang_hsd.hierarchy.round_planner import RoundShape, predict, replay  # noqa: E402
from sglang_hsd.hierarchy.tree_costs import tree_round_extra, tree_round_seconds  # noqa: E402
from sglang_hsd.runtime.model import CausalLM  # noqa: E402
from sglang_hsd.runtime.testing import tiny_llama  # noqa: E402
from sglang_hsd.sampling import SamplingParams  # noqa: E402
from sglang_hsd.tree_draft import TreeShape  # noqa: E402

TREE = TreeShape(3, 2, 6)


def _costs(**trees) -> RoundCosts:
    rows = (1, 2, 6)
    return RoundCosts(KernelSetting(1, "mkl"), rows, (0.1, 0.11, 0.15), (1.0, 1.05, 1.2), 0.001, **trees)


def test_a_tree_round_pays_its_drawing_once_per_round():
    records = [AcceptanceRecord(False, np.full(64, 0.6), np.zeros(64, dtype=np.int64),
                                np.zeros((len(STOP_THRESHOLDS), 64)))]
    shape = RoundShape(tree=TREE)
    stats = replay(shape, records, 40)
    base = predict(shape, _costs(), records, 40)
    priced = predict(shape, _costs(tree_shapes=(str(TREE),), tree_seconds=(0.02,)), records, 40)
    assert priced.seconds_per_token * stats.tokens == pytest.approx(base.seconds_per_token * stats.tokens
                                                                    + 0.02 * stats.rounds)
    # A chain is not charged a tree's work.
    chain = RoundShape(fixed=3)
    assert predict(chain, _costs(tree_shapes=(str(TREE),), tree_seconds=(0.02,)), records, 40) \
        .seconds_per_token == predict(chain, _costs(), records, 40).seconds_per_token


def test_tree_prices_are_named_by_shape_and_checked():
    costs = _costs(tree_shapes=("3:2:6", "4:2:8"), tree_seconds=(0.02, 0.03))
    assert costs.tree(TreeShape(4, 2, 8)) == 0.03 and _costs().tree(TREE) == 0.0  # older tables: none
    assert RoundCosts.from_dict(costs.as_dict()) == costs
    with pytest.raises(ValueError, match="no tree round timed at shape 2:2:4"):
        costs.tree(TreeShape(2, 2, 4))
    with pytest.raises(ValueError, match="tree_seconds one entry per tree shape"):
        _costs(tree_shapes=("3:2:6",), tree_seconds=())


def test_the_extra_is_the_tree_work_less_the_chain_pricing():
    assert tree_round_extra(TREE, 0.020, 0.004, 0.0005) == pytest.approx(0.020 - 0.004 - 5 * 0.0005)
    calls = []
    seconds = tree_round_seconds(TREE, 50, SamplingParams(1.0), lambda fn: calls.append(fn()) or 0.25,
                                 torch.Generator().manual_seed(0))
    assert seconds == 0.25 and calls == [None]  # the timer ran one whole round (draw and verify)


def test_measured_costs_carry_every_tree_once_per_thread_count():
    with torch.inference_mode():
        target = CausalLM.from_hf(tiny_llama(vocab_size=40, num_layers=2, hidden_size=32, seed=1))
        drafter = CausalLM.from_hf(tiny_llama(vocab_size=40, num_layers=1, hidden_size=32, seed=2))
        costs = measure_round_costs(target, DrafterSpec(model=drafter), [KernelSetting(1, "mkl"),
                                                                          KernelSetting(1, "onednn-packed")],
                                    context_len=8, rows=(1, 2), repeats=1, trees=[TREE, TreeShape(2, 2, 4)])
    assert [c.tree_shapes for c in costs] == [("3:2:6", "2:2:4")] * 2
    assert costs[0].tree_seconds == costs[1].tree_seconds  # the kernel path does not change it
