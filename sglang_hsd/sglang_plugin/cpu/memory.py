"""Host memory for a CPU server: what the models need and the ``--mem-fraction-static`` that
gives the KV pool what is left.

How SGLang 0.5.23 sizes the KV pool on CPU (``KVCacheConfigurator._profile_available_bytes``):
before any weight loads, the scheduler reads the available memory A (psutil's ``available``, i.e.
``MemAvailable`` of ``/proc/meminfo``, lowered to what the cgroup still allows, divided among the
NUMA nodes). Once the target and the draft have loaded (with ``--hsd-cpu-linear onednn-packed``,
their packed copies too) it reads it again, A - M, and gives the KV pool

    rest = (A - M) - A * (1 - mem_fraction_static) = A * mem_fraction_static - M

capped by ``--max-total-tokens``; rest <= 0 stops the server with "Loaded weights leave no GPU
memory for the KV cache under --mem-fraction-static=...". A fixed fraction therefore fails as
soon as M > fraction * A: the Qwen2.5-Coder pair with packed copies (M about 16.6 GiB) under 0.9
needs A > 18.4 GiB, which a host with 21 GiB free no longer has once another program holds 3 GiB.

``plan_memory`` instead keeps a fixed ``RUNTIME_MARGIN`` free, A * (1 - fraction), for what is
neither weights nor KV, and refuses, before anything starts, a host whose free memory cannot hold
weights + packed copies + the KV of ``--max-total-tokens`` + the server processes' own baseline +
that margin. Sizes come from the checkpoints' safetensors headers and configs (nothing loads).
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path

GIB = 1 << 30
# Memory the server's processes hold before the scheduler's first reading, which our reading
# (taken before anything starts) still counts as free: the launcher with its tokenizer, the
# detokenizer, and the scheduler's own imports (torch, SGLang). Measured with the tiny test pair:
# 0.64 + 0.62 + 0.71 GB resident (shared library pages counted in each); rounded up.
SERVER_BASELINE = 2 * GIB
# Left free beside weights and KV, A * (1 - fraction): activations of a prefill chunk and of a
# verify forward, the tokenizer's growth under load, allocator slack.
RUNTIME_MARGIN = 1 * GIB
# Bytes per element of a served model (``--dtype``).
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}
# Bytes per element of safetensors dtypes; the floating ones are served in ``--dtype``.
_STORED_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
                 "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
_FLOATING = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"}
# Bytes of one packed float32 element (oneDNN's packed copy keeps the weight's precision).
_PACKED_BYTES = 4


@dataclass(frozen=True)
class CheckpointSize:
    """What one checkpoint folder holds, read from its safetensors headers and ``config.json``.

    Fields:
        floating: elements of floating-point tensors (served in ``--dtype``).
        other_bytes: bytes of the other tensors, kept as stored (e.g. an EAGLE-3 head's id maps).
        packable: elements of the 2-D floating tensors ``--hsd-cpu-linear onednn-packed`` copies:
            every linear weight and the lm_head (the input embedding only when it is the lm_head).
        kv_per_token: KV cache elements per token, 2 * layers * KV heads * head dim.
    """

    floating: int
    other_bytes: int
    packable: int
    kv_per_token: int


def _safetensors_header(path: Path) -> dict:
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(length))


def _kv_per_token(config: dict) -> int:
    text = config.get("text_config") or config
    heads = int(text["num_attention_heads"])
    head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
    kv_heads = int(text.get("num_key_value_heads") or heads)
    return 2 * int(text["num_hidden_layers"]) * kv_heads * head_dim


def read_checkpoint_size(folder: str | os.PathLike) -> CheckpointSize:
    """The ``CheckpointSize`` of a checkpoint folder (``*.safetensors`` and ``config.json``).

    Raises ``FileNotFoundError`` naming the folder when either is missing.
    """
    folder = Path(folder)
    files = sorted(folder.glob("*.safetensors"))
    if not files or not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder}: needs config.json and *.safetensors weights")
    config = json.loads((folder / "config.json").read_text())
    tensors = {name: entry for path in files for name, entry in _safetensors_header(path).items()
               if name != "__metadata__"}
    # A tied lm_head is the input embedding itself (no lm_head tensor): then that one is packed.
    embedding_is_head = "lm_head.weight" not in tensors
    floating = other = packable = 0
    for name, entry in tensors.items():
        count = math.prod(entry["shape"])
        if entry["dtype"] not in _FLOATING:
            other += count * _STORED_BYTES.get(entry["dtype"], 8)
            continue
        floating += count
        if len(entry["shape"]) == 2 and ("embed_tokens" not in name or embedding_is_head):
            packable += count
    return CheckpointSize(floating, other, packable, _kv_per_token(config))


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes a CPU server needs against the bytes available.

    Fields:
        available: free host memory now (``available_memory``).
        weights: every model's weights in the served dtype.
        packed_copies: the oneDNN packed copies (0 without ``--hsd-cpu-linear onednn-packed``).
        kv_cache: the KV pools (target and draft) for ``max_total_tokens``.
        max_total_tokens: the KV pools' token capacity (``--max-total-tokens``).
        baseline: the server processes' own memory (``SERVER_BASELINE``).
        margin: kept free beside weights and KV (``RUNTIME_MARGIN``).
    """

    available: int
    weights: int
    packed_copies: int
    kv_cache: int
    max_total_tokens: int
    baseline: int = SERVER_BASELINE
    margin: int = RUNTIME_MARGIN

    @property
    def needed(self) -> int:
        return self.weights + self.packed_copies + self.kv_cache + self.baseline + self.margin

    @property
    def fits(self) -> bool:
        return self.needed <= self.available

    def mem_fraction_static(self) -> float:
        """The fraction that leaves ``margin`` of the memory SGLang will read (ours less the
        baseline) free, rounded up to 0.001 so the KV pool keeps its full capacity."""
        seen_by_sglang = self.available - self.baseline
        return math.ceil((1 - self.margin / seen_by_sglang) * 1000) / 1000

    def kv_room(self, fraction: float) -> int:
        """Bytes SGLang would give the KV pool under ``fraction`` (``rest`` above; <= 0 fails)."""
        return int((self.available - self.baseline) * fraction) - self.weights - self.packed_copies

    def describe(self) -> str:
        parts = [f"weights {format_gib(self.weights)}"]
        if self.packed_copies:
            parts.append(f"oneDNN packed copies {format_gib(self.packed_copies)}")
        parts += [f"KV cache for {self.max_total_tokens} tokens {format_gib(self.kv_cache)}",
                  f"server processes {format_gib(self.baseline)}", f"margin {format_gib(self.margin)}"]
        return f"{' + '.join(parts)} = {format_gib(self.needed)} needed, {format_gib(self.available)} available"


def format_gib(size: int) -> str:
    """``size`` bytes as "X.Y GiB" (for messages)."""
    return f"{size / GIB:.1f} GiB"


def plan_memory(checkpoints: list[CheckpointSize], dtype_bytes: int, packed: bool,
                max_total_tokens: int, available: int) -> MemoryPlan:
    """The memory a server of ``checkpoints`` (target first, then the draft) needs.

    Args:
        dtype_bytes: bytes per element of the served dtype (``DTYPE_BYTES``); the KV cache too.
        packed: ``--hsd-cpu-linear onednn-packed`` (float32 packed copies of the linear weights).
        max_total_tokens: ``--max-total-tokens``, the capacity of each KV pool.
        available: ``available_memory()``.
    """
    weights = sum(c.floating * dtype_bytes + c.other_bytes for c in checkpoints)
    copies = sum(c.packable for c in checkpoints) * _PACKED_BYTES if packed else 0
    kv = sum(c.kv_per_token for c in checkpoints) * dtype_bytes * max_total_tokens
    return MemoryPlan(available, weights, copies, kv, max_total_tokens)


def _cgroup_room(cgroup: Path) -> int | None:
    try:
        limit = (cgroup / "memory.max").read_text().strip()
        current = int((cgroup / "memory.current").read_text())
    except (OSError, ValueError):
        return None
    return None if limit == "max" else max(0, int(limit) - current)


def _numa_nodes(nodes: Path) -> int:
    count = 0
    for node in nodes.glob("node[0-9]*"):
        try:
            count += bool((node / "cpulist").read_text().strip())
        except OSError:
            continue
    return max(count, 1)


def available_memory(meminfo: str = "/proc/meminfo", cgroup: str = "/sys/fs/cgroup",
                     nodes: str = "/sys/devices/system/node") -> int:
    """Free host memory in bytes as SGLang reads it on CPU: ``MemAvailable``, lowered to the
    cgroup's remaining allowance (v2), divided by the NUMA nodes with CPUs."""
    with open(meminfo) as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    available = int(fields["MemAvailable"].split()[0]) * 1024
    room = _cgroup_room(Path(cgroup))
    if room is not None:
        available = min(available, room)
    return available // _numa_nodes(Path(nodes))
