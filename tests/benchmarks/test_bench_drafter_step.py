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
