"""The windowed two-level round (drafts -> early exit -> target in one verify window) is lossless.

The rule of ``sglang_hsd/verify/window_round.py``, which the SGLang plugin's exit level and the
runtime's windowed rounds both run; pure torch, no SGLang needed.

* exact enumeration of the round rule (exit accepts a drafts
  and draws y; the target verifies the a + 1 chain tokens and drops its bonus) over repeated
  rounds: 2-4-token prefixes equal the target's (TV ~1e-16) for every pair of methods;
* the batched torch implementation (``exit_round`` + ``target_round``) samples the exact round law
  (one round from a fixed prefix, 40k requests, TV against the enumeration);
* greedy (one-hot rows) emits the target's argmax chain;
* with exit buffer N_i > 1 (exit sub-rounds inside the verify window, ``exit_sub_rounds``): exact
  enumeration of the rule over repeated rounds (TV ~1e-16, 2-4-token prefixes, K = 2 and 3,
  several N_i, every method pairing), and the batched implementation driven by tabular worlds
  samples the exact round law (chi-square, 100k requests; the same test rejects a sub-round that
  verifies its drafts against the wrong q).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from sglang_hsd.verify import ChainUniforms
from sglang_hsd.verify.oracles import exact
from sglang_hsd.verify.oracles.stats import chi_square_p_value
from sglang_hsd.verify.window_round import exit_round, exit_sub_rounds, target_round

METHODS = ("hsd", "tokenwise")
EXACT_TV = 1e-12
# 40k sampled rounds over <= 3^3 outcomes: the TV of an exact sampler stays below ~0.02.
SAMPLED_TV = 0.03


def _worlds(seed: int, vocab: int = 3, max_len: int = 7):
    """(q world: draft rows, m world: exit rows; both carry the same target p)."""
    base = exact.random_world(vocab, max_len, seed=seed)
    other = exact.random_world(vocab, max_len, seed=seed + 100)
    m = 0.6 * base.target + 0.4 * other.target
    return base, exact.TabularWorld(vocab, max_len, base.target, m / m.sum(-1, keepdims=True))


def three_level_round_law(wq, wm, exit_method, target_method, num_draft, prefix=()):
    """Exact law {emitted block: probability} of one round of the exit-level rule."""
    exit_law, target_law = exact.OUTCOME_LAWS[exit_method], exact.OUTCOME_LAWS[target_method]
    law: dict[tuple[int, ...], float] = {}
    for draft in itertools.product(range(wq.vocab_size), repeat=num_draft):
        contexts = [prefix + draft[:t] for t in range(num_draft + 1)]
        q_rows = np.stack([wq.q(c) for c in contexts[:-1]])
        draft_prob = float(np.prod([q_rows[t][x] for t, x in enumerate(draft)]))
        m_rows = np.stack([wm.q(c) for c in contexts])
        for (accepted, y), p_exit in exit_law(m_rows, q_rows, draft).items():
            chain = draft[:accepted] + (y,)
            chain_ctx = [prefix + chain[:t] for t in range(len(chain) + 1)]
            chain_q = np.stack([wm.q(c) for c in chain_ctx[:-1]])
            chain_p = np.stack([wm.p(c) for c in chain_ctx])
            for (tau, z), p_target in target_law(chain_p, chain_q, chain).items():
                block = chain if tau == len(chain) else chain[:tau] + (z,)
                law[block] = law.get(block, 0.0) + draft_prob * p_exit * p_target
    return law


def three_level_prefix_distribution(wq, wm, exit_method, target_method, num_draft, length):
    done, frontier = {}, {(): 1.0}
    while frontier:
        following = {}
        for prefix, mass in frontier.items():
            law = three_level_round_law(wq, wm, exit_method, target_method, num_draft, prefix)
            for block, prob in law.items():
                extended = (prefix + block)[:length]
                bucket = done if len(extended) == length else following
                bucket[extended] = bucket.get(extended, 0.0) + mass * prob
        frontier = following
    return done


@pytest.mark.exact
@pytest.mark.parametrize("exit_method,target_method", list(itertools.product(METHODS, METHODS)))
@pytest.mark.parametrize("seed", [0, 1])
def test_exit_level_round_is_lossless_exactly(seed, exit_method, target_method):
    wq, wm = _worlds(seed)
    for length in (2, 3, 4):
        tv = exact.total_variation(
            three_level_prefix_distribution(wq, wm, exit_method, target_method, 2, length),
            exact.target_prefix_distribution(wq, length))
        assert tv < EXACT_TV, (length, tv)


@pytest.mark.exact
def test_exit_level_round_with_three_drafts_is_lossless_exactly():
    wq, wm = _worlds(5, max_len=8)
    tv = exact.total_variation(three_level_prefix_distribution(wq, wm, "hsd", "hsd", 3, 3),
                               exact.target_prefix_distribution(wq, 3))
    assert tv < EXACT_TV, tv


def _sample_rounds(wq, wm, num_draft, batch, exit_method, target_method, seed):
    """Run the torch implementation for ``batch`` requests from the empty prefix."""
    gen = torch.Generator().manual_seed(seed)
    V = wq.vocab_size
    drafts = torch.zeros(batch, num_draft, dtype=torch.long)
    q = torch.zeros(batch, num_draft, V, dtype=torch.float64)
    for t in range(num_draft):
        rows = torch.tensor(np.stack([wq.q(tuple(d[:t].tolist())) for d in drafts]))
        q[:, t] = rows
        drafts[:, t] = torch.multinomial(rows, 1, generator=gen).squeeze(-1)

    def rows_for(world_rows, tokens, lengths):
        return torch.tensor(np.stack([
            np.stack([world_rows(tuple(tok[:j].tolist())) for j in range(num_draft + 1)])
            for tok in tokens]))

    m = rows_for(wm.q, drafts, None)
    proposal = exit_round(drafts, q, m, exit_method,
                          ChainUniforms.draw(batch, num_draft, "cpu", gen), validate=True)
    chain = proposal.chain_tokens.clamp_min(0)
    proposal.chain_probs = rows_for(wm.q, chain, None)
    p = rows_for(wm.p, chain, None)
    result, _ = target_round(proposal, p, target_method,
                             ChainUniforms.draw(batch, num_draft + 1, "cpu", gen), validate=True)
    return result


@pytest.mark.statistical
@pytest.mark.parametrize("exit_method,target_method", [("hsd", "hsd"), ("tokenwise", "hsd")])
def test_torch_round_samples_the_exact_round_law(exit_method, target_method):
    wq, wm = _worlds(3)
    num_draft, batch = 2, 40000
    result = _sample_rounds(wq, wm, num_draft, batch, exit_method, target_method, seed=0)
    counts: dict[tuple[int, ...], float] = {}
    for n, row in zip(result.num_accepted.tolist(), result.tokens.tolist()):
        block = tuple(row[: n + 1])
        counts[block] = counts.get(block, 0.0) + 1.0 / batch
    expected = three_level_round_law(wq, wm, exit_method, target_method, num_draft)
    assert exact.total_variation(counts, expected) < SAMPLED_TV


def test_greedy_rows_emit_the_target_argmax_chain():
    V, K = 5, 3
    eye = torch.eye(V, dtype=torch.float64)
    drafts = torch.tensor([[1, 2, 3], [1, 2, 3]])
    exit_argmax = torch.tensor([[1, 2, 4, 0], [1, 2, 3, 4]])  # row 0: exit rejects d_3
    target_argmax = torch.tensor([[1, 0, 0, 0], [1, 2, 3, 4]])
    proposal = exit_round(drafts, eye[drafts], eye[exit_argmax], "hsd",
                          ChainUniforms(torch.full((2, K), 0.5), torch.full((2,), 0.5)))
    assert proposal.chain_len.tolist() == [3, 4]
    assert proposal.chain_tokens[0, :3].tolist() == [1, 2, 4]
    result, target_accepted = target_round(
        proposal, eye[target_argmax], "hsd",
        ChainUniforms(torch.full((2, K + 1), 0.5), torch.full((2,), 0.5)))
    # Row 0: target keeps c_1 = 1, rejects c_2 = 2 and emits its argmax 0.
    assert result.num_accepted.tolist() == [1, 3]
    assert result.tokens[0, :2].tolist() == [1, 0]
    # Row 1: the target accepts the whole chain (1, 2, 3, y = 4) and adds no bonus.
    assert result.tokens[1].tolist() == [1, 2, 3, 4]
    assert target_accepted.tolist() == [1, 4]


# ---------------------------------------------------------------------------------------------
# Exit buffer N_i > 1: exit sub-rounds inside the verify window (``exit_sub_rounds``)
# ---------------------------------------------------------------------------------------------


def windowed_round_law(wq, wm, exit_method, target_method, num_draft, buffer, prefix=(),
                       stop_token=None):
    """Exact law {emitted block: probability} of one round with exit buffer N_i = ``buffer``:
    sub-rounds draft K - n tokens after the n provisional ones (q from ``wq`` given everything
    before) until n >= min(N_i, K) or the chain holds ``stop_token``; the target then verifies the
    n tokens, no bonus."""
    exit_law, target_law = exact.OUTCOME_LAWS[exit_method], exact.OUTCOME_LAWS[target_method]
    law: dict[tuple[int, ...], float] = {}

    def target_phase(chain, mass):
        contexts = [prefix + chain[:t] for t in range(len(chain) + 1)]
        chain_q = np.stack([wm.q(c) for c in contexts[:-1]])
        chain_p = np.stack([wm.p(c) for c in contexts])
        for (tau, z), p_target in target_law(chain_p, chain_q, chain).items():
            block = chain if tau == len(chain) else chain[:tau] + (z,)
            law[block] = law.get(block, 0.0) + mass * p_target

    def sub_round(chain, mass):
        n = len(chain)
        if n and (n >= buffer or n >= num_draft or stop_token in chain):
            target_phase(chain, mass)
            return
        count = num_draft - n
        for draft in itertools.product(range(wq.vocab_size), repeat=count):
            contexts = [prefix + chain + draft[:t] for t in range(count + 1)]
            q_rows = np.stack([wq.q(c) for c in contexts[:-1]])
            draft_prob = float(np.prod([q_rows[t][x] for t, x in enumerate(draft)]))
            m_rows = np.stack([wm.q(c) for c in contexts])
            for (accepted, y), p_exit in exit_law(m_rows, q_rows, draft).items():
                sub_round(chain + draft[:accepted] + (y,), mass * draft_prob * p_exit)

    sub_round((), 1.0)
    return law


def windowed_prefix_distribution(wq, wm, exit_method, target_method, num_draft, buffer, length,
                                 stop_token=None):
    laws = {}
    done, frontier = {}, {(): 1.0}
    while frontier:
        following = {}
        for prefix, mass in frontier.items():
            if prefix not in laws:
                laws[prefix] = windowed_round_law(wq, wm, exit_method, target_method, num_draft,
                                                  buffer, prefix, stop_token)
            for block, prob in laws[prefix].items():
                extended = (prefix + block)[:length]
                bucket = done if len(extended) == length else following
                bucket[extended] = bucket.get(extended, 0.0) + mass * prob
        frontier = following
    return done


def _marginal(distribution, length):
    out: dict[tuple[int, ...], float] = {}
    for prefix, prob in distribution.items():
        out[prefix[:length]] = out.get(prefix[:length], 0.0) + prob
    return out


@pytest.mark.exact
@pytest.mark.parametrize("num_draft,buffer", [(2, 2), (2, 3), (3, 4)])
@pytest.mark.parametrize("exit_method,target_method",
                         [("hsd", "hsd"), ("tokenwise", "hsd"), ("hsd", "tokenwise")])
def test_exit_sub_rounds_are_lossless_exactly(num_draft, buffer, exit_method, target_method):
    wq, wm = _worlds(7, max_len=4 + num_draft + 1)
    longest = 4 if num_draft == 2 else 3
    full = windowed_prefix_distribution(wq, wm, exit_method, target_method, num_draft, buffer,
                                        longest)
    for length in range(2, longest + 1):
        tv = exact.total_variation(_marginal(full, length),
                                   exact.target_prefix_distribution(wq, length))
        assert tv < EXACT_TV, (length, tv)


@pytest.mark.exact
def test_exit_sub_rounds_stopping_at_a_stop_token_are_lossless_exactly():
    wq, wm = _worlds(8, max_len=7)
    full = windowed_prefix_distribution(wq, wm, "hsd", "hsd", 3, 4, 3, stop_token=1)
    assert exact.total_variation(full, exact.target_prefix_distribution(wq, 3)) < EXACT_TV
    assert windowed_round_law(wq, wm, "hsd", "hsd", 3, 4, stop_token=1) != pytest.approx(
        windowed_round_law(wq, wm, "hsd", "hsd", 3, 4))  # the stop rule changes the round


def test_exit_sub_rounds_stop_at_budget_and_stop_tokens():
    """``remaining`` and ``stop_ids`` end a request's sub-rounds early (greedy rows, K = 4)."""
    V, K = 6, 4
    eye = torch.eye(V, dtype=torch.float64)
    drafts = torch.tensor([[1, 2, 3, 4]] * 3)
    exit_argmax = torch.tensor([[5, 0, 0, 0, 0]] * 3)  # the exit rejects d_1 and proposes 5
    first = exit_round(drafts, None, eye[exit_argmax], "greedy",
                       ChainUniforms(torch.zeros(3, K), torch.zeros(3)))
    calls = []

    def draft(reqs, last_token, last, counts, sub_round):
        calls.append(reqs.tolist())
        k = int(counts.max())
        return torch.full((reqs.shape[0], k), 2), None

    def exit_rows(reqs, last, run_tokens, counts):
        return eye[torch.full((reqs.shape[0], K + 1), 3)]  # rejects every draft, proposes 3

    proposal = exit_sub_rounds(first, K + 1, "greedy", draft, exit_rows,
                               lambda reqs, j, k: ChainUniforms(torch.zeros(len(reqs), k),
                                                                torch.zeros(len(reqs))),
                               remaining=torch.tensor([10, 2, 10]),
                               stop_ids=torch.tensor([[-1, -1], [-1, -1], [5, 7]]))
    # row 0 runs to n = K, row 1 stops at its budget of 2, row 2 at its stop token 5 (c_1)
    assert proposal.chain_len.tolist() == [4, 2, 1]
    assert proposal.chain_tokens[0, :4].tolist() == [5, 3, 3, 3]
    assert calls == [[0, 1], [0], [0]]


@pytest.mark.exact
def test_exit_sub_round_law_differs_from_a_single_sub_round():
    """The enumeration sees the sub-rounds: their round law is not the one-sub-round law (and
    a rule that forgot to verify the continuation drafts would not be lossless)."""
    wq, wm = _worlds(7, max_len=7)
    single = three_level_round_law(wq, wm, "hsd", "hsd", 3)
    windowed = windowed_round_law(wq, wm, "hsd", "hsd", 3, 4)
    assert windowed_round_law(wq, wm, "hsd", "hsd", 3, 1) == pytest.approx(single)
    assert exact.total_variation(single, windowed) > 0.01
    assert max(len(block) for block in windowed) == 4 > max(len(block) for block in single) - 1


def _table_rows(table: np.ndarray, vocab: int, tokens: torch.Tensor) -> torch.Tensor:
    """Rows of a ``TabularWorld`` table for every prefix tokens[:, :j], j = 0..T: [A, T + 1, V]."""
    batch, length = tokens.shape
    codes = torch.zeros(batch, length + 1, dtype=torch.long)
    value = torch.zeros(batch, dtype=torch.long)
    for j in range(length + 1):
        codes[:, j] = exact.prefix_offset(vocab, j) + value
        if j < length:
            value = value * vocab + tokens[:, j]
    return torch.from_numpy(table)[codes]


def _sample_windowed_rounds(wq, wm, num_draft, buffer, batch, exit_method, target_method, seed):
    """One round of ``exit_round`` + ``exit_sub_rounds`` + ``target_round`` for ``batch``
    requests from the empty prefix, with tabular callbacks in place of the model forwards."""
    gen = torch.Generator().manual_seed(seed)
    V, width = wq.vocab_size, num_draft + 1
    window = torch.zeros(batch, width, dtype=torch.long)  # index j: token at position j (0: root)

    def sample_after(context: torch.Tensor, count: int):
        tokens = torch.zeros(context.shape[0], count, dtype=torch.long)
        q = torch.zeros(context.shape[0], count, V, dtype=torch.float64)
        for t in range(count):
            rows = _table_rows(wq.draft, V, torch.cat([context, tokens[:, :t]], 1))[:, -1]
            q[:, t] = rows
            tokens[:, t] = torch.multinomial(rows, 1, generator=gen).squeeze(-1)
        return tokens, q

    drafts, q = sample_after(window[:, :0], num_draft)
    window[:, 1:] = drafts
    table = _table_rows(wm.draft, V, window[:, 1:])
    first = exit_round(drafts, q, table, exit_method,
                       ChainUniforms.draw(batch, num_draft, "cpu", gen), validate=True)

    def draft(reqs, last_token, last, counts, sub_round):
        k_max = int(counts.max())
        out = torch.full((reqs.shape[0], k_max), -1, dtype=torch.long)
        q_out = torch.zeros(reqs.shape[0], k_max, V, dtype=torch.float64)
        for n in last.unique().tolist():  # requests with the same n share a context length
            rows = (last == n).nonzero().squeeze(-1)
            # c_1..c_{n-1} sit at window indices 1..n-1 (accepted drafts are written there)
            context = torch.cat([window[reqs[rows], 1:n], last_token[rows, None]], 1)
            tokens, q_rows = sample_after(context, num_draft - n)
            out[rows, : num_draft - n], q_out[rows, : num_draft - n] = tokens, q_rows
        return out, q_out

    def exit_rows(reqs, last, run_tokens, counts):
        span = torch.arange(run_tokens.shape[1]).unsqueeze(0)
        in_run = span <= counts.unsqueeze(1)
        index = (last.unsqueeze(1) + span).clamp(max=num_draft)
        rows = reqs.unsqueeze(1).expand_as(index)
        window[rows[in_run], index[in_run]] = run_tokens[in_run]
        return _table_rows(wm.draft, V, window[reqs, 1:])

    def uniforms(reqs, sub_round, k_max):
        return ChainUniforms.draw(reqs.shape[0], k_max, "cpu", gen)

    proposal = exit_sub_rounds(first, buffer, exit_method, draft, exit_rows, uniforms,
                               validate=True)
    chain = proposal.chain_tokens.clamp_min(0)
    p = _table_rows(wm.target, V, chain)[:, :width]  # row j: p given c_1..c_j
    result, _ = target_round(proposal, p, target_method,
                             ChainUniforms.draw(batch, width, "cpu", gen), validate=True)
    return result, proposal


def _round_p_value(result, law) -> float:
    """Chi-square p-value of the sampled blocks (accepted drafts + last token) against ``law``."""
    blocks = sorted(law)
    index = {block: i for i, block in enumerate(blocks)}
    observed = torch.zeros(len(blocks))
    for n, row in zip(result.num_accepted.tolist(), result.tokens.tolist()):
        observed[index[tuple(row[: n + 1])]] += 1  # a block outside the law raises KeyError
    return chi_square_p_value(observed, torch.tensor([law[b] for b in blocks]))


@pytest.mark.statistical
@pytest.mark.parametrize("num_draft,buffer,exit_method,target_method",
                         [(2, 3, "hsd", "hsd"), (3, 4, "hsd", "hsd"), (3, 4, "tokenwise", "hsd")])
def test_torch_sub_rounds_sample_the_exact_round_law(num_draft, buffer, exit_method, target_method):
    wq, wm = _worlds(3, max_len=num_draft + 2)
    result, proposal = _sample_windowed_rounds(wq, wm, num_draft, buffer, 100_000, exit_method,
                                               target_method, seed=0)
    assert int((proposal.sub_accepted >= 0).sum(1).max()) > 1  # some requests ran sub-rounds
    law = windowed_round_law(wq, wm, exit_method, target_method, num_draft, buffer)
    assert _round_p_value(result, law) > 1e-3


@pytest.mark.statistical
def test_torch_sub_rounds_test_catches_a_wrong_draft_q(monkeypatch):
    """The same test fails when the continuation drafts are verified against a q they were not
    drawn from (uniform), i.e. it can tell a biased sub-round from the exact one."""
    from sglang_hsd.verify import window_round

    real = window_round.exit_round

    def wrong_q(drafts, q, m, method, uniforms, validate=False, draft_lengths=None):
        if draft_lengths is not None:
            q = torch.full_like(q, 1.0 / q.shape[-1])
        return real(drafts, q, m, method, uniforms, draft_lengths=draft_lengths)

    monkeypatch.setattr(window_round, "exit_round", wrong_q)
    wq, wm = _worlds(3, max_len=5)
    result, _ = _sample_windowed_rounds(wq, wm, 3, 4, 100_000, "hsd", "hsd", seed=0)
    assert _round_p_value(result, windowed_round_law(wq, wm, "hsd", "hsd", 3, 4)) < 1e-6
