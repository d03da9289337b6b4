"""A separate drafter's projections on a reduced-precision weight copy (bf16, fp16, int8, int4, w8a8).

Each copy computes the product of its own stored weights (checked against an explicit
dequantization), differs from fp32 (it really is the copy) and stays close to it; int4 pads shapes
the kernel cannot take. The copy changes the drafter's numbers, never the output law: greedy
output equals the target's, and the 3-token sampled law matches the target's exactly (chi-square)
with every drafter call on the copy, while the same test rejects the copy-drafter's own law.
Also: which rows take the copy, the fp16 overflow fallback, composition with oneDNN packing, and
bad input.
"""

import pytest
import torch
import torch.nn.functional as F

from sglang_hsd.runtime.config import parse_levels
from sglang_hsd.runtime.engine import SpeculativeGenerator
from sglang_hsd.runtime.layers import CopyRowsLinear, PackedLinear, PackedRows, packed_linear_supported
from sglang_hsd.runtime.model import CausalLM
from sglang_hsd.runtime.testing import greedy_reference, tiny_llama
from sglang_hsd.runtime.weight_copies import (
    COPY_MIXES,
    INT4_GROUP_SIZE,
    WEIGHT_COPIES,
    Int8Copy,
    W8A8Copy,
    build_weight_copy,
    single_row_copy,
    w8a8_activation_levels,
)
from sglang_hsd.sampling import SamplingParams
from sglang_hsd.verify.oracles.stats import chi_square_p_value
from tests.runtime.helpers import PROMPTS, exact_target_prefix_probs, sharpen_lm_head

pytest.importorskip("transformers")

KINDS = list(WEIGHT_COPIES)
# Largest |copy - fp32| on the products below (|w| <= 1/sqrt(in), x ~ N(0, 1)): the rounding of
# each kind's weights (bf16's 8-bit mantissa, int4's 16 levels per group) and bf16 activations.
CLOSE_TO_FP32 = {"bf16": 3e-2, "fp16": 3e-2, "int8": 5e-2, "int4": 0.25, "w8a8": 5e-2}


def _drafter(vocab=48, seed=2):
    return CausalLM.from_hf(sharpen_lm_head(tiny_llama(vocab_size=vocab, num_layers=2, hidden_size=32, seed=seed), 4.0))


def _dequantized(copy) -> torch.Tensor:
    """The fp32 weight ``[out, in]`` an int8 / int4 copy stands for, rebuilt from its own fields."""
    if isinstance(copy, Int8Copy):
        return (copy.weight.float() * copy.scale.float()[:, None])[:copy.out_features, :copy.in_features]
    if isinstance(copy, W8A8Copy):
        return copy.stored_weight()
    eye = torch.eye(copy.in_features)  # the product with the identity reads the weight back out
    return copy(eye).T - (0 if copy.bias is None else copy.bias[:, None])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bias", [True, False])
def test_one_row_reads_the_copy_other_rows_the_fp32_weights(kind, bias):
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48, bias=bias)
    wrapped = CopyRowsLinear(linear, kind)
    one = torch.randn(1, 1, 64)
    out = wrapped(one)
    assert out.dtype == torch.float32 and out.shape == (1, 1, 48)
    assert torch.equal(out, wrapped.copy(one.view(1, 64)).view(1, 1, 48))
    assert not torch.equal(out, linear(one))  # really the copy: fp32 differs
    assert torch.allclose(out, linear(one), atol=CLOSE_TO_FP32[kind])
    many = torch.randn(4, 10, 64)  # 40 rows: beyond every bounded kind's default rows
    first, last = WEIGHT_COPIES[kind].rows
    if last is None:  # a kind that serves every row count
        assert torch.equal(wrapped(many), wrapped.copy(many.view(40, 64)).view(4, 10, 48))
        assert 10 ** 6 in wrapped.rows and first == 1
    else:
        assert torch.equal(wrapped(many), linear(many))
        assert 1 in wrapped.rows and last + 1 not in wrapped.rows and first == 1
    assert wrapped.weight is linear.weight and wrapped.bias is linear.bias


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_integer_copies_compute_the_product_of_their_stored_weights(kind):
    torch.manual_seed(1)
    weight, bias, x = torch.randn(32, 96) / 10, torch.randn(32), torch.randn(3, 96)
    copy = build_weight_copy(kind, weight, bias)
    stored = _dequantized(copy)
    # bf16 activations: the reference rounds x the same way.
    expected = x.to(torch.bfloat16).float() @ stored.T + bias
    assert torch.allclose(copy(x), expected, atol=2e-2)
    step = weight.abs().amax(1, keepdim=True) / 127 if kind == "int8" else (
        weight.view(32, -1, INT4_GROUP_SIZE).amax(-1) - weight.view(32, -1, INT4_GROUP_SIZE).amin(-1)
    ).repeat_interleave(INT4_GROUP_SIZE, 1) / 15
    # Each weight within half a quantization step (plus the bf16 rounding of scales).
    assert ((stored - weight).abs() <= 0.5 * step * 1.02 + 3e-3).all()


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("shape", [(6, 40), (32, 72)])  # (out, in): out % 16 != 0, in % 32 != 0
def test_integer_copies_pad_shapes_their_kernels_cannot_take(kind, shape):
    # torch's int8 kernel crashed the process on in_features = 72 with 18000 rows unpadded.
    torch.manual_seed(2)
    weight, x = torch.randn(*shape) / shape[1] ** 0.5, torch.randn(18000, shape[1])
    copy = build_weight_copy(kind, weight)
    out = copy(x)
    assert out.shape == (18000, shape[0])
    assert torch.allclose(out[:3], x[:3] @ weight.T, atol=CLOSE_TO_FP32[kind])
    assert torch.allclose(out, x.to(torch.bfloat16).float() @ _dequantized(copy).T, atol=2e-2, rtol=1e-2)


def test_w8a8_quantizes_activations_per_row():
    """Each row's product is within half an 8-bit step of that row's own range times the row's
    weights (per output) of ``x @ stored.T``: a row a hundred times smaller than another is
    quantized as finely. The wrong variant, one quantization over the whole call (the kernel's own,
    without the per-row scaling), puts the small rows' every entry on a step set by the large row
    and fails the same bound."""
    torch.manual_seed(3)
    weight, bias = torch.randn(24, 96) / 10, torch.randn(24)
    copy = build_weight_copy("w8a8", weight, bias)
    stored = copy.stored_weight()
    assert ((stored - weight).abs() <= 0.5 * weight.abs().amax(1, keepdim=True) / 127 * 1.001).all()
    x = torch.randn(5, 96) * torch.tensor([[100.0], [1.0], [0.01], [1.0], [3.0]])

    def within_row_steps(out):
        # The row scaled to [-1, 1] on the kernel's levels: 8 bits, 7 where 8 would saturate.
        step = 2 * x.abs().amax(1, keepdim=True) / copy.activation_levels
        bound = 0.5 * step * stored.abs().sum(1) * 1.01 + 1e-6
        return ((out - (x @ stored.T + bias)).abs() <= bound).all()

    assert within_row_steps(copy(x))
    whole_call = torch.ops.quantized.linear_dynamic(x, copy.packed, copy.reduce_range) + bias
    assert not within_row_steps(whole_call)
    assert torch.equal(copy(x[1:2]), torch.ops.quantized.linear_dynamic(x[1:2], copy.packed, copy.reduce_range) + bias)
    for shape in ((6, 40), (32, 72)):  # in_features not a multiple of 32, out of 16
        w, many = torch.randn(*shape) / shape[1] ** 0.5, torch.randn(2000, shape[1])
        # 7-bit activations (a CPU without VNNI) take steps twice as large.
        atol = CLOSE_TO_FP32["w8a8"] * 255 / copy.activation_levels
        assert torch.allclose(build_weight_copy("w8a8", w)(many), many @ w.T, atol=atol)


def test_w8a8_activations_never_saturate_the_kernel():
    """Large activations against large weights: every 16-bit pair sum of a kernel without VNNI
    would saturate on 8-bit activations (the probe's case, at scale). The copy stays within its
    quantization error; the wrong variant, 8 bits on a CPU whose probe found saturation, lands
    far off (about half), so on such a CPU the same bound rejects it."""
    weight = torch.ones(16, 256) + 0.01 * torch.randn(16, 256)
    x = torch.ones(3, 256) + 0.01 * torch.randn(3, 256)
    copy = build_weight_copy("w8a8", weight)
    exact = x @ weight.T
    assert torch.allclose(copy(x), exact, rtol=0.02)
    assert copy.activation_levels in (127, 255) and copy.reduce_range == (copy.activation_levels == 127)
    eight_bits = torch.ops.quantized.linear_dynamic(x[:1], copy.packed, False)
    assert torch.allclose(eight_bits, exact[:1], rtol=0.02) == (w8a8_activation_levels() == 255)


def test_fp16_overflow_is_recomputed_in_fp32():
    linear = torch.nn.Linear(4, 2, bias=False)
    with torch.no_grad():
        linear.weight.fill_(300.0)
    x = torch.full((1, 4), 100.0)  # 4 * 300 * 100 = 120000 > fp16's 65504
    assert torch.equal(CopyRowsLinear(linear, "fp16")(x), linear(x))
    assert torch.isfinite(CopyRowsLinear(linear, "bf16")(x)).all()  # bf16 has fp32's range


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="kind must be one of bf16, fp16, int8, int4, w8a8, got 'fp8'"):
        CopyRowsLinear(torch.nn.Linear(4, 4), "fp8")
    with pytest.raises(ValueError, match="inner must be a CPU float32 linear"):
        CopyRowsLinear(torch.nn.Linear(4, 4).double(), "bf16")
    with pytest.raises(ValueError, match="weight must be a 2-D CPU float32 tensor"):
        build_weight_copy("int4", torch.zeros(4, 4, 4))
    with pytest.raises(ValueError, match=r"bias must have shape \(4,\)"):
        build_weight_copy("int8", torch.zeros(4, 8), torch.zeros(8))


@pytest.mark.skipif(not packed_linear_supported(torch.nn.Linear(2, 2)), reason="torch built without oneDNN")
@pytest.mark.parametrize("kind", ["bf16", "int4"])
def test_composes_with_packing_in_either_order(kind):
    torch.manual_seed(0)
    reference = _drafter()
    ids = torch.tensor([[3, 9, 4, 1] * 5])  # 20 rows: beyond every kind's default rows, so fp32 or packed
    expected_many = reference.forward(ids, reference.new_cache(1, 24))
    for order in ("pack first", "copy first"):
        model = _drafter()
        if order == "pack first":
            model.pack_linears()
            model.set_weight_copy(kind)
        else:
            model.set_weight_copy(kind)
            model.pack_linears()
        q_proj = model.layers[0].attn.q_proj
        assert isinstance(q_proj, CopyRowsLinear) and isinstance(q_proj.inner, PackedLinear), order
        assert torch.allclose(model.forward(ids, model.new_cache(1, 24)), expected_many, atol=1e-5), order
        model.unpack_linears()
        assert isinstance(model.layers[0].attn.q_proj.inner, torch.nn.Linear), order
        model.set_weight_copy(None)
        assert type(model.layers[0].attn.q_proj) is torch.nn.Linear and type(model.lm_head) is torch.nn.Linear


@pytest.mark.parametrize("precision", KINDS)
def test_greedy_output_equals_target_with_a_copy_drafter(target, precision, monkeypatch):
    calls = []
    copy_call = CopyRowsLinear.forward
    monkeypatch.setattr(CopyRowsLinear, "forward", lambda self, x: calls.append(self.kind) or copy_call(self, x))
    drafter = _drafter()
    gen = SpeculativeGenerator(target, parse_levels("model:tiny,target", buffers=[4]), drafter=drafter,
                               validate=True, drafter_precision=precision)
    for prompt in PROMPTS[:3]:  # batch 1: the drafting steps are single rows
        result = gen.generate([prompt], SamplingParams(temperature=0.0), max_new_tokens=10)
        assert result.tokens[0] == greedy_reference(target, prompt, 10)
    assert set(calls) == {precision}  # drafting steps read the copy
    gen32 = SpeculativeGenerator(target, parse_levels("model:tiny,target", buffers=[4]), drafter=drafter)
    assert type(drafter.lm_head) is torch.nn.Linear  # the engine set the drafter back to fp32
    assert gen32.drafter is drafter


@pytest.mark.statistical
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("method", ["hsd", "tokenwise"])
def test_sampled_law_with_every_drafter_call_on_the_copy(kind, method):
    vocab, length, runs = 6, 3, 6000
    model = CausalLM.from_hf(sharpen_lm_head(tiny_llama(vocab_size=vocab, num_layers=4, hidden_size=32, seed=5), 3.0))
    drafter = _drafter(vocab=vocab, seed=7)
    gen = SpeculativeGenerator(model, parse_levels("model:tiny,target", buffers=[2], methods=[method]),
                               drafter=drafter, validate=True)
    drafter.set_weight_copy(kind, PackedRows(((1, None),)))  # a batch of 6000: every call on the copy
    params = SamplingParams(temperature=1.0)
    prompt = [1, 4, 2]
    result = gen.generate([prompt] * runs, params, max_new_tokens=length, seed=0)
    codes = torch.tensor([t[0] * vocab * vocab + t[1] * vocab + t[2] for t in result.tokens])
    target_law = exact_target_prefix_probs(model, prompt, length, params)
    assert chi_square_p_value(torch.bincount(codes, minlength=vocab**length), target_law) > 1e-4
    assert result.levels[-1].accepted > 0
    # The same test rejects the copy-drafter's own law (what skipping verification would emit).
    draft_law = exact_target_prefix_probs(drafter, prompt, length, params)
    draws = torch.multinomial(draft_law, runs, replacement=True, generator=torch.Generator().manual_seed(1))
    assert chi_square_p_value(torch.bincount(draws, minlength=vocab**length), target_law) < 1e-4


def test_refused_without_a_separate_drafter_and_for_unknown_names(target):
    with pytest.raises(ValueError, match="drafter_precision='int4' needs a separate draft model"):
        SpeculativeGenerator(target, parse_levels("exit:2,target"), drafter_precision="int4")
    with pytest.raises(ValueError, match="drafter_precision must be one of fp32, bf16, fp16, int8, int4, w8a8, "
                       "int4\\+w8a8, got 'int2'"):
        SpeculativeGenerator(target, parse_levels("model:tiny,target"), drafter=_drafter(), drafter_precision="int2")


@pytest.mark.skipif(not packed_linear_supported(torch.nn.Linear(2, 2)), reason="torch built without oneDNN")
def test_a_mix_serves_each_row_count_from_its_part(monkeypatch):
    """``int4+w8a8``: 1-3 rows from the int4 copy, 4 rows and more (here 5 and 20) from the w8a8
    copy, each call's numbers those of a model with only that part's copy; composes with packing;
    None takes every wrapper off."""
    calls = []
    copy_call = CopyRowsLinear.forward

    def counted(self, x):
        if x.reshape(-1, self.in_features).shape[0] in self.rows:
            calls.append(self.kind)
        return copy_call(self, x)

    monkeypatch.setattr(CopyRowsLinear, "forward", counted)
    (first, _), (second, _) = COPY_MIXES["int4+w8a8"]
    assert (first, second) == ("int4", "w8a8") and single_row_copy("int4+w8a8") == "int4" == single_row_copy("int4")
    torch.manual_seed(0)
    ids = torch.tensor([[3, 9, 4, 1] * 5])
    for rows, kind in ((1, "int4"), (3, "int4"), (4, "w8a8"), (5, "w8a8"), (20, "w8a8")):
        alone = _drafter()
        alone.set_weight_copy(kind, PackedRows(((1, None),)))
        expected = alone.forward(ids[:, :rows], alone.new_cache(1, 24))
        mixed = _drafter()
        mixed.pack_linears()
        mixed.set_weight_copy("int4+w8a8")
        calls.clear()
        assert torch.allclose(mixed.forward(ids[:, :rows], mixed.new_cache(1, 24)), expected, atol=1e-5), rows
        assert set(calls) == {kind}, rows
    q_proj = mixed.layers[0].attn.q_proj
    assert q_proj.kind == "int4" and q_proj.inner.kind == "w8a8" and isinstance(q_proj.inner.inner, PackedLinear)
    mixed.unpack_linears()
    assert type(mixed.layers[0].attn.q_proj.inner.inner) is torch.nn.Linear
    mixed.set_weight_copy(None)
    assert type(mixed.layers[0].attn.q_proj) is torch.nn.Linear and type(mixed.lm_head) is torch.nn.Linear
    with pytest.raises(ValueError, match="rows: the mix 'int4\\+w8a8' names its parts' rows itself"):
        mixed.set_weight_copy("int4+w8a8", PackedRows(((1, None),)))


def test_a_mix_drafter_below_a_lookup_keeps_greedy_output(target, monkeypatch):
    """The small model checks a lookup's copies in multi-row calls (w8a8) and drafts single rows
    (int4): both parts run, and greedy output is the target's."""
    calls = []
    copy_call = CopyRowsLinear.forward
    monkeypatch.setattr(CopyRowsLinear, "forward", lambda self, x: calls.append(self.kind) or copy_call(self, x))
    gen = SpeculativeGenerator(target, parse_levels("lookup:2,model:tiny,target", buffers=[4, 5]), drafter=_drafter(),
                               validate=True, drafter_precision="int4+w8a8")
    prompts = [[3, 9, 4, 3, 9, 4, 3, 9], [7, 1, 7, 1, 7]]
    result = gen.generate(prompts, SamplingParams(temperature=0.0), max_new_tokens=12)
    for prompt, out in zip(prompts, result.tokens):
        assert out == greedy_reference(target, prompt, 12)
    assert {"int4", "w8a8"} <= set(calls) and result.levels[0].proposed > 0

