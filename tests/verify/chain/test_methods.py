"""The chain-method registry: its entries say what the dispatch and the exact oracle find."""

import contextlib
import dataclasses
import warnings

import pytest
import torch

from sglang_hsd.verify import CHAIN_METHODS, LOSSLESS_CHAIN_METHODS, verify_chain
from sglang_hsd.verify.chain import expected_accepted_per_length
from sglang_hsd.verify.oracles import exact

# Enumeration in float64 reaches ~1e-16; anything above 1e-12 is a real bias.
LOSSLESS_TV = 1e-12


def _inputs(batch=3, num_draft=2, vocab=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.softmax(torch.randn(batch, num_draft, vocab, generator=gen), -1)
    p = torch.softmax(torch.randn(batch, num_draft + 1, vocab, generator=gen), -1)
    tokens = torch.multinomial(q.reshape(-1, vocab), 1, generator=gen).reshape(batch, num_draft)
    return tokens, q, p


def test_keys_are_names_and_lossless_names_are_derived_in_order():
    assert all(name == method.name for name, method in CHAIN_METHODS.items())
    assert LOSSLESS_CHAIN_METHODS == ("hsd", "tokenwise")
    assert LOSSLESS_CHAIN_METHODS == tuple(name for name, m in CHAIN_METHODS.items() if m.lossless)


@pytest.mark.exact
@pytest.mark.parametrize("method", sorted(CHAIN_METHODS))
def test_lossless_flag_agrees_with_the_exact_oracle(method):
    world = exact.random_world(3, 4, seed=0)
    tv = exact.prefix_tv(world, method, 2, 3)
    assert (tv < LOSSLESS_TV) == CHAIN_METHODS[method].lossless, f"{method}: TV {tv:.3g}"


@pytest.mark.parametrize("method", sorted(CHAIN_METHODS))
def test_reads_q_decides_whether_draft_probs_may_be_none(method):
    tokens, q, p = _inputs()
    if CHAIN_METHODS[method].reads_q:
        with pytest.raises(ValueError, match=f"draft_probs is required for method '{method}'"):
            verify_chain(tokens, None, p, method=method)
    else:
        verify_chain(tokens, None, p, method=method)


@pytest.mark.parametrize("method", sorted(CHAIN_METHODS))
def test_only_methods_with_a_warning_warn(method):
    tokens, q, p = _inputs()
    warning = CHAIN_METHODS[method].warning
    expect = pytest.warns(UserWarning, match="NOT preserve") if warning else contextlib.nullcontext()
    with warnings.catch_warnings():
        if warning is None:
            warnings.simplefilter("error")
        with expect:
            verify_chain(tokens, q, p, method=method, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("method", sorted(CHAIN_METHODS))
def test_dispatch_runs_the_registered_reference(method, monkeypatch):
    tokens, q, p = _inputs()
    rule = CHAIN_METHODS[method]
    calls = []
    patched = dataclasses.replace(rule, reference=lambda *a: calls.append(1) or rule.reference(*a))
    monkeypatch.setitem(CHAIN_METHODS, method, patched)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        verify_chain(tokens, q, p, method=method, backend="torch", generator=torch.Generator().manual_seed(0))
    assert calls == [1]


def test_expected_accepted_needs_a_formula():
    tokens, q, p = _inputs()
    with_formula = sorted(name for name, m in CHAIN_METHODS.items() if m.expected_accepted is not None)
    assert with_formula == ["hsd", "hsd-paper", "tokenwise"]
    with pytest.raises(ValueError, match="method must be one of"):
        expected_accepted_per_length(tokens, q, p, "greedy")
