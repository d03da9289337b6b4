"""``cpu/memory.py``: checkpoint sizes from safetensors headers, the memory plan and the
``--mem-fraction-static`` it picks, against SGLang 0.5.23's KV budget rule
(rest = A * fraction - M, where A is the free memory SGLang reads before loading and M the loaded
weights; rest <= 0 is its "Loaded weights leave no GPU memory for the KV cache" error)."""

from __future__ import annotations

import json

import pytest

from sglang_hsd.sglang_plugin.cpu.memory import (
    GIB, RUNTIME_MARGIN, SERVER_BASELINE, CheckpointSize, available_memory, plan_memory,
    read_checkpoint_size)

# The Qwen2.5-Coder pair as ``read_checkpoint_size`` reads the converted float32 folders
# (1.5B target, 0.5B draft; neither ties its lm_head to the embedding).
QWEN_TARGET = CheckpointSize(floating=1_777_088_000, other_bytes=0, packable=1_543_569_408, kv_per_token=14_336)
QWEN_DRAFT = CheckpointSize(floating=630_167_424, other_bytes=0, packable=493_961_216, kv_per_token=6_144)
FLOAT32 = 4


def _checkpoint(folder, tensors: dict, config: dict) -> None:
    safetensors = pytest.importorskip("safetensors.torch")
    folder.mkdir()
    safetensors.save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config))


def test_checkpoint_size_counts_packed_layers_and_kv_from_headers(tmp_path):
    import torch

    config = {"num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "hidden_size": 4}
    tensors = {"model.embed_tokens.weight": torch.zeros(10, 4), "model.layers.0.q_proj.weight": torch.zeros(4, 4),
               "model.norm.weight": torch.zeros(4), "d2t": torch.zeros(10, dtype=torch.int64)}
    _checkpoint(tmp_path / "untied", {**tensors, "lm_head.weight": torch.zeros(10, 4, dtype=torch.bfloat16)}, config)
    untied = read_checkpoint_size(tmp_path / "untied")
    assert untied == CheckpointSize(floating=40 + 16 + 4 + 40, other_bytes=80, packable=16 + 40,
                                    kv_per_token=2 * 1 * 1 * 2)
    _checkpoint(tmp_path / "tied", tensors, config)  # no lm_head: the embedding is the head, packed
    assert read_checkpoint_size(tmp_path / "tied").packable == 16 + 40
    with pytest.raises(FileNotFoundError, match="config.json and"):
        read_checkpoint_size(tmp_path)


def test_plan_adds_weights_packed_copies_kv_baseline_and_margin():
    plan = plan_memory([QWEN_TARGET, QWEN_DRAFT], FLOAT32, packed=True, max_total_tokens=8192, available=30 * GIB)
    assert plan.weights == (QWEN_TARGET.floating + QWEN_DRAFT.floating) * 4
    assert plan.packed_copies == (QWEN_TARGET.packable + QWEN_DRAFT.packable) * 4
    assert plan.kv_cache == (14_336 + 6_144) * 4 * 8192
    assert plan.needed == plan.weights + plan.packed_copies + plan.kv_cache + SERVER_BASELINE + RUNTIME_MARGIN
    assert "weights 9.0 GiB + oneDNN packed copies 7.6 GiB + KV cache for 8192 tokens 0.6 GiB" in plan.describe()
    unpacked = plan_memory([QWEN_TARGET, QWEN_DRAFT], 2, packed=False, max_total_tokens=8192, available=30 * GIB)
    assert unpacked.packed_copies == 0 and unpacked.weights == plan.weights // 2


@pytest.mark.parametrize("free_gib", [20.5, 24.0, 64.0, 512.0])
def test_sized_fraction_gives_the_kv_cache_its_tokens_and_keeps_the_margin(free_gib):
    plan = plan_memory([QWEN_TARGET, QWEN_DRAFT], FLOAT32, True, 8192, int(free_gib * GIB))
    assert plan.fits
    fraction = plan.mem_fraction_static()
    seen_by_sglang = plan.available - plan.baseline
    assert plan.kv_room(fraction) >= plan.kv_cache  # SGLang's rest covers the whole pool
    assert seen_by_sglang * (1 - fraction) >= RUNTIME_MARGIN - 0.001 * seen_by_sglang  # rounding up


def test_the_fixed_fraction_failure_is_refused_up_front():
    """A 21 GiB host with another program holding 3 GiB: under the fixed 0.9 SGLang's rest is
    negative (its error after minutes of loading); the plan says so before anything starts."""
    plan = plan_memory([QWEN_TARGET, QWEN_DRAFT], FLOAT32, True, 8192, 18 * GIB)
    assert plan.kv_room(0.9) <= 0
    assert not plan.fits and "20.2 GiB needed, 18.0 GiB available" in plan.describe()
    # Without the packed copies the same host has room, and the sized fraction works.
    unpacked = plan_memory([QWEN_TARGET, QWEN_DRAFT], FLOAT32, False, 8192, 18 * GIB)
    assert unpacked.fits and unpacked.kv_room(unpacked.mem_fraction_static()) >= unpacked.kv_cache


def test_available_memory_reads_meminfo_cgroup_and_numa_nodes(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       4000 kB\nMemAvailable:    1000 kB\n")
    cgroup, nodes = tmp_path / "cgroup", tmp_path / "nodes"
    cgroup.mkdir()
    nodes.mkdir()
    assert available_memory(str(meminfo), str(cgroup), str(nodes)) == 1000 * 1024
    (cgroup / "memory.max").write_text("max\n")
    (cgroup / "memory.current").write_text("100\n")
    assert available_memory(str(meminfo), str(cgroup), str(nodes)) == 1000 * 1024
    (cgroup / "memory.max").write_text("500100\n")
    assert available_memory(str(meminfo), str(cgroup), str(nodes)) == 500_000
    for name, cpus in (("node0", "0-1\n"), ("node1", "2-3\n"), ("node2", "\n")):
        (nodes / name).mkdir()
        (nodes / name / "cpulist").write_text(cpus)
    assert available_memory(str(meminfo), str(cgroup), str(nodes)) == 250_000  # two nodes with CPUs
