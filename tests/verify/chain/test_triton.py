"""The Triton chain kernel against the torch reference, on CPU under TRITON_INTERPRET=1.

``tests/conftest.py`` switches the interpreter on before triton is first imported.
"""

import pytest
import torch

from sglang_hsd.verify import CHAIN_METHODS, ChainUniforms

pytestmark = pytest.mark.triton

# Float summation order may differ between the kernel and torch; a coin or token can flip only when
# a uniform lands within ~1e-6 of a threshold, so a few flips in many draws would be tolerable, but
# at these sizes none is expected and the tests demand exact equality.


@pytest.fixture(scope="module")
def kernel_module():
    pytest.importorskip("triton")
    import sglang_hsd.verify.chain.triton as module

    return module


def _inputs(batch, num_draft, vocab, seed, regime):
    gen = torch.Generator().manual_seed(seed)
    q = torch.softmax(2 * torch.randn(batch, num_draft, vocab, generator=gen), -1)
    p = torch.softmax(2 * torch.randn(batch, num_draft + 1, vocab, generator=gen), -1)
    if regime == "close":  # drafter close to target: long accepted prefixes, ratios > 1 (cap binds)
        p[:, :num_draft] = 0.8 * q + 0.2 * p[:, :num_draft]
    if regime == "equal":  # p == q: S+ = 0 and 1 - r* = 0 on every branch (the 0/0 guard)
        p[:, :num_draft] = q
    tokens = torch.multinomial(q.reshape(-1, vocab), 1, generator=gen).reshape(batch, num_draft)
    return tokens, q, p


@pytest.mark.parametrize("method", ["hsd", "tokenwise"])
@pytest.mark.parametrize(
    "batch,num_draft,vocab,regime",
    [(8, 1, 5, "random"), (8, 3, 7, "close"), (6, 4, 16, "random"), (4, 2, 33, "close"), (4, 3, 8, "equal")],
)
def test_kernel_matches_reference_token_for_token(kernel_module, method, batch, num_draft, vocab, regime):
    rule = CHAIN_METHODS[method]
    kernel = getattr(kernel_module, rule.triton_kernel)
    for seed in range(3):
        tokens, q, p = _inputs(batch, num_draft, vocab, seed, regime)
        u = ChainUniforms.draw(batch, num_draft, generator=torch.Generator().manual_seed(100 + seed))
        ref = rule.reference(tokens, q, p, u)
        # block_v=8 forces several vocabulary blocks for the larger vocabularies.
        out = kernel(tokens, q, p, u, block_v=8)
        assert torch.equal(out.num_accepted, ref.num_accepted), (seed, out.num_accepted, ref.num_accepted)
        assert torch.equal(out.tokens, ref.tokens), (seed, out.tokens, ref.tokens)


@pytest.mark.parametrize("method", ["hsd", "tokenwise"])
def test_dispatch_uses_kernel_when_asked(kernel_module, monkeypatch, method):
    from sglang_hsd.verify import verify_chain

    calls = []
    name = CHAIN_METHODS[method].triton_kernel
    real = getattr(kernel_module, name)
    monkeypatch.setattr(kernel_module, name, lambda *a, **k: calls.append(1) or real(*a, **k))
    tokens, q, p = _inputs(2, 2, 5, 0, "random")
    verify_chain(tokens, q, p, method=method, backend="triton", generator=torch.Generator().manual_seed(0))
    assert calls == [1]  # the fast path really ran
    with pytest.raises(ValueError, match=r"Triton chain kernels implement \['hsd', 'tokenwise'\]"):
        verify_chain(tokens, q, p, method="greedy", backend="triton")


def test_every_registered_kernel_exists(kernel_module):
    named = {name: rule.triton_kernel for name, rule in CHAIN_METHODS.items() if rule.triton_kernel}
    assert sorted(named) == ["hsd", "tokenwise"]
    assert all(callable(getattr(kernel_module, kernel, None)) for kernel in named.values())


@pytest.mark.parametrize("method", ["hsd", "tokenwise"])
def test_kernel_matches_reference_on_ragged_lengths(kernel_module, method):
    rule = CHAIN_METHODS[method]
    tokens, q, p = _inputs(6, 4, 10, 3, "close")
    lengths = torch.tensor([1, 4, 2, 3, 4, 1])
    for seed in range(3):
        u = ChainUniforms.draw(6, 4, generator=torch.Generator().manual_seed(seed))
        ref = rule.reference(tokens, q, p, u, lengths)
        out = getattr(kernel_module, rule.triton_kernel)(tokens, q, p, u, lengths, block_v=8)
        assert torch.equal(out.tokens, ref.tokens) and torch.equal(out.num_accepted, ref.num_accepted)
