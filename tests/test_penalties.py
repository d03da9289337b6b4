"""Penalties on a verify round's rows (``sglang_hsd/penalties.py``): each row penalised with the
committed output plus the drafted tokens on its own path, as plain decoding penalises that
position.

* unit: paths and depths of a hand-built tree; ``penalise_rows`` on chains and on that tree against
  a token-by-token reference; bad input named;
* exact enumeration: chains (hsd, tokenwise) and sampled trees (hsd, target-only) verified
  against rows ``penalise_rows`` builds for each round emit the law of plain decoding with the
  penalties (frequency, presence, repetition, min_new_tokens, with top-k + top-p), first 3
  tokens over rounds, TV < 1e-12; the relaxed rows SGLang's speculative verify uses (every row of
  a request penalised with the committed output only) are rejected by the same tests.
"""

from functools import lru_cache

import numpy as np
import pytest
import torch

from sglang_hsd.penalties import RequestPenalties, penalise_rows, tree_paths
from sglang_hsd.sampling import BatchSamplingParams, filter_probs
from sglang_hsd.verify.oracles import exact, tree_exact
from tests.penalty_reference import penalised_logits

VOCAB = 4
PREFIX_LEN = 3
LOSSLESS_TV = 1e-12  # float64 enumeration reaches ~1e-16
LOSSY_TV = 1e-3  # the relaxed rows are off by 1e-2 or more here
STOP = 0  # the stop token min_new_tokens forbids

# (frequency, presence, repetition, min_new_tokens, top_k, top_p)
CASES = {
    "frequency": (0.9, 0.0, 1.0, 0, 0, 1.0),
    "presence": (0.0, 1.5, 1.0, 0, 0, 1.0),
    "repetition": (0.0, 0.0, 1.8, 0, 0, 1.0),
    "min_new_tokens": (0.0, 0.0, 1.0, 2, 0, 1.0),
    "all_with_top_k_top_p": (0.4, 0.5, 1.3, 2, 3, 0.8),
}


def _penalties(outputs, case, device="cpu") -> RequestPenalties:
    frequency, presence, repetition, min_new, _, _ = case
    n = len(outputs)
    return RequestPenalties.build([list(o) for o in outputs], VOCAB, frequency=[frequency] * n,
                                  presence=[presence] * n, repetition=[repetition] * n,
                                  min_new_tokens=[min_new] * n, stop_tokens=[{STOP}] * n, device=device,
                                  dtype=torch.float64)


def _sequential_penalised(logits: np.ndarray, output: tuple, case) -> np.ndarray:
    """Plain decoding's penalised logits after ``output`` (``tests/penalty_reference.py``)."""
    frequency, presence, repetition, min_new, _, _ = case
    return penalised_logits(logits, output, frequency=frequency, presence=presence, repetition=repetition,
                            min_new_tokens=min_new, stop_tokens=[STOP])


# ---------------------------------------------------------------------------------------------
# Unit tests
# ---------------------------------------------------------------------------------------------


def test_tree_paths_follow_each_nodes_own_path():
    # root(0) -> {1, 2}; 1 -> {3}; 3 -> {4}
    next_token = torch.tensor([[1, 3, -1, 4, -1]])
    next_sibling = torch.tensor([[-1, 2, -1, -1, -1]])
    on_path, depth = tree_paths(next_token, next_sibling)
    assert depth.tolist() == [[0, 1, 1, 2, 3]]
    drafted_on_path = [[i + 1 for i in range(4) if on_path[0, j, i]] for j in range(5)]
    assert drafted_on_path == [[], [1], [2], [1, 3], [1, 3, 4]]


@pytest.mark.parametrize("name", list(CASES))
def test_penalise_rows_on_a_tree_is_plain_decodings_penalty_at_every_node(name):
    case = CASES[name]
    tokens = torch.tensor([[2, 1, 2, 1, 3], [0, 3, 3, 0, 0]])  # the hand tree above, twice
    next_token = torch.tensor([[1, 3, -1, 4, -1]] * 2)
    next_sibling = torch.tensor([[-1, 2, -1, -1, -1]] * 2)
    committed = [(1, 1, 2), (0,)]
    logits = torch.randn(2, 5, VOCAB, generator=torch.Generator().manual_seed(5), dtype=torch.float64) * 2
    got = penalise_rows(logits, _penalties(committed, case), tokens, next_token, next_sibling)
    paths = [[], [1], [2], [1, 3], [1, 3, 4]]
    for b in range(2):
        for j, path in enumerate(paths):
            output = committed[b] + tuple(int(tokens[b, i]) for i in path)
            expected = _sequential_penalised(logits[b, j].numpy(), output, case)
            np.testing.assert_allclose(got[b, j].numpy(), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", list(CASES))
def test_penalise_rows_is_plain_decodings_penalty_at_every_row(name):
    case = CASES[name]
    gen = torch.Generator().manual_seed(3)
    committed = [(1, 1, 2), ()]
    chains = torch.tensor([[3, 1, 2, 1], [2, 0, 0, 3]])  # root then 3 drafts
    next_token = torch.tensor([[1, 2, 3, -1]] * 2)
    logits = torch.randn(2, 4, VOCAB, generator=gen, dtype=torch.float64) * 2
    got = penalise_rows(logits, _penalties(committed, case), chains, next_token, torch.full((2, 4), -1))
    for b in range(2):
        for j in range(4):
            output = committed[b] + tuple(chains[b, 1:j + 1].tolist())
            expected = _sequential_penalised(logits[b, j].numpy(), output, case)
            np.testing.assert_allclose(got[b, j].numpy(), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("kwargs,match", [
    ({"repetition": [0.0]}, "repetition_penalty"),
    ({"stop_tokens": [{VOCAB}]}, "token ids"),
])
def test_bad_penalties_are_named(kwargs, match):
    base = dict(frequency=[0.0], presence=[0.0], repetition=[1.0], min_new_tokens=[0], stop_tokens=[set()])
    with pytest.raises(ValueError, match=match):
        RequestPenalties.build([[1]], VOCAB, **{**base, **kwargs})


# ---------------------------------------------------------------------------------------------
# Exact enumeration
# ---------------------------------------------------------------------------------------------


class LazyWorld:
    """A context-dependent world whose rows are computed on demand (``p(ctx)``, ``q(ctx)``), the
    interface the exact oracles read."""

    def __init__(self, max_len: int, p, q):
        self.vocab_size, self.max_len = VOCAB, max_len
        self.p, self.q = lru_cache(maxsize=None)(p), lru_cache(maxsize=None)(q)


def _raw_logits(ctx: tuple, salt: int) -> np.ndarray:
    """Context-dependent logits of ``ctx`` (a stable function of the context)."""
    seed = hash((salt,) + ctx) % (2**32)
    return np.random.default_rng(seed).normal(0, 1.5, VOCAB)


def _filtered(logits: np.ndarray, case) -> np.ndarray:
    *_, top_k, top_p = case
    probs = torch.softmax(torch.from_numpy(np.asarray(logits, dtype=np.float64)), -1)[None]
    params = BatchSamplingParams(torch.ones(1), torch.tensor([top_k]), torch.tensor([top_p], dtype=torch.float64),
                                 torch.zeros(1, dtype=torch.float64))
    return filter_probs(probs, params)[0].numpy()


def _draft(ctx: tuple) -> np.ndarray:
    return torch.softmax(torch.from_numpy(_raw_logits(ctx, salt=2)), -1).numpy()


def _law_world(case, max_len):
    return LazyWorld(max_len, lambda ctx: _filtered(_sequential_penalised(_raw_logits(ctx, 1), ctx, case), case), _draft)


def _served_world(case, max_len, committed: tuple, relaxed: bool):
    """The rows a round from ``committed`` verifies against: ``penalise_rows`` with the committed
    output and the drafted path (``relaxed``: the committed output alone, SGLang's rows)."""

    def p(ctx):
        path = () if relaxed else ctx[len(committed):]  # relaxed: the committed output alone
        tokens = torch.tensor([[0, *path]])
        links = torch.tensor([[*range(1, len(path) + 1), -1]])
        logits = torch.from_numpy(_raw_logits(ctx, 1))[None, None].expand(1, len(path) + 1, VOCAB).contiguous()
        row = penalise_rows(logits, _penalties([committed], case, "cpu"), tokens, links, torch.full_like(links, -1))
        return _filtered(row[0, -1].numpy(), case)

    return LazyWorld(max_len, p, _draft)


def _rounds_law(case, depth, round_law, relaxed):
    max_len = PREFIX_LEN - 1 + depth
    law = _law_world(case, max_len)
    reference = exact.target_prefix_distribution(law, PREFIX_LEN)
    assert sum(mass > 1e-3 for mass in reference.values()) > 5  # a real choice at every step
    got = tree_exact.chain_rounds(
        lambda prefix: round_law(_served_world(case, max_len, prefix, relaxed), prefix), law, depth, PREFIX_LEN)
    return exact.total_variation(got, reference)


@pytest.mark.exact
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("method", ["hsd", "tokenwise"])
def test_chain_with_penalties_emits_plain_decodings_law(name, method):
    num_draft = 2

    def round_law(world, prefix):
        return exact.round_law(world, method, num_draft, prefix).emitted

    assert _rounds_law(CASES[name], num_draft, round_law, relaxed=False) < LOSSLESS_TV
    assert _rounds_law(CASES[name], num_draft, round_law, relaxed=True) > LOSSY_TV


@pytest.mark.exact
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("method", ["hsd", "target-only"])
def test_sampled_tree_with_penalties_emits_plain_decodings_law(name, method):
    topk, depth = 2, 2

    def round_law(world, prefix):
        return tree_exact.tree_round_law(world, method, topk, depth, prefix).emitted

    assert _rounds_law(CASES[name], depth, round_law, relaxed=False) < LOSSLESS_TV
    assert _rounds_law(CASES[name], depth, round_law, relaxed=True) > LOSSY_TV
