"""PackedLinear (oneDNN pre-packed projections) against F.linear, and CausalLM.pack_linears.

Regimes: one row (takes F.linear), a few rows (the packed kernel), many rows, 3-D inputs, bias
and no bias, inputs that need gradients and float64 weights (fall back or refuse), a whole model
with qkv bias and tied embeddings, and the generator with and without packing.
"""

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from sglang_hsd.runtime.config import parse_levels
from sglang_hsd.runtime.engine import SpeculativeGenerator
from sglang_hsd.runtime.layers import PackedLinear, packed_linear_supported
from sglang_hsd.runtime.model import CausalLM
from sglang_hsd.runtime.testing import greedy_reference, hf_logits, tiny_llama, tiny_qwen2
from sglang_hsd.sampling import SamplingParams

pytestmark = pytest.mark.skipif(
    not packed_linear_supported(torch.nn.Linear(2, 2)), reason="torch built without oneDNN linear ops"
)

# oneDNN and BLAS sum in different orders: ~1e-6 apart on O(1) outputs of these widths.
ATOL = 1e-5
PACKED_OP = "mkldnn::_linear_pointwise"


def _ran_packed_kernel(fn) -> bool:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return any(event.key == PACKED_OP for event in prof.key_averages())


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 24), (2, 24), (5, 24), (3, 7, 24), (40, 24)])
def test_packed_linear_matches_f_linear(bias, shape):
    torch.manual_seed(0)
    linear = torch.nn.Linear(24, 40, bias=bias)
    packed = PackedLinear(linear)
    x = torch.randn(shape)
    with torch.inference_mode():
        out = packed(x)
        assert out.shape == (*shape[:-1], 40)
        assert (out - linear(x)).abs().max() < ATOL


def test_fast_path_runs_for_several_rows_only():
    packed = PackedLinear(torch.nn.Linear(16, 32))
    with torch.inference_mode():
        assert _ran_packed_kernel(lambda: packed(torch.randn(1, 5, 16)))
        assert not _ran_packed_kernel(lambda: packed(torch.randn(1, 1, 16)))


def test_inputs_needing_gradients_take_the_plain_path():
    with torch.inference_mode(False):  # tests/runtime/conftest.py runs every test under inference mode
        linear = torch.nn.Linear(8, 4)
        packed = PackedLinear(linear)
        x = torch.randn(3, 8, requires_grad=True)
        packed(x).sum().backward()
    assert x.grad is not None and linear.weight.grad is not None
    assert packed.weight is linear.weight and packed.bias is linear.bias


def test_weights_changed_in_place_are_repacked():
    with torch.inference_mode(False):  # weights made under inference mode carry no version counter
        linear = torch.nn.Linear(8, 6)
        packed = PackedLinear(linear)
        with torch.no_grad():
            linear.weight.mul_(2.0)
    with torch.inference_mode():
        x = torch.randn(4, 8)
        assert (packed(x) - linear(x)).abs().max() < ATOL


def test_unsupported_weights_are_refused():
    double = torch.nn.Linear(4, 4).double()
    assert not packed_linear_supported(double)
    with pytest.raises(ValueError, match="linear must be a CPU float32"):
        PackedLinear(double)


def test_pack_linears_keeps_logits_and_shared_parameters():
    hf = tiny_qwen2()  # qkv bias, tied embeddings
    model = CausalLM.from_hf(hf)
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        before = model(ids, model.new_cache(2, 16))
        assert model.pack_linears() and model.pack_linears()  # idempotent
        assert isinstance(model.layers[0].attn.q_proj, PackedLinear) and isinstance(model.lm_head, PackedLinear)
        after = model(ids, model.new_cache(2, 16))
        assert _ran_packed_kernel(lambda: model(ids, model.new_cache(2, 16)))
        model.unpack_linears()
        assert model.lm_head is hf.lm_head and model.layers[1].mlp.down_proj is hf.model.layers[1].mlp.down_proj
        assert torch.equal(model(ids, model.new_cache(2, 16)), before)
    assert (after - before).abs().max() < ATOL
    assert (after - hf_logits(hf, ids)).abs().max() < 1e-4
    hf_ids = {id(p) for p in hf.parameters()}
    assert all(id(p) in hf_ids for p in model.parameters())


def test_pack_linears_is_refused_for_float64_models():
    model = CausalLM.from_hf(tiny_llama(seed=3).double())
    assert not model.pack_linears()
    assert isinstance(model.lm_head, torch.nn.Linear) and not isinstance(model.lm_head, PackedLinear)


@pytest.mark.parametrize("pack", [True, False])
def test_generator_output_is_target_greedy_with_and_without_packing(pack):
    target = CausalLM.from_hf(tiny_llama(vocab_size=48, num_layers=4, hidden_size=32, seed=7))
    drafter = CausalLM.from_hf(tiny_llama(vocab_size=48, num_layers=2, hidden_size=32, seed=8))
    prompt = [1, 2, 3, 4]
    expected = greedy_reference(target, prompt, 12)
    config = parse_levels("model:tiny,exit:2,target", buffers=[3, 2])
    gen = SpeculativeGenerator(target, config, drafter=drafter, validate=True, pack_linears=pack)
    assert isinstance(target.lm_head, PackedLinear) == pack
    assert isinstance(drafter.layers[0].mlp.up_proj, PackedLinear) == pack
    result = gen.generate([prompt], SamplingParams(temperature=0.0), max_new_tokens=12)
    assert result.tokens[0] == expected


def test_exit_heads_run_the_packed_lm_head():
    # A head built before packing reads the target's LM head at each call: after pack_linears its
    # vocabulary product runs on the packed kernel too, with the lens' logits unchanged.
    from sglang_hsd.runtime.exit_heads import ExitHead

    model = CausalLM.from_hf(tiny_qwen2())
    head = ExitHead(model, 1)
    hidden = torch.randn(1, 5, model.hidden_size, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        plain = head(hidden)
        assert model.pack_linears()
        assert _ran_packed_kernel(lambda: head(hidden))
        assert (head(hidden) - plain).abs().max() < ATOL
        assert torch.equal(head(hidden), model.exit_logits(hidden))
        model.unpack_linears()


def test_pack_linears_pads_few_row_calls_where_measured_cheaper(monkeypatch):
    # ``auto`` times whole forwards of 1-4 rows: a tiny model's layers are below
    # MIN_MEASURED_BYTES (cache-resident), so it is not timed nor padded; with the threshold
    # lowered the choice measured on the model's forwards is applied to every packed linear, and
    # padded calls keep every row's logits.
    from sglang_hsd.runtime import model as model_module, row_padding

    model = CausalLM.from_hf(tiny_qwen2())
    ids = torch.randint(0, 64, (1, 3), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        plain = model(ids, model.new_cache(1, 8))
        assert model.pack_linears() and model.row_padding == row_padding.NO_PADDING
        model.unpack_linears()
        rows_timed = []
        monkeypatch.setattr(model_module, "MIN_MEASURED_BYTES", 0)
        monkeypatch.setattr(model_module, "forward_row_padding",
                            lambda forward: [forward(r) or rows_timed.append(r) for r in (1, 4)]
                            and row_padding.RowPadding((4, 4, 4)))
        assert model.pack_linears(row_padding="auto") and rows_timed == [1, 4]
        assert model.row_padding == row_padding.RowPadding((4, 4, 4))
        assert model.lm_head.padding is model.row_padding and model.layers[1].attn.o_proj.padding is model.row_padding
        padded = model(ids, model.new_cache(1, 8))
        model.unpack_linears()
        assert model.row_padding == row_padding.NO_PADDING
        assert model.pack_linears(row_padding="off") and model.lm_head.padding == row_padding.NO_PADDING
        model.unpack_linears()
        # Repacked at the same thread count: the measurement is reused, not run again.
        assert model.pack_linears() and rows_timed == [1, 4] and model.row_padding == row_padding.RowPadding((4, 4, 4))
    assert (padded - plain).abs().max() < ATOL
    with pytest.raises(ValueError, match="row_padding must be one of auto, off, got 'on'"):
        model.pack_linears(row_padding="on")


def test_forward_padding_is_chosen_from_whole_forwards():
    from sglang_hsd.runtime.row_padding import RowPadding, decode_forward, forward_row_padding

    model = CausalLM.from_hf(tiny_qwen2())
    forward = decode_forward(model)
    lengths = []
    padding = forward_row_padding(lambda rows: lengths.append(rows) or forward(rows), repeats=2)
    assert lengths == [r for r in (4, 1, 2, 3) for _ in range(3)]  # the target first, one untimed call each
    assert len(padding.pad_to) == 3 and all(p in (r, 4) for r, p in enumerate(padding.pad_to, start=1))
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        forward_row_padding(forward, repeats=0)
    assert isinstance(padding, RowPadding)
