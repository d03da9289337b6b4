"""``--hsd-cpu-linear`` (``sglang_plugin/cpu/linear_path.py``) without a server: the setting's
checks, which layers get a packed weight, and that the packed product is ``F.linear``'s."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from sglang_hsd.runtime.layers import pack_linear_weight
from sglang_hsd.runtime.row_padding import RowPadding
from sglang_hsd.sglang_plugin.cpu.linear_path import (
    CPU_LINEAR_ENV, PACKED_ATTR, PADDING_ATTR, RELEASED_ATTR, CpuLinearConfig, CpuLinearError, _packed_rows,
    check_model_dtype, install_cpu_linear_path, pack_model, release_unpacked_weights)

pytest.importorskip("sglang")
pytestmark = pytest.mark.sglang


def test_config_reads_the_environment(monkeypatch):
    monkeypatch.delenv(CPU_LINEAR_ENV, raising=False)
    assert CpuLinearConfig.from_env().path == "mkl" and not CpuLinearConfig.from_env().packed
    monkeypatch.setenv(CPU_LINEAR_ENV, "oneDNN-packed")
    assert CpuLinearConfig.from_env().packed
    monkeypatch.setenv(CPU_LINEAR_ENV, "int8")
    with pytest.raises(CpuLinearError, match=r"--hsd-cpu-linear \(SGLANG_HSD_CPU_LINEAR\).*'int8'"):
        CpuLinearConfig.from_env()
    monkeypatch.setenv(CPU_LINEAR_ENV, "onednn-packed")
    assert CpuLinearConfig.from_env().row_padding == "auto"
    monkeypatch.setenv("SGLANG_HSD_CPU_LINEAR_PADDING", "OFF")
    assert CpuLinearConfig.from_env().row_padding == "off"
    monkeypatch.setenv("SGLANG_HSD_CPU_LINEAR_PADDING", "always")
    with pytest.raises(CpuLinearError, match=r"--hsd-cpu-linear-padding .*auto, off, got 'always'"):
        CpuLinearConfig.from_env()


def test_packed_path_refuses_what_it_cannot_run():
    check_model_dtype(torch.float32, "cpu")
    with pytest.raises(CpuLinearError, match=r"--hsd-cpu-linear onednn-packed.*--dtype float32"):
        check_model_dtype(torch.bfloat16, "cpu")
    with pytest.raises(CpuLinearError, match=r"CPU only \(--device cpu\)"):
        check_model_dtype(torch.float32, "cuda")


class _Layer(nn.Module):
    def __init__(self, method, out_features=24, in_features=16, dtype=torch.float32):
        super().__init__()
        self.quant_method = method
        self.weight = nn.Parameter(torch.randn(out_features, in_features, dtype=dtype),
                                   requires_grad=False)


def test_pack_model_packs_unquantized_float32_linears_and_the_lm_head():
    from sglang.srt.layers.quantization.unquant import (
        UnquantizedEmbeddingMethod, UnquantizedLinearMethod)

    model = nn.Module()
    model.qkv = _Layer(UnquantizedLinearMethod())
    model.bf16 = _Layer(UnquantizedLinearMethod(), dtype=torch.bfloat16)
    model.other = _Layer(object())  # another quantization method keeps SGLang's path
    model.embed = _Layer(UnquantizedEmbeddingMethod())  # an embedding that is not the lm_head
    model.lm_head = _Layer(UnquantizedEmbeddingMethod(), out_features=40)
    shapes = {name: m.weight.shape for name, m in model.named_modules() if hasattr(m, "weight")}
    qkv_weight = model.qkv.weight.detach().clone()
    assert pack_model(model) == 2
    packed = {name for name, m in model.named_modules() if hasattr(m, PACKED_ATTR)}
    assert packed == {"qkv", "lm_head"}
    # One padding for every packed layer; layers this small stay in the cache, so none is
    # measured and nothing is padded (two servers of one tiny model run the same kernels).
    assert model.qkv.__dict__[PADDING_ATTR] is model.lm_head.__dict__[PADDING_ATTR]
    assert model.qkv.__dict__[PADDING_ATTR] == RowPadding()
    # The packed linear layer's float32 weight is released (shape kept, reads NaN); the LM head
    # (possibly the embedding table) and every unpacked layer keep theirs.
    released = {name for name, m in model.named_modules() if getattr(m, RELEASED_ATTR, False)}
    assert released == {"qkv"}
    assert model.qkv.weight.isnan().all() and model.qkv.weight.untyped_storage().nbytes() == 4
    assert {name: m.weight.shape for name, m in model.named_modules() if hasattr(m, "weight")} == shapes
    assert not model.lm_head.weight.isnan().any() and not model.other.weight.isnan().any()
    x = torch.randn(3, 16)
    torch.testing.assert_close(_packed_rows(x, getattr(model.qkv, PACKED_ATTR), None),
                               F.linear(x, qkv_weight), atol=1e-5, rtol=1e-5)
    assert release_unpacked_weights(model) == 0  # idempotent


def test_a_released_layer_refuses_an_input_the_packed_kernel_does_not_take():
    from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod

    install_cpu_linear_path(CpuLinearConfig("mkl"))  # the layer kernels only: packing is by hand here
    model = nn.Module()
    model.qkv = _Layer(UnquantizedLinearMethod())
    pack_model(model)
    method = model.qkv.quant_method
    x = torch.randn(2, 16)
    torch.testing.assert_close(method.apply(model.qkv, x),
                               _packed_rows(x, getattr(model.qkv, PACKED_ATTR), None))
    with pytest.raises(RuntimeError, match="hsd-cpu-linear onednn-packed.*released.*bfloat16"):
        method.apply(model.qkv, x.to(torch.bfloat16))
    kept = nn.Module()
    kept.qkv = _Layer(UnquantizedLinearMethod())
    pack_model(kept, release=False, row_padding="off")  # a draft model's, until its copies exist
    assert not getattr(kept.qkv, RELEASED_ATTR, False) and not kept.qkv.weight.isnan().any()
    assert getattr(kept.qkv, PADDING_ATTR) == RowPadding()


@pytest.mark.parametrize("padding", [RowPadding(), RowPadding((4, 4, 4))])
@pytest.mark.parametrize("shape", [(1, 16), (5, 16), (2, 3, 16), (3, 16)])
def test_packed_product_is_f_linear(shape, padding):
    gen = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(24, 16, generator=gen), torch.randn(24, generator=gen)
    x = torch.randn(*shape, generator=gen)
    out = _packed_rows(x, pack_linear_weight(weight), bias, padding)
    assert out.shape == (*shape[:-1], 24)
    torch.testing.assert_close(out, F.linear(x, weight, bias), atol=1e-5, rtol=1e-5)
    # A wrong weight is caught by the same comparison.
    wrong = _packed_rows(x, pack_linear_weight(weight.roll(1, 0)), bias)
    assert (wrong - F.linear(x, weight, bias)).abs().max() > 1e-2


def test_only_logit_rows_computes_the_kept_rows_of_the_lm_head():
    from sglang.srt.layers.logits_processor import LogitsProcessor
    from sglang.srt.layers.quantization.unquant import UnquantizedEmbeddingMethod

    from sglang_hsd.sglang_plugin.cpu.linear_path import LOGIT_ROWS_ATTR, LogitRows, only_logit_rows

    install_cpu_linear_path(CpuLinearConfig("mkl"))
    model = nn.Module()
    model.lm_head = _Layer(UnquantizedEmbeddingMethod(), out_features=40)
    pack_model(model, release=False, row_padding="off")
    compute = LogitsProcessor._compute_lm_head
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(12, 16, generator=gen)
    full = compute(None, hidden, model.lm_head)
    index = torch.tensor([2, 3, 7, 11])  # one row per request of a window of 3
    with only_logit_rows(model.lm_head, LogitRows(index, 12)):
        kept = compute(None, hidden, model.lm_head)
        other = compute(None, hidden[:5], model.lm_head)  # another call's size: every row
    assert kept.shape == full.shape
    torch.testing.assert_close(kept[index], full[index], atol=1e-6, rtol=1e-6)
    dropped = torch.ones(12, dtype=torch.bool)
    dropped[index] = False
    assert kept[dropped].abs().max() == 0
    torch.testing.assert_close(other, full[:5], atol=1e-6, rtol=1e-6)
    assert not hasattr(model.lm_head, LOGIT_ROWS_ATTR)  # the selection ends with the block
    torch.testing.assert_close(compute(None, hidden, model.lm_head), full)
