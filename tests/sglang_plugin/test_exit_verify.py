"""The server's exit level (drafts -> early exit -> target in one round) is lossless.

* exact enumeration of the round rule of ``sglang_plugin/exit_verify.py`` (exit accepts a drafts
  and draws y; the target verifies the a + 1 chain tokens and drops its bonus) over repeated
  rounds: 2-4-token prefixes equal the target's (TV ~1e-16) for every pair of methods;
* the batched torch implementation (``exit_round`` + ``target_round``) samples the exact round law
  (one round from a fixed prefix, 40k requests, TV against the enumeration);
* greedy (one-hot rows) emits the target's argmax chain.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from sglang_hsd.sglang_plugin.exit_verify import ExitLevelStats, exit_round, target_round
from sglang_hsd.verify import exact
from sglang_hsd.verify.common import ChainUniforms

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


@pytest.mark.parametrize("exit_method,target_method", list(itertools.product(METHODS, METHODS)))
@pytest.mark.parametrize("seed", [0, 1])
def test_exit_level_round_is_lossless_exactly(seed, exit_method, target_method):
    wq, wm = _worlds(seed)
    for length in (2, 3, 4):
        tv = exact.total_variation(
            three_level_prefix_distribution(wq, wm, exit_method, target_method, 2, length),
            exact.target_prefix_distribution(wq, length))
        assert tv < EXACT_TV, (length, tv)


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
    stats = ExitLevelStats()
    stats.add_round(K, 2, 6, proposal, result, target_accepted)
    assert stats.emitted == 2 + 4 and stats.layer_forwards == 2 * 4 * 2 + 7 * 4
