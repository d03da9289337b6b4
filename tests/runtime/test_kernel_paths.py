"""``runtime/kernel_paths.py``: kernel tables from fake measurements, and every selectable path
computing F.linear's numbers.

Tables: the fastest selectable path per (shape, rows) wins, equal neighbours merge into ranges,
the last range is open-ended, unselectable paths and failed measurements never win, a thread
filter, a JSON round trip. Runtime: ``PackedLinear`` follows the table's packed row ranges, and
``CausalLM.pack_linears(table.packed_rows)`` keeps the model's logits.
"""

import dataclasses
import json
import math

import pytest
import torch
import torch.nn.functional as F

from sglang_hsd.runtime.kernel_paths import (
    PATH_MKL,
    PATH_PACKED,
    RUNTIME_PATHS,
    KernelChoice,
    KernelTable,
    MeasureConfig,
    Measurement,
    linear_shapes,
    measure,
    measure_table,
    median_ms,
)
from sglang_hsd.runtime.config import parse_levels
from sglang_hsd.runtime.engine import SpeculativeGenerator
from sglang_hsd.sampling import SamplingParams
from sglang_hsd.runtime.layers import PackedLinear, PackedRows, packed_linear_supported
from sglang_hsd.runtime.model import CausalLM
from sglang_hsd.runtime.testing import greedy_reference, tiny_llama, tiny_qwen2
from tests.runtime.test_packed_linear import ATOL, _ran_packed_kernel

needs_onednn = pytest.mark.skipif(not packed_linear_supported(torch.nn.Linear(2, 2)),
                                  reason="torch built without oneDNN linear ops")


def _fake(shape, costs, threads=1):
    """Measurements from {path: [ms for rows 1, 2, ...]}."""
    return [Measurement(*shape, rows=i + 1, path=path, threads=threads, ms=ms)
            for path, per_rows in costs.items() for i, ms in enumerate(per_rows)]


def test_table_picks_the_fastest_selectable_path_and_merges_ranges():
    ms = _fake((64, 96), {PATH_MKL: [1.0, 2.0, 3.0, 4.0, 3.0], PATH_PACKED: [1.1, 1.5, 1.6, 1.7, 3.5],
                          "inductor": [0.1, 0.1, 0.1, 0.1, 0.1]})
    table = KernelTable.from_measurements(ms)
    assert table.choices == (
        KernelChoice(64, 96, 1, 1, PATH_MKL, 1),
        KernelChoice(64, 96, 2, 4, PATH_PACKED, 1),
        KernelChoice(64, 96, 5, None, PATH_MKL, 1),
    )
    assert table.choose(64, 96, 3).path == PATH_PACKED
    assert table.choose(64, 96, 40).path == PATH_MKL  # beyond the measured rows: the last choice
    assert table.choose(96, 64, 3) is None
    assert table.packed_rows(64, 96) == PackedRows(((2, 4),))
    assert table.packed_rows(8, 8) == PackedRows()  # unmeasured shape: the default ranges
    # Reported paths win when asked for explicitly.
    assert KernelTable.from_measurements(ms, paths=["inductor", PATH_MKL]).choices == (
        KernelChoice(64, 96, 1, None, "inductor", 1),)


def test_table_skips_failures_filters_threads_and_keeps_shapes_apart():
    ms = (_fake((64, 96), {PATH_MKL: [1.0, 4.0], PATH_PACKED: [2.0, 1.0]}, threads=1)
          + _fake((64, 96), {PATH_MKL: [0.5, 3.0], PATH_PACKED: [0.9, 0.6]}, threads=2)
          + _fake((32, 16), {PATH_MKL: [1.0, 1.0]})
          + [Measurement(32, 16, 2, PATH_PACKED, 1, float("nan"), error="RuntimeError: no")])
    any_threads = KernelTable.from_measurements(ms)
    assert [(c.min_rows, c.path, c.threads) for c in any_threads.choices if c.in_features == 64] == [
        (1, PATH_MKL, 2), (2, PATH_PACKED, 2)]
    one = KernelTable.from_measurements(ms, threads=1)
    assert one.choose(64, 96, 2) == KernelChoice(64, 96, 2, None, PATH_PACKED, 1)
    assert one.choose(32, 16, 2).path == PATH_MKL
    assert one.packed_rows(32, 16) == PackedRows(())  # measured, never packed


def test_table_reads_a_bench_linear_json(tmp_path):
    ms = _fake((64, 96), {PATH_MKL: [1.0, 4.0], PATH_PACKED: [2.0, 1.0]})
    path = tmp_path / "linear.json"
    path.write_text(json.dumps({"measurements": [m.__dict__ for m in ms], "run": {}}))
    assert KernelTable.from_json(path) == KernelTable.from_measurements(ms)
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="measurements"):
        KernelTable.from_json(tmp_path / "bad.json")


def test_packed_rows_validate_and_contain():
    rows = PackedRows(((2, 4), (9, None)))
    assert [r for r in range(1, 12) if r in rows] == [2, 3, 4, 9, 10, 11]
    with pytest.raises(ValueError, match="ranges"):
        PackedRows(((3, 2),))
    with pytest.raises(ValueError, match="packed_rows"):
        PackedLinear(torch.nn.Linear(4, 4), packed_rows=(2, None))


@needs_onednn
def test_every_selectable_path_computes_f_linear():
    got = measure([(64, 96), (40, 24)], MeasureConfig(rows=(1, 2, 3, 7), threads=(1,), repeats=1, warmup=0, flush_mb=0))
    assert {m.path for m in got} == set(RUNTIME_PATHS) and len(got) == 2 * 4 * len(RUNTIME_PATHS)
    for m in got:
        assert m.error is None and m.ms > 0 and m.max_abs_diff < ATOL, m
    assert all(m.max_abs_diff == 0.0 for m in got if m.path == PATH_MKL)


def test_measure_records_a_failing_path_and_restores_threads():
    def broken(state, rows, threads):
        raise RuntimeError("cannot compile")

    from sglang_hsd.runtime.kernel_paths import LinearPath

    paths = {PATH_MKL: RUNTIME_PATHS[PATH_MKL], "broken": LinearPath("broken", lambda lin: lin, broken, False)}
    before = torch.get_num_threads()
    got = measure([(8, 8)], MeasureConfig(rows=(2,), threads=(1,), repeats=1, warmup=0, flush_mb=1), paths)
    assert torch.get_num_threads() == before
    failed = [m for m in got if m.path == "broken"][0]
    assert math.isnan(failed.ms) and failed.error == "RuntimeError: cannot compile"
    assert KernelTable.from_measurements(got, paths=["broken", PATH_MKL]).choose(8, 8, 2).path == PATH_MKL
    with pytest.raises(ValueError, match="repeats"):
        median_ms(torch.nn.Identity(), torch.zeros(1), repeats=0)


@needs_onednn
def test_packed_linear_follows_the_table_ranges():
    table = KernelTable.from_measurements(_fake((16, 32), {PATH_MKL: [1, 1, 9, 9, 1], PATH_PACKED: [2, 2, 1, 1, 2]}))
    linear = torch.nn.Linear(16, 32)
    packed = PackedLinear(linear, table.packed_rows(16, 32))
    for rows in range(1, 8):
        x = torch.randn(1, rows, 16)
        assert _ran_packed_kernel(lambda: packed(x)) == (rows in (3, 4)), rows
        assert (packed(x) - F.linear(x, linear.weight, linear.bias)).abs().max() < ATOL


@needs_onednn
def test_model_packed_from_a_table_keeps_its_logits():
    model = CausalLM.from_hf(tiny_qwen2())  # qkv bias, tied embeddings
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(0))
    plain = model(ids, model.new_cache(2, 16))
    shapes = {(s.in_features, s.out_features) for s in (model.lm_head, *(getattr(layer.mlp, n) for layer in model.layers
                                                                      for n in ("gate_proj", "down_proj")))}
    never = (model.lm_head.in_features, model.lm_head.out_features)
    ms = [m for shape in shapes for m in _fake(shape, {PATH_MKL: [1, 3, 3], PATH_PACKED: [2, 1, 1]})
          if not (shape == never and m.path == PATH_PACKED)]
    assert model.pack_linears(KernelTable.from_measurements(ms).packed_rows)
    assert not isinstance(model.lm_head, PackedLinear)  # its shape never wins packed: no copy
    down = model.layers[0].mlp.down_proj
    assert isinstance(down, PackedLinear) and down.packed_rows == PackedRows(((2, None),))
    assert isinstance(model.layers[0].attn.q_proj, PackedLinear)  # not in the table: the default
    assert _ran_packed_kernel(lambda: model(ids, model.new_cache(2, 16)))
    assert (model(ids, model.new_cache(2, 16)) - plain).abs().max() < ATOL


@needs_onednn
def test_in_process_table_drives_the_generator_without_changing_its_output():
    target = CausalLM.from_hf(tiny_llama(vocab_size=48, num_layers=4, hidden_size=32, seed=7))
    drafter = CausalLM.from_hf(tiny_llama(vocab_size=48, num_layers=2, hidden_size=32, seed=8))
    expected = greedy_reference(target, [1, 2, 3, 4], 10)
    table = measure_table(target, MeasureConfig(rows=(1, 2, 3, 4), repeats=1, warmup=0, flush_mb=0))
    assert {(c.in_features, c.out_features) for c in table.choices} == set(linear_shapes(target))
    assert all(c.threads == torch.get_num_threads() and c.path in RUNTIME_PATHS for c in table.choices)
    gen = SpeculativeGenerator(target, parse_levels("model:tiny,target", buffers=[3]), drafter=drafter,
                               pack_linears=True, packed_rows=table.packed_rows)
    for module in target.modules():
        if isinstance(module, PackedLinear):
            assert module.packed_rows == table.packed_rows(module.in_features, module.out_features)
    result = gen.generate([[1, 2, 3, 4]], SamplingParams(temperature=0.0), max_new_tokens=10)
    assert result.tokens[0] == expected


@needs_onednn
def test_single_row_split_packs_single_rows_only_where_packed_measured_faster(monkeypatch):
    from sglang_hsd.runtime import kernel_paths

    model = CausalLM.from_hf(tiny_qwen2())
    lm_head = (model.lm_head.in_features, model.lm_head.out_features)
    # Fake timings: packed wins one row for the LM head's shape only.
    calls = []

    def fake_measure(shapes, config, paths=RUNTIME_PATHS):
        assert config.rows == (1,)
        calls.append(config)
        threads = torch.get_num_threads()
        return [m for shape in shapes
                for m in _fake(shape, {PATH_MKL: [1], PATH_PACKED: [0.5 if shape == lm_head else 2]}, threads)]

    monkeypatch.setattr(kernel_paths, "measure", fake_measure)
    split = kernel_paths.single_row_split(model)
    assert not calls  # measured on the first lookup only: nothing to pack, nothing timed
    assert split(*lm_head) == PackedRows(((1, None),))
    down = model.layers[0].mlp.down_proj
    assert split(down.in_features, down.out_features) == PackedRows()  # 2 rows and up, as without a table
    assert len(calls) == 1
    assert model.packed_single_row_shapes() == []
    assert model.pack_linears(split)
    assert model.packed_single_row_shapes() == [lm_head]  # what benchmarks record per row
    with pytest.raises(ValueError, match="config.rows must be"):
        kernel_paths.single_row_split(model, MeasureConfig(rows=(1, 2)))


def test_measure_keeps_each_entrys_fastest_round():
    """A burst of other work during one round must not decide a choice (``MeasureConfig.rounds``)."""
    import time

    from sglang_hsd.runtime.kernel_paths import LinearPath

    calls_per_round = 3  # warmup 1 + repeats 2

    def bursty(rounds_slow):
        count = [0]

        def bind(linear, rows, threads):
            def fn(x):
                count[0] += 1
                if (count[0] - 1) // (calls_per_round + 1) < rounds_slow:  # + 1: measure's check call
                    time.sleep(0.02)
                return torch.nn.functional.linear(x, linear.weight)
            return fn
        return LinearPath("bursty", lambda lin: lin, bind, False)

    config = MeasureConfig(rows=(1,), threads=(1,), repeats=2, warmup=1, flush_mb=0)
    (once,) = measure([(8, 8)], config, {"bursty": bursty(1)})
    assert once.ms >= 20.0  # one round: the burst is the measurement
    (thrice,) = measure([(8, 8)], dataclasses.replace(config, rounds=3), {"bursty": bursty(1)})
    assert thrice.error is None and thrice.ms < 10.0
    with pytest.raises(ValueError, match="rounds"):
        MeasureConfig(rows=(1,), rounds=0)
