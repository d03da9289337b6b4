"""``runtime/kernel_setup.py``: configuring a model pair's kernels.

The measured single-row split keeps greedy output; ``"auto"`` picks the drafter's single-row
weight copy by one-row costs summed over its layers (fake timings where the per-shape and the
per-layer choices differ), never a copy that fails to run, and a generator built with it keeps
greedy output.
"""

import math

import pytest
import torch

from sglang_hsd.runtime import kernel_setup
from sglang_hsd.runtime.config import parse_levels
from sglang_hsd.runtime.engine import SpeculativeGenerator
from sglang_hsd.runtime.kernel_paths import PATH_MKL, PATH_PACKED, RUNTIME_PATHS, MeasureConfig, Measurement, measure
from sglang_hsd.runtime.layers import CopyRowsLinear, PackedLinear, PackedRows
from sglang_hsd.runtime.model import CausalLM
from sglang_hsd.runtime.testing import greedy_reference, tiny_llama
from sglang_hsd.sampling import SamplingParams
from tests.runtime.test_kernel_paths import _fake, needs_onednn

pytest.importorskip("transformers")


@needs_onednn
def test_configure_kernels_measures_the_single_row_split_and_keeps_greedy_output():
    target = CausalLM.from_hf(tiny_llama(vocab_size=48, num_layers=4, hidden_size=32, seed=7))
    expected = greedy_reference(target, [1, 2, 3, 4], 10)
    kernel_setup.configure_kernels(target, None, pack_linears=True)
    packed = [m for m in target.modules() if isinstance(m, PackedLinear)]
    assert packed and all(m.packed_rows in (PackedRows(), PackedRows(((1, None),))) for m in packed)
    assert greedy_reference(target, [1, 2, 3, 4], 10) == expected


def _two_shape_model():
    """Three linear layers of shape (4 -> 8) and one of (8 -> 4)."""
    return torch.nn.Sequential(*(torch.nn.Linear(4, 8) for _ in range(3)), torch.nn.Linear(8, 4))


# Per precision path, ms of one row for shapes (4, 8) and (8, 4). Summed over the layers (x3 for
# the first shape) bf16 wins: fp32 4.0, bf16 2.5, fp16 2.7 (int8 8.0, int4 12.0, w8a8 6.0); per
# shape alone fp16 would (1.1).
FAKE_ONE_ROW = {PATH_MKL: (1.0, 1.0), PATH_PACKED: (1.1, 1.2), "bf16": (0.5, 1.0), "fp16": (0.8, 0.3),
                "int8": (2.0, 2.0), "int4": (3.0, 3.0), "w8a8": (1.5, 1.5)}


def test_fastest_drafter_precision_sums_one_row_over_the_layers(monkeypatch):
    seen_paths = []

    def fake_measure(shapes, config, paths=RUNTIME_PATHS):
        assert config.rows == (1,) and config.threads == (torch.get_num_threads(),)
        seen_paths.append(sorted(paths))
        assert sorted(shapes) == [(4, 8), (8, 4)]
        return [m for shape in shapes for m in
                _fake(shape, {p: [FAKE_ONE_ROW[p][shape != (4, 8)]] for p in paths}, torch.get_num_threads())]

    monkeypatch.setattr(kernel_setup, "measure", fake_measure)
    name, totals = kernel_setup.fastest_drafter_precision(_two_shape_model())
    assert name == "bf16"
    assert totals == pytest.approx({"fp32": 4.0, "bf16": 2.5, "fp16": 2.7, "int8": 8.0, "int4": 12.0, "w8a8": 6.0})
    assert seen_paths == [sorted([PATH_MKL, PATH_PACKED, "bf16", "fp16", "int8", "int4", "w8a8"])]
    # Without packing, fp32 single rows run on MKL only.
    kernel_setup.fastest_drafter_precision(_two_shape_model(), pack_linears=False)
    assert seen_paths[-1] == sorted([PATH_MKL, "bf16", "fp16", "int8", "int4", "w8a8"])
    with pytest.raises(ValueError, match="config.rows must hold one row count"):
        kernel_setup.fastest_drafter_precision(_two_shape_model(), config=MeasureConfig(rows=(1, 2)))


def test_a_copy_that_fails_to_run_is_never_the_fastest(monkeypatch):
    def fake_measure(shapes, config, paths=RUNTIME_PATHS):
        out = [m for shape in shapes for m in _fake(shape, {PATH_MKL: [9.0], "bf16": [0.1]})]
        return out + [Measurement(*shape, rows=1, path="fp16", threads=1, ms=float("nan"), error="RuntimeError: no")
                      for shape in shapes]

    monkeypatch.setattr(kernel_setup, "measure", fake_measure)
    name, totals = kernel_setup.fastest_drafter_precision(_two_shape_model(), pack_linears=False)
    assert name == "bf16" and totals["fp16"] == math.inf


def test_the_copy_paths_time_rows_on_the_copy():
    found = measure([(32, 24)], MeasureConfig(rows=(1, 3), repeats=1, warmup=0, flush_mb=0), kernel_setup.COPY_PATHS)
    assert sorted({m.path for m in found}) == ["bf16", "fp16", "int4", "int8", "w8a8"]
    assert all(m.error is None and 0 < m.max_abs_diff < 0.2 for m in found)  # the copy's product, not fp32's
    assert not any(p.selectable for p in kernel_setup.COPY_PATHS.values())


def test_fastest_drafter_precision_measures_only_its_candidates(monkeypatch):
    seen_paths = []

    def fake_measure(shapes, config, paths=RUNTIME_PATHS):
        seen_paths.append(sorted(paths))
        return [m for shape in shapes for m in _fake(shape, {p: [1.0 if p in RUNTIME_PATHS else 0.2] for p in paths},
                                                     torch.get_num_threads())]

    monkeypatch.setattr(kernel_setup, "measure", fake_measure)
    name, totals = kernel_setup.fastest_drafter_precision(_two_shape_model(), candidates=("fp32", "int4"))
    assert name == "int4" and sorted(totals) == ["fp32", "int4"]
    assert seen_paths == [sorted([PATH_MKL, PATH_PACKED, "int4"])]
    with pytest.raises(ValueError, match="candidates must be one of fp32, bf16, fp16, int8, int4, w8a8, got 'int3'"):
        kernel_setup.fastest_drafter_precision(_two_shape_model(), candidates=("fp32", "int3"))
    # One row cannot tell a mix from its single-row part: auto never measures a mix.
    with pytest.raises(ValueError, match="candidates must be one of .*, got 'int4\\+w8a8'"):
        kernel_setup.fastest_drafter_precision(_two_shape_model(), candidates=("fp32", "int4+w8a8"))


def test_configure_kernels_resolves_auto_by_measuring_the_drafter(monkeypatch):
    target = CausalLM.from_hf(tiny_llama(vocab_size=48, num_layers=2, hidden_size=32, seed=7))
    drafter = CausalLM.from_hf(tiny_llama(vocab_size=48, num_layers=2, hidden_size=32, seed=8))
    drafter.set_weight_copy("bf16")  # left over from an earlier generator: measured from fp32
    measured = []

    def fake_fastest(model, pack_linears=True, config=None):
        measured.append((model, pack_linears, type(model.lm_head)))
        return "fp16", {}

    monkeypatch.setattr(kernel_setup, "fastest_drafter_precision", fake_fastest)
    assert kernel_setup.configure_kernels(target, drafter, drafter_precision="auto") == "fp16"
    assert measured == [(drafter, False, torch.nn.Linear)]
    assert isinstance(drafter.lm_head, CopyRowsLinear) and drafter.lm_head.kind == "fp16"
    assert kernel_setup.configure_kernels(target, None, drafter_precision="auto") == "fp32"  # no drafter: fp32
    assert len(measured) == 1
    assert kernel_setup.configure_kernels(target, drafter, drafter_precision="bf16") == "bf16"
    gen = SpeculativeGenerator(target, parse_levels("model:tiny,target", buffers=[3]), drafter=drafter,
                               drafter_precision="auto")
    assert gen.drafter_precision == "fp16" and len(measured) == 2
    prompt = [1, 2, 3, 4]
    assert gen.generate([prompt], SamplingParams(temperature=0.0), 8).tokens[0] == greedy_reference(target, prompt, 8)
