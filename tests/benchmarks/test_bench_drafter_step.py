"""bench_drafter_step on a tiny model: the variants really switch kernels, the table is written."""

import torch

from benchmarks import bench_drafter_step as bench
from sglang_hsd.runtime.layers import CopyRowsLinear, PackedLinear
from sglang_hsd.runtime.model import CausalLM
from sglang_hsd.runtime.testing import tiny_llama


def test_variants_switch_kernels_and_time_every_row_count():
    model = CausalLM.from_hf(tiny_llama(vocab_size=48, num_layers=2, hidden_size=32, seed=0))
    for kind in ("fp16", "int4"):
        bench.set_variant(model, f"packed + {kind} rows")
        assert isinstance(model.lm_head, CopyRowsLinear) and isinstance(model.lm_head.inner, PackedLinear)
        assert model.lm_head.kind == kind
    bench.set_variant(model, "fp32 mkl")
    assert type(model.lm_head) is torch.nn.Linear
    gen = torch.Generator().manual_seed(0)
    assert all(bench.step_ms(model, n, 8, 2, gen) > 0 for n in (1, 3))
    share = bench.agreement(model, [[1, 2, 3, 4, 5]], "int4")
    assert 0.0 <= share <= 1.0 and type(model.lm_head) is torch.nn.Linear


def test_table_names_every_variant():
    result = {"model": "m", "threads": 2, "context": 8, "rows": [1, 2],
              "ms": {v: [2.0, 3.0] for v in bench.VARIANTS}, "prompt_set": "humaneval", "num_prompts": 1,
              "positions": 5, "agreement": {"bf16": 0.9, "fp16": 1.0}}
    table = bench.format_table(result)
    assert all(v in table for v in bench.VARIANTS) and "| 2 | 3.0 (1.50x)" in table and "bf16 90.0%" in table


def test_target_acceptance_is_one_for_the_target_itself_and_less_for_another_drafter():
    """The acceptance measure: a drafter equal to the target accepts every position (sum min(p, q)
    = 1, argmax equal) in fp32; a different drafter does not; every copy kind is reported and the
    table shows them. A drafter whose vocabulary differs is refused."""
    target = CausalLM.from_hf(tiny_llama(vocab_size=48, num_layers=2, hidden_size=32, seed=1))
    other = CausalLM.from_hf(tiny_llama(vocab_size=48, num_layers=2, hidden_size=32, seed=2))
    sequences = [(bench.greedy_continuation(target, [1, 2, 3], 6), 3)]
    assert len(sequences[0][0]) == 9
    same = bench.target_acceptance(CausalLM.from_hf(tiny_llama(vocab_size=48, num_layers=2, hidden_size=32,
                                                               seed=1)), target, sequences)
    assert same["fp32"]["t1"] > 1 - 1e-5 and same["fp32"]["t0"] == 1.0
    assert set(same) == {"fp32", *bench.WEIGHT_COPIES}
    different = bench.target_acceptance(other, target, sequences)
    assert different["fp32"]["t1"] < 0.99
    result = {"model": "m", "threads": 2, "context": 8, "rows": [1], "ms": {v: [2.0] for v in bench.VARIANTS},
              "prompt_set": "humaneval", "num_prompts": 1, "positions": 3, "agreement": {},
              "target": "t", "continuation": 6, "acceptance_positions": 6, "acceptance": different}
    assert "| w8a8 |" in bench.format_table(result)
    wider = CausalLM.from_hf(tiny_llama(vocab_size=64, num_layers=2, hidden_size=32, seed=2))
    import pytest
    with pytest.raises(ValueError, match="vocabulary"):
        bench.target_acceptance(wider, target, sequences)
