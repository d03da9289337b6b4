"""What the GPU kernel checks share: the device and sizes, uniforms kept off knife edges, the
row-by-row comparison that names what differs, and the count of kernel calls.

Sizes. On a CUDA device the checks run at serving sizes (V = 32000 and 128256, several vocabulary
blocks of 1024, batches up to 64). With ``SGLANG_HSD_GPU_SMOKE=1`` and no CUDA they run tiny
versions on CPU under ``TRITON_INTERPRET=1`` (V = 64 and 1100, the latter two blocks), which
checks the plumbing of this folder without a GPU (``benchmarks/gpu_check.py --smoke-cpu``).

Knife edges. The kernels and the torch references sum float32 rows in different orders, so a
coin u against a threshold h (or the inverse-CDF threshold u * total against a running sum) can
come out differently when u lies within rounding distance of the threshold. Rather than allowing
some mismatches, the uniforms are chosen so that no comparison is that close: the reference's
result must be the same with every uniform moved down by ``KNIFE_EDGE`` and up by ``KNIFE_EDGE``.
Every verifier's outcome is monotone in each uniform along the walk it takes (chains: the stop
position only moves one way as a coin grows; trees: the first accepted test and the walk before
it; the sampled token: the CDF index), so equal results at both corners mean equal results for
every uniform within ``KNIFE_EDGE``, i.e. for any threshold the kernel computes within that
distance of the reference's. Rows still unstable after ``STABLE_TRIES`` redraws are left out of
the comparison and reported; every other row must match exactly.
"""

from __future__ import annotations

import os

import torch

SMOKE_ENV = "SGLANG_HSD_GPU_SMOKE"
SMOKE = os.environ.get(SMOKE_ENV) == "1"
CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA and not SMOKE else "cpu")
RUNS = CUDA or SMOKE
SKIP_REASON = (
    "no CUDA device (torch.cuda.is_available() is False); these checks run the Triton kernels on a "
    f"GPU. Set {SMOKE_ENV}=1 to run tiny CPU versions under TRITON_INTERPRET=1 instead"
)

VOCABS = (64, 1100) if SMOKE else (32000, 128256)
BATCHES = (2,) if SMOKE else (1, 16, 64)
CHAIN_DRAFT_LENGTHS = (1, 4) if SMOKE else (1, 4, 8)
TREE_NODES = (8, 16) if SMOKE else (8, 16, 32, 64)

# How far (in uniform units) every coin and sample uniform must be from the reference's
# thresholds. Float32 running sums of 128256 probabilities in two orders differ by: at most about
# 4e-6 of the row total for the kernels' blocked sums (126 sequential block additions of at most
# half an ulp each); typically about 2e-6 for torch's CUDA cumsum, which carries a running prefix
# over V / 32 chunks (a random walk of 4000 roundings; its worst case, 1e-4, is not reached by
# round-to-nearest in practice). 3e-5 is 10x the typical gap; a mismatch on a compared row is
# reported with both results, so a rare rounding case can be told from a kernel fault.
KNIFE_EDGE = 3e-5
# Redraws of the unstable rows before giving up on them (each costs two reference calls).
STABLE_TRIES = 8
# A comparison that left most rows out would prove little: at least this share must be compared.
MIN_STABLE_FRACTION = 0.9
# Next-token weights of trees (hsd): the kernel's residual rows are divided by a float32 mass summed
# in another order, so entries differ by about 1e-6 of the row's largest entry; 1e-4 of it is
# far above rounding and far below any real error (a wrong row differs by O(1) of its maximum).
WEIGHTS_RELATIVE_TOL = 1e-4
# Just below 1.0 in float32: shifted uniforms must stay in [0, 1).
_BELOW_ONE = 1.0 - 2.0**-24


def generator(seed: int) -> torch.Generator:
    return torch.Generator(device=DEVICE).manual_seed(seed)


def shifted(uniforms, delta: float):
    """The same uniforms type (``ChainUniforms`` / ``TreeUniforms``) with every entry moved by
    ``delta`` and clamped to [0, 1)."""
    return type(uniforms)(
        accept=(uniforms.accept + delta).clamp(0.0, _BELOW_ONE),
        sample=(uniforms.sample + delta).clamp(0.0, _BELOW_ONE),
    )


def rows_differ(left: tuple[torch.Tensor, ...], right: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """bool [B]: rows where any of the paired result tensors (each [B, ...]) differ."""
    differ = torch.zeros(left[0].shape[0], dtype=torch.bool, device=left[0].device)
    for a, b in zip(left, right):
        differ |= (a.reshape(a.shape[0], -1) != b.reshape(b.shape[0], -1)).any(-1)
    return differ


def stable_uniforms(run, uniforms, gen: torch.Generator, edge: float = KNIFE_EDGE, tries: int = STABLE_TRIES):
    """Uniforms whose reference result does not change within ``edge`` (module docstring).

    Args:
        run: uniforms -> tuple of result tensors, each [B, ...] (the torch reference).
        uniforms: ``ChainUniforms`` or ``TreeUniforms`` (accept [B, M], sample [B]).
        gen: generator for the redraws.
    Returns:
        (uniforms, unstable bool [B]): the rows still unstable after ``tries`` redraws.
    """
    batch, columns = uniforms.accept.shape
    for attempt in range(tries + 1):
        unstable = rows_differ(run(shifted(uniforms, -edge)), run(shifted(uniforms, edge)))
        if attempt == tries or not bool(unstable.any()):
            return uniforms, unstable
        fresh = type(uniforms).draw(batch, columns, uniforms.accept.device, gen)
        uniforms = type(uniforms)(
            accept=torch.where(unstable.unsqueeze(-1), fresh.accept, uniforms.accept),
            sample=torch.where(unstable, fresh.sample, uniforms.sample),
        )
    raise AssertionError("unreachable")


def mismatch_report(label: str, names: tuple[str, ...], reference, kernel, unstable: torch.Tensor,
                    shown: int = 4) -> list[str]:
    """Lines describing every compared row where the kernel differs from the reference (empty
    when they agree), and a line when too few rows could be compared."""
    differ = rows_differ(reference, kernel) & ~unstable
    batch = unstable.shape[0]
    lines = []
    if int(differ.sum()):
        rows = differ.nonzero().flatten().tolist()
        lines.append(f"{label}: {len(rows)} of {batch} rows differ from the torch reference (rows {rows[:16]})")
        for row in rows[:shown]:
            for name, ref, out in zip(names, reference, kernel):
                lines.append(f"  row {row} {name}: reference {ref[row].tolist()} kernel {out[row].tolist()}")
    compared = batch - int(unstable.sum())
    if compared < MIN_STABLE_FRACTION * batch:
        lines.append(f"{label}: only {compared} of {batch} rows had uniforms {KNIFE_EDGE} away from every "
                     f"threshold after {STABLE_TRIES} redraws (need {MIN_STABLE_FRACTION:.0%})")
    return lines


def count_calls(monkeypatch, module, name: str) -> list[int]:
    """Replace ``module.name`` by a wrapper that records each call; returns the record."""
    calls: list[int] = []
    real = getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def rotate(values: tuple, index: int):
    """``values[index % len(values)]``: spreads batch sizes over the cases."""
    return values[index % len(values)]
