"""A separate drafter's single-row projections on a bf16 / fp16 weight copy (HalfRowsLinear).

The copy changes the drafter's numbers, never the output law: greedy output equals the target's,
and the 3-token sampled law matches the target's exactly (chi-square) with every drafter call on
the copy. Also: which rows take the copy, the fp16 overflow fallback, composition with oneDNN
packing, and bad input.
"""

import pytest
import torch
import torch.nn.functional as F

from sglang_hsd.runtime.config import parse_levels
from sglang_hsd.runtime.engine import SpeculativeGenerator
from sglang_hsd.runtime.layers import HalfRowsLinear, PackedLinear, PackedRows, packed_linear_supported
from sglang_hsd.runtime.model import CausalLM
from sglang_hsd.runtime.testing import greedy_reference, tiny_llama
from sglang_hsd.sampling import SamplingParams
from sglang_hsd.verify.oracles.stats import chi_square_p_value
from tests.runtime.helpers import PROMPTS, exact_target_prefix_probs, sharpen_lm_head

pytest.importorskip("transformers")

HALF = [torch.bfloat16, torch.float16]


def _drafter(vocab=48, seed=2):
    return CausalLM.from_hf(sharpen_lm_head(tiny_llama(vocab_size=vocab, num_layers=2, hidden_size=32, seed=seed), 4.0))


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("bias", [True, False])
def test_one_row_reads_the_copy_other_rows_the_fp32_weights(dtype, bias):
    torch.manual_seed(0)
    linear = torch.nn.Linear(24, 40, bias=bias)
    half = HalfRowsLinear(linear, dtype)
    one = torch.randn(1, 1, 24)
    expected = F.linear(one.to(dtype), linear.weight.to(dtype), None if linear.bias is None else linear.bias.to(dtype))
    out = half(one)
    assert out.dtype == torch.float32 and out.shape == (1, 1, 40)
    assert torch.equal(out, expected.float())
    assert not torch.equal(out, linear(one))  # really the copy: fp32 differs in the low bits
    assert torch.allclose(out, linear(one), atol=3e-2)
    many = torch.randn(3, 5, 24)
    assert torch.equal(half(many), linear(many))
    assert half.weight is linear.weight and half.bias is linear.bias


def test_fp16_overflow_is_recomputed_in_fp32():
    linear = torch.nn.Linear(4, 2, bias=False)
    with torch.no_grad():
        linear.weight.fill_(300.0)
    x = torch.full((1, 4), 100.0)  # 4 * 300 * 100 = 120000 > fp16's 65504
    assert torch.equal(HalfRowsLinear(linear, torch.float16)(x), linear(x))
    assert torch.isfinite(HalfRowsLinear(linear, torch.bfloat16)(x)).all()  # bf16 has fp32's range


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="dtype must be torch.bfloat16 or torch.float16"):
        HalfRowsLinear(torch.nn.Linear(4, 4), torch.float32)
    with pytest.raises(ValueError, match="inner must be a CPU float32 linear"):
        HalfRowsLinear(torch.nn.Linear(4, 4).double(), torch.bfloat16)


@pytest.mark.skipif(not packed_linear_supported(torch.nn.Linear(2, 2)), reason="torch built without oneDNN")
def test_composes_with_packing_in_either_order():
    torch.manual_seed(0)
    reference = _drafter()
    ids = torch.tensor([[3, 9, 4, 1]])
    expected_many = reference.forward(ids, reference.new_cache(1, 8))
    for order in ("pack first", "half first"):
        model = _drafter()
        if order == "pack first":
            model.pack_linears()
            model.set_half_rows(torch.bfloat16)
        else:
            model.set_half_rows(torch.bfloat16)
            model.pack_linears()
        q_proj = model.layers[0].attn.q_proj
        assert isinstance(q_proj, HalfRowsLinear) and isinstance(q_proj.inner, PackedLinear), order
        assert torch.allclose(model.forward(ids, model.new_cache(1, 8)), expected_many, atol=1e-5), order
        model.unpack_linears()
        assert isinstance(model.layers[0].attn.q_proj.inner, torch.nn.Linear), order
        model.set_half_rows(None)
        assert type(model.layers[0].attn.q_proj) is torch.nn.Linear and type(model.lm_head) is torch.nn.Linear


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_greedy_output_equals_target_with_a_half_row_drafter(target, precision, monkeypatch):
    seen = []
    linear = F.linear
    monkeypatch.setattr(F, "linear", lambda x, *a: seen.append(x.dtype) or linear(x, *a))
    drafter = _drafter()
    gen = SpeculativeGenerator(target, parse_levels("model:tiny,target", buffers=[4]), drafter=drafter,
                               validate=True, drafter_precision=precision)
    for prompt in PROMPTS[:3]:  # batch 1: the drafting steps are single rows
        result = gen.generate([prompt], SamplingParams(temperature=0.0), max_new_tokens=10)
        assert result.tokens[0] == greedy_reference(target, prompt, 10)
    assert {"bf16": torch.bfloat16, "fp16": torch.float16}[precision] in seen  # drafting steps read the copy
    gen32 = SpeculativeGenerator(target, parse_levels("model:tiny,target", buffers=[4]), drafter=drafter)
    assert type(drafter.lm_head) is torch.nn.Linear  # the engine set the drafter back to fp32
    assert gen32.drafter is drafter


@pytest.mark.statistical
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("method", ["hsd", "tokenwise"])
def test_sampled_law_with_every_drafter_call_on_the_copy(dtype, method):
    vocab, length, runs = 6, 3, 6000
    model = CausalLM.from_hf(sharpen_lm_head(tiny_llama(vocab_size=vocab, num_layers=4, hidden_size=32, seed=5), 3.0))
    drafter = _drafter(vocab=vocab, seed=7)
    gen = SpeculativeGenerator(model, parse_levels("model:tiny,target", buffers=[2], methods=[method]),
                               drafter=drafter, validate=True)
    drafter.set_half_rows(dtype, PackedRows(((1, None),)))  # a batch of 6000: every call on the copy
    params = SamplingParams(temperature=1.0)
    prompt = [1, 4, 2]
    result = gen.generate([prompt] * runs, params, max_new_tokens=length, seed=0)
    codes = torch.tensor([t[0] * vocab * vocab + t[1] * vocab + t[2] for t in result.tokens])
    counts = torch.bincount(codes, minlength=vocab**length)
    assert chi_square_p_value(counts, exact_target_prefix_probs(model, prompt, length, params)) > 1e-4
    assert result.levels[-1].accepted > 0


def test_refused_without_a_separate_drafter_and_for_unknown_names(target):
    with pytest.raises(ValueError, match="drafter_precision='bf16' needs a separate draft model"):
        SpeculativeGenerator(target, parse_levels("exit:2,target"), drafter_precision="bf16")
    with pytest.raises(ValueError, match="drafter_precision must be one of fp32, bf16, fp16, got 'int8'"):
        SpeculativeGenerator(target, parse_levels("model:tiny,target"), drafter=_drafter(), drafter_precision="int8")
