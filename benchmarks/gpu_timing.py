"""Timing grid of the GPU check (``benchmarks/gpu_check.py``): the verifiers' hot-path calls.

Each configuration times one call as the serving path makes it: ``verify_tree(..., validate=False,
max_depth=D)`` or ``verify_chain(..., validate=False)``, uniforms drawn inside, with
``backend="auto"`` (the Triton kernel on CUDA where the method has one) and, for methods with a
kernel, ``backend="torch"`` beside it. A chain of K + 1 = N target positions (K = N - 1 drafted
tokens) is timed next to a tree of N nodes. Inputs (``benchmarks/gpu_inputs.py``, regime
``close``) are built once per shape on the device; neither verifier's running time depends on the
regime (fixed trip counts, no data-dependent exits).

Timer: on CUDA, the device is synchronised before each call and the call is bracketed by CUDA
events, so a time includes the host's launch overhead whenever the GPU waits for it (what the
serving loop pays); the median over the repetitions is reported in microseconds. On CPU (the
``--smoke-cpu`` plumbing run under ``TRITON_INTERPRET=1``) wall-clock time; those numbers mean
nothing about a GPU.

Memory: a float32 [B, N, V] tensor at B = N = 64, V = 128256 is 2.1 GB. ``estimated_bytes`` counts
each configuration's [B, N, V]-sized tensors (two inputs, the working copies of its rule, and the
transient copies of input generation); configurations above ``MEMORY_LIMIT_BYTES`` are skipped
and reported. The peak the allocator saw is recorded next to each time.
"""

from __future__ import annotations

import itertools
import statistics
import time
from dataclasses import asdict, dataclass

import torch

from sglang_hsd.runtime.timing import median_seconds

KINDS = ("chain", "tree")
TIMED_METHODS = {"chain": ("hsd", "tokenwise"), "tree": ("hsd", "rrs", "target-only")}
FULL_GRID = {"batch": (1, 4, 16, 64), "vocab": (32000, 128256), "nodes": (8, 16, 32, 64)}
QUICK_GRID = {"batch": (1, 64), "vocab": (32000, 128256), "nodes": (8, 64)}
SMOKE_GRID = {"batch": (2,), "vocab": (64,), "nodes": (8,)}
# An H100 has 80 GB; leave room for the allocator's caching and the CUDA context.
MEMORY_LIMIT_BYTES = 60 * 10**9
# Extra [B, N, V] float32 tensors a call allocates beyond its two inputs, by (kind, method, path):
# the tree hsd rule (kernel and reference) clones Mb and Ms; the chain hsd reference forms
# r* p, r* p - q and its clamp over [B, K, V] at once. Other rules work on [B, V] rows only.
WORKING_COPIES = {("tree", "hsd", "triton"): 2, ("tree", "hsd", "torch"): 2, ("chain", "hsd", "torch"): 3}
# Input generation holds the two rows plus a logits tensor and multinomial's noise at its peak.
GENERATION_COPIES = 4
# Repetitions: CUDA until ``CUDA_TARGET_S`` of calls or ``CUDA_MAX_REPS``, at least ``CUDA_MIN_REPS``
# (the first warm-up call compiles a kernel once per process and specialisation).
CUDA_WARMUP, CUDA_MIN_REPS, CUDA_MAX_REPS, CUDA_TARGET_S = 3, 5, 50, 0.2
CPU_WARMUP, CPU_REPS = 1, 2


@dataclass(frozen=True)
class TimingConfig:
    """One timed call. ``nodes`` is N: tree nodes (root included), or chain positions K + 1."""

    kind: str
    method: str
    backend: str
    batch: int
    nodes: int
    vocab: int

    def shape(self) -> tuple[str, int, int, int]:
        return self.kind, self.batch, self.nodes, self.vocab

    def label(self) -> str:
        return f"{self.kind} {self.method} backend={self.backend} B={self.batch} N={self.nodes} V={self.vocab}"


def grid(kind: str, quick: bool = False, smoke: bool = False) -> list[TimingConfig]:
    """Every configuration of one kind, grouped by shape (inputs are built once per shape)."""
    sizes = SMOKE_GRID if smoke else QUICK_GRID if quick else FULL_GRID
    # On CPU "auto" means torch, so the smoke run names the kernel to exercise its plumbing.
    fast = "triton" if smoke else "auto"
    configs = []
    for batch, vocab, nodes in itertools.product(sizes["batch"], sizes["vocab"], sizes["nodes"]):
        for method in TIMED_METHODS[kind]:
            backends = (fast, "torch") if _has_kernel(kind, method) else ("auto",)
            configs += [TimingConfig(kind, method, backend, batch, nodes, vocab) for backend in backends]
    return configs


def _registry(kind: str):
    from sglang_hsd.verify import CHAIN_METHODS, TREE_METHODS

    return CHAIN_METHODS if kind == "chain" else TREE_METHODS


def _has_kernel(kind: str, method: str) -> bool:
    return _registry(kind)[method].triton_kernel is not None


def resolved_backend(config: TimingConfig, cuda: bool) -> str:
    """The implementation ``backend`` picks: "triton" or "torch"."""
    kernel = _has_kernel(config.kind, config.method)
    return "triton" if kernel and (config.backend == "triton" or (config.backend == "auto" and cuda)) else "torch"


def estimated_bytes(config: TimingConfig, cuda: bool = True) -> int:
    """Peak bytes of the [B, N, V]-sized tensors of ``config`` (module docstring)."""
    row_tensor = config.batch * config.nodes * config.vocab * 4
    working = WORKING_COPIES.get((config.kind, config.method, resolved_backend(config, cuda)), 0)
    return max(GENERATION_COPIES, 2 + working) * row_tensor


def make_inputs(kind: str, batch: int, nodes: int, vocab: int, device, seed: int = 0):
    """Inputs of one shape: ``TreeInputs`` or (tokens, q, p) of a chain with K = nodes - 1."""
    from benchmarks.gpu_inputs import chain_inputs, tree_inputs

    gen = torch.Generator(device=device).manual_seed(seed)
    if kind == "tree":
        return tree_inputs(batch, nodes, vocab, "close", "without-replacement", gen, device)
    return chain_inputs(batch, nodes - 1, vocab, "close", gen, device)


def hot_path_call(config: TimingConfig, inputs):
    """The zero-argument call that is timed."""
    from sglang_hsd.verify import TREE_METHODS, verify_chain, verify_tree

    if config.kind == "chain":
        tokens, q, p = inputs
        return lambda: verify_chain(tokens, q, p, method=config.method, validate=False, backend=config.backend)
    draft = inputs.draft_probs if TREE_METHODS[config.method].reads_q else None
    return lambda: verify_tree(*inputs.links(), draft, inputs.target_probs, method=config.method, validate=False,
                               backend=config.backend, draft_mode=inputs.draft_mode, max_depth=inputs.max_depth)


def median_us(fn, cuda: bool) -> tuple[float, int]:
    """(median microseconds per call, repetitions) after warm-up (module docstring)."""
    if not cuda:
        return median_seconds(fn, CPU_REPS, warmup=CPU_WARMUP) * 1e6, CPU_REPS
    for _ in range(CUDA_WARMUP):
        fn()
    times: list[float] = []
    began = time.perf_counter()
    while len(times) < CUDA_MAX_REPS and (len(times) < CUDA_MIN_REPS or time.perf_counter() - began < CUDA_TARGET_S):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times), len(times)


def _row(config: TimingConfig, cuda: bool, status: str, **measured) -> dict:
    return {**asdict(config), "resolved": resolved_backend(config, cuda),
            "estimated_gb": round(estimated_bytes(config, cuda) / 1e9, 3), "status": status, **measured}


def time_one(config: TimingConfig, inputs, cuda: bool) -> dict:
    """Time one configuration; an exception becomes an ``error`` row (the grid goes on)."""
    try:
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        median, reps = median_us(hot_path_call(config, inputs), cuda)
        peak = round(torch.cuda.max_memory_allocated() / 1e9, 3) if cuda else None
        return _row(config, cuda, "ok", median_us=round(median, 1), reps=reps, peak_gb=peak)
    except Exception as error:  # noqa: BLE001 - recorded per configuration, the grid goes on
        return _row(config, cuda, f"error: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")


def run_grid(configs: list[TimingConfig], device, deadline: float, log=print) -> list[dict]:
    """Time ``configs`` (grouped by shape) until ``deadline`` (``time.monotonic()``); configurations
    not started by then, and those over the memory limit, come back as ``skipped`` rows."""
    cuda = torch.device(device).type == "cuda"
    rows = []
    for shape, group in itertools.groupby(configs, key=TimingConfig.shape):
        group = list(group)
        fits = [c for c in group if estimated_bytes(c, cuda) <= MEMORY_LIMIT_BYTES]
        rows += [_row(c, cuda, f"skipped: estimated {estimated_bytes(c, cuda) / 1e9:.1f} GB > limit")
                 for c in group if c not in fits]
        if time.monotonic() > deadline:
            rows += [_row(c, cuda, "skipped: budget") for c in fits]
            continue
        try:
            inputs = make_inputs(*shape, device=device)
        except Exception as error:  # noqa: BLE001 - the shape fails, the grid goes on
            rows += [_row(c, cuda, f"error: inputs: {type(error).__name__}: {error}") for c in fits]
            continue
        began = time.monotonic()
        for config in fits:
            row = _row(config, cuda, "skipped: budget") if time.monotonic() > deadline else time_one(config, inputs, cuda)
            if row["status"] not in ("ok", "skipped: budget"):
                log(f"  {config.label()}: {row['status']}")
            rows.append(row)
        # One line per shape: a per-configuration line would flood a console that keeps only its tail.
        log(f"  {shape[0]} B={shape[1]} N={shape[2]} V={shape[3]}: {len(fits)} configurations, "
            f"{time.monotonic() - began:.1f} s")
        del inputs
        if cuda:
            torch.cuda.empty_cache()
    return rows
