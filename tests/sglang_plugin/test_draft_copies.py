"""``--hsd-draft-precision`` (``sglang_plugin/cpu/draft_copies.py``) without a server: the
setting's checks, which layers get a copy (never one whose weight the target shares), which row
counts take it, and that the patched linear apply reads it."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch import nn

from sglang_hsd.runtime.weight_copies import w8a8_activation_levels
from sglang_hsd.sglang_plugin.cpu import draft_copies
from sglang_hsd.sglang_plugin.cpu.draft_copies import (
    AUTO_BATCH_ROWS, AUTO_CLOSE, COPY_ATTR, DRAFT_PRECISION_ENV, DraftPrecisionConfig, DraftPrecisionError,
    attach_draft_copies)

pytest.importorskip("sglang")
pytestmark = pytest.mark.sglang


class _Layer(nn.Module):
    def __init__(self, method, weight: torch.Tensor):
        super().__init__()
        self.quant_method = method
        self.weight = nn.Parameter(weight, requires_grad=False)


def _models():
    from sglang.srt.layers.quantization.unquant import UnquantizedEmbeddingMethod, UnquantizedLinearMethod

    torch.manual_seed(0)
    target = nn.Module()
    target.lm_head = _Layer(UnquantizedEmbeddingMethod(), torch.randn(64, 32))
    draft = nn.Module()
    draft.qkv = _Layer(UnquantizedLinearMethod(), torch.randn(48, 32))
    draft.down = _Layer(UnquantizedLinearMethod(), torch.randn(32, 40))
    draft.lm_head = target.lm_head  # a head shared with the target keeps float32
    return target, draft


def test_config_reads_the_environment(monkeypatch):
    monkeypatch.delenv(DRAFT_PRECISION_ENV, raising=False)
    assert DraftPrecisionConfig.from_env().precision == "auto"
    monkeypatch.setenv(DRAFT_PRECISION_ENV, "INT4")
    assert DraftPrecisionConfig.from_env().precision == "int4"
    monkeypatch.setenv(DRAFT_PRECISION_ENV, "int3")
    with pytest.raises(DraftPrecisionError, match=r"--hsd-draft-precision \(SGLANG_HSD_DRAFT_PRECISION\).*'int3'"):
        DraftPrecisionConfig.from_env()


def test_int4_copies_the_drafts_own_layers_only():
    target, draft = _models()
    report = attach_draft_copies(draft, target, DraftPrecisionConfig("int4"))
    assert (report.precision, report.layers, report.skipped_shared) == ("int4", 2, 1)
    assert {n for n, m in draft.named_modules() if hasattr(m, COPY_ATTR)} == {"qkv", "down"}
    assert not hasattr(target.lm_head, COPY_ATTR)
    copy = getattr(draft.qkv, COPY_ATTR)
    x = torch.randn(3, 32)
    bias = torch.randn(48)
    exact = x @ draft.qkv.weight.T + bias
    out = copy(x, bias)
    assert out.shape == (3, 48)
    assert (out - exact).abs().max() < 0.1 * exact.abs().max()  # int4: close, not equal
    assert copy(torch.randn(17, 32), None) is None  # int4 serves up to 16 rows
    assert copy(x.to(torch.bfloat16), None) is None


def test_fp32_and_auto_without_float32_layers_keep_float32():
    target, draft = _models()
    assert attach_draft_copies(draft, target, DraftPrecisionConfig("fp32")).layers == 0
    assert not any(hasattr(m, COPY_ATTR) for m in draft.modules())
    empty = nn.Module()
    assert attach_draft_copies(empty, target, DraftPrecisionConfig("auto")).precision == "fp32"
    with pytest.raises(DraftPrecisionError, match="--hsd-draft-precision int8.*float32"):
        attach_draft_copies(empty, target, DraftPrecisionConfig("int8"))


def test_auto_measures_and_reports_every_precision():
    target, draft = _models()
    report = attach_draft_copies(draft, target, DraftPrecisionConfig("auto"))
    assert set(report.measured_ms) == {"fp32", "bf16", "fp16", "int8", "int4", "w8a8"}
    fastest = min(report.measured_ms.values())
    if report.batch_ms:  # the close ones, compared again at a batch's rows
        assert all(report.measured_ms[name] <= AUTO_CLOSE * fastest for name in report.batch_ms)
        assert report.precision == min(report.batch_ms, key=report.batch_ms.__getitem__)
    else:
        assert report.measured_ms[report.precision] == fastest
    assert report.as_dict()["requested"] == "auto"


def test_w8a8_reports_its_activation_bits():
    """8 bits, or 7 where the CPU's integer kernel saturates on 8 (no VNNI); other copies none."""
    target, draft = _models()
    report = attach_draft_copies(draft, target, DraftPrecisionConfig("w8a8"))
    assert report.activation_bits == {255: 8, 127: 7}[w8a8_activation_levels()]
    assert report.as_dict()["activation_bits"] == report.activation_bits
    _, other = _models()
    assert attach_draft_copies(other, target, DraftPrecisionConfig("int8")).activation_bits is None


def test_auto_takes_the_close_copy_that_is_fastest_at_a_batchs_rows(monkeypatch):
    """int4 a hair ahead of w8a8 for one row, twice as slow at 16 rows: w8a8 (the 2-core Xeon's
    case); a clear single-row winner is not measured again."""
    calls = []

    def fake(counts, pack_linears=True, config=None, candidates=None):
        rows = 1 if config is None else config.rows[0]
        calls.append((rows, candidates))
        if rows == 1:
            return "int4", {"fp32": 48.0, "int8": 33.0, "int4": 24.0, "w8a8": 24.2}
        return "fp32", {"fp32": 20.0, "int4": 90.0, "w8a8": 48.0}  # fp32 was not close: not chosen

    monkeypatch.setattr(draft_copies, "fastest_precision_for_shapes", fake)
    precision, single, batch = draft_copies.auto_precision(Counter({(32, 64): 2}))
    assert precision == "w8a8" and batch == {"int4": 90.0, "w8a8": 48.0}
    assert calls == [(1, None), (AUTO_BATCH_ROWS, ("int4", "w8a8"))]

    calls.clear()
    monkeypatch.setattr(draft_copies, "fastest_precision_for_shapes",
                        lambda *a, **k: calls.append(1) or ("int4", {"fp32": 48.0, "int4": 20.0, "w8a8": 24.0}))
    assert draft_copies.auto_precision(Counter({(32, 64): 2})) == ("int4", {"fp32": 48.0, "int4": 20.0, "w8a8": 24.0}, {})
    assert calls == [1]


def test_patched_apply_takes_the_copy_for_its_rows():
    from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod

    from sglang_hsd.sglang_plugin.cpu.linear_path import CpuLinearConfig, install_cpu_linear_path

    install_cpu_linear_path(CpuLinearConfig("mkl"))
    target, draft = _models()
    attach_draft_copies(draft, target, DraftPrecisionConfig("int4"))
    method = draft.qkv.quant_method
    x = torch.randn(2, 32)
    copied = method.apply(draft.qkv, x)
    assert torch.equal(copied, getattr(draft.qkv, COPY_ATTR)(x, None))
    assert not torch.allclose(copied, x @ draft.qkv.weight.T, atol=1e-5)
    many = torch.randn(20, 32)  # beyond the copy's rows: float32
    torch.testing.assert_close(method.apply(draft.qkv, many), many @ draft.qkv.weight.T)
    assert isinstance(method, UnquantizedLinearMethod)


def test_copy_rows_stop_at_the_first_loss():
    from sglang_hsd.sglang_plugin.cpu.draft_copies import choose_copy_rows

    rows = (1, 2, 4, 8, 12, 16)
    float_cost = {1: 1.0, 2: 1.0, 4: 1.0, 8: 1.2, 12: 1.3, 16: 1.5}.__getitem__
    # The copy wins up to 8 rows, loses at 12 and wins again at 16: 16 is not trusted.
    copy_cost = {1: 0.3, 2: 0.4, 4: 0.6, 8: 1.1, 12: 1.6, 16: 1.4}.__getitem__
    assert choose_copy_rows(copy_cost, float_cost, rows) == 8
    assert choose_copy_rows(lambda r: 0.5, float_cost, rows) == 16  # wins everywhere
    assert choose_copy_rows(lambda r: 2.0, float_cost, rows) == 1  # an explicit copy serves one row
    # Ahead at every count and at a prefill's 256 rows: every count (None); behind there: 16.
    bulk_cost = {**dict.fromkeys(rows, 1.0), 256: 40.0}.__getitem__
    assert choose_copy_rows(lambda r: 0.5 if r < 256 else 20.0, bulk_cost, rows, bulk=256) is None
    assert choose_copy_rows(lambda r: 0.5 if r < 256 else 50.0, bulk_cost, rows, bulk=256) == 16
    assert choose_copy_rows(copy_cost, float_cost, rows, bulk=256) == 8  # no bulk check after a loss


def test_a_large_draft_measures_the_rows_its_copy_serves():
    from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod

    from sglang_hsd.sglang_plugin.cpu import draft_copies
    from sglang_hsd.sglang_plugin.cpu.draft_copies import COMPARED_ROWS

    target, draft = _models()
    draft.big = _Layer(UnquantizedLinearMethod(), torch.randn(2048, 2048) * 0.02)  # 16 MiB
    report = attach_draft_copies(draft, target, DraftPrecisionConfig("int4"))
    last = report.copy_rows["layers"]
    rows = getattr(draft.qkv, COPY_ATTR).rows
    # Which counts the copy wins is this machine's measurement; where it wins every count and a
    # prefill's rows too it serves every call, otherwise exactly 1..last rows.
    if last == draft_copies.EVERY_ROW_COUNT:
        assert 1 in rows and 10 ** 4 in rows
    else:
        assert last in COMPARED_ROWS and last in rows and last + 1 not in rows
    assert "lm_head" not in report.copy_rows  # shared with the target: no copy
    small = _models()
    assert attach_draft_copies(small[1], small[0], DraftPrecisionConfig("int4")).copy_rows == {}


def test_a_copy_ahead_at_every_count_serves_prefills_too(monkeypatch):
    """A copy measured ahead of float32 at every compared count and at a prefill's rows serves
    every call (reported as such); one behind at the prefill's rows stops at the last count."""
    from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod

    from sglang_hsd.sglang_plugin.cpu import draft_copies

    target, draft = _models()
    draft.big = _Layer(UnquantizedLinearMethod(), torch.randn(2048, 2048) * 0.02)  # 16 MiB: measured
    for bulk_wins, expected in ((True, draft_copies.EVERY_ROW_COUNT), (False, draft_copies.COMPARED_ROWS[-1])):
        monkeypatch.setattr(draft_copies, "choose_copy_rows",
                            lambda copy_s, float_s, rows, bulk, wins=bulk_wins: None if wins else rows[-1])
        report = attach_draft_copies(draft, target, DraftPrecisionConfig("w8a8"))
        assert report.copy_rows["layers"] == expected
        served = getattr(draft.qkv, COPY_ATTR).rows
        assert (10 ** 4 in served) == bulk_wins and 1 in served
