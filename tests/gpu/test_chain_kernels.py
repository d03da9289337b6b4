"""The Triton chain kernels (``hsd``, ``tokenwise``) against their torch references on a GPU,
token for token, at serving sizes.

Each case draws fresh inputs on the device in one regime of ``benchmarks/gpu_inputs.py`` (q close
to p: long accepts; unrelated q: early rejects; peaked rows: nearly one-hot, p(x) may underflow to
0), picks uniforms off every knife edge (``tests/gpu/_support.py``), runs ``verify_chain`` with
``backend="torch"`` and ``backend="triton"`` on the same ``ChainUniforms`` and demands identical
``num_accepted`` and emitted tokens on every compared row. Vocabularies of 32000 and 128256 are not
powers of two and span 32 and 126 blocks of the kernel's 1024-entry vocabulary loop.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest
import torch

from benchmarks.gpu_inputs import REGIMES, chain_inputs
from sglang_hsd.verify import CHAIN_METHODS, ChainUniforms, verify_chain
from sglang_hsd.verify.common import use_triton
from tests.gpu import _support as support

KERNEL_METHODS = tuple(name for name, method in CHAIN_METHODS.items() if method.triton_kernel)


@dataclass(frozen=True)
class ChainCase:
    vocab: int
    num_draft: int
    batch: int
    regime: str
    seed: int
    ragged: bool = False  # per-row draft lengths in [1, K]

    def __str__(self) -> str:
        ragged = "-ragged" if self.ragged else ""
        return f"V{self.vocab}-K{self.num_draft}-B{self.batch}-{self.regime}{ragged}"


def _cases() -> list[ChainCase]:
    grid = itertools.product(support.VOCABS, support.CHAIN_DRAFT_LENGTHS, REGIMES)
    cases = [ChainCase(v, k, support.rotate(support.BATCHES, i), regime, seed=i)
             for i, (v, k, regime) in enumerate(grid)]
    widest, longest = support.VOCABS[-1], support.CHAIN_DRAFT_LENGTHS[-1]
    cases.append(ChainCase(widest, longest, support.BATCHES[-1], "close", seed=len(cases), ragged=True))
    return cases


def _run(method, tokens, q, p, lengths, backend, validate=False):
    def run(uniforms):
        result = verify_chain(tokens, q, p, method=method, uniforms=uniforms, validate=validate,
                              backend=backend, draft_lengths=lengths)
        return result.num_accepted, result.tokens

    return run


@pytest.fixture(scope="module")
def kernels():
    pytest.importorskip("triton")
    import sglang_hsd.verify.chain.triton as module

    return module


@pytest.mark.parametrize("case", _cases(), ids=str)
@pytest.mark.parametrize("method", KERNEL_METHODS)
def test_chain_kernel_matches_reference(kernels, monkeypatch, method, case):
    gen = support.generator(case.seed)
    tokens, q, p = chain_inputs(case.batch, case.num_draft, case.vocab, case.regime, gen, support.DEVICE)
    lengths = None
    if case.ragged:
        lengths = torch.randint(1, case.num_draft + 1, (case.batch,), device=support.DEVICE, generator=gen)
    start = ChainUniforms.draw(case.batch, case.num_draft, support.DEVICE, gen)
    uniforms, unstable = support.stable_uniforms(_run(method, tokens, q, p, lengths, "torch"), start, gen)
    reference = _run(method, tokens, q, p, lengths, "torch", validate=True)(uniforms)
    calls = support.count_calls(monkeypatch, kernels, CHAIN_METHODS[method].triton_kernel)
    kernel = _run(method, tokens, q, p, lengths, "triton", validate=True)(uniforms)
    assert calls == [1], "the Triton kernel did not run"
    label = f"chain {method} {case} seed {case.seed} (q {list(q.shape)}, p {list(p.shape)}, {support.DEVICE})"
    problems = support.mismatch_report(label, ("num_accepted", "tokens"), reference, kernel, unstable)
    accepted = torch.bincount(reference[0], minlength=case.num_draft + 1).tolist()
    assert not problems, "\n".join(problems + [f"  reference num_accepted histogram {accepted}"])


@pytest.mark.parametrize("method", KERNEL_METHODS)
def test_auto_backend_runs_the_kernel_on_cuda(kernels, monkeypatch, method):
    """``backend="auto"`` (the serving default) takes the kernel exactly when the rows are on CUDA."""
    gen = support.generator(7)
    tokens, q, p = chain_inputs(2, 3, support.VOCABS[0], "close", gen, support.DEVICE)
    calls = support.count_calls(monkeypatch, kernels, CHAIN_METHODS[method].triton_kernel)
    verify_chain(tokens, q, p, method=method, backend="auto", generator=gen)
    expected = [1] if support.DEVICE.type == "cuda" else []
    assert calls == expected
    assert use_triton("auto", method, CHAIN_METHODS, "chain", p) == (support.DEVICE.type == "cuda")
