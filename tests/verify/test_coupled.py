"""Coupled verification (``verify/coupled.py``): a seeded request emits, for every noise value,
exactly the tokens plain seeded decoding emits, whatever was drafted; and that is the target's law.

World: vocabulary 4, target and draft logits that depend on the last two tokens (a prompt of two
tokens), float64. Plain seeded decoding draws token t by ``keyed_draw`` of the target's row at key
position t - 1. Speculative decoding runs rounds of chains or trees whose shapes change from round
to round (drawn from a generator the noise does not see, as a controller's timings would choose
them) and verifies them with the coupled rule.

Pathwise: 600 seeds x three draft schedules, every emitted token equal to plain decoding's (a
stronger statement than equal laws, and what reproducibility means). Law: the first three tokens
of 6,000 seeds through the batched rule against the target's sequence law enumerated exactly
(chi-square). Wrong variants: drafts verified with keys by round and depth (lossless in law,
rejected by the pathwise test: the text then depends on the draft lengths) and a rule that
accepts a draft among the row's two best keyed scores (rejected by the law test).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from sglang_hsd.verify.coupled import coupled_chain, coupled_tree, keyed_draw, keyed_gumbel
from sglang_hsd.verify.oracles.stats import chi_square_p_value

pytestmark = pytest.mark.exact

VOCAB = 4
PROMPT = (1, 3)
HORIZON = 3


def _world(seed: int):
    gen = torch.Generator().manual_seed(seed)
    target = torch.randn(VOCAB, VOCAB, VOCAB, generator=gen, dtype=torch.float64) * 1.5
    draft = target + torch.randn(VOCAB, VOCAB, VOCAB, generator=gen, dtype=torch.float64)
    return target.softmax(-1), draft.softmax(-1)


def _rows(table: torch.Tensor, contexts: torch.Tensor) -> torch.Tensor:
    """Rows of ``table`` [V, V, V] for contexts int64 [B, >= 2] (their last two tokens)."""
    return table[contexts[:, -2], contexts[:, -1]]


def _plain(target, seeds: torch.Tensor, length: int) -> torch.Tensor:
    """Plain seeded decoding: int64 [B, length]."""
    ctx = torch.tensor(PROMPT).expand(len(seeds), -1).clone()
    for _ in range(length):
        position = torch.full_like(seeds, ctx.shape[1] - 1)
        ctx = torch.cat([ctx, keyed_draw(_rows(target, ctx), seeds, position).unsqueeze(1)], 1)
    return ctx[:, len(PROMPT):]


def _keyed_rows(target, seeds, ctx_nodes: torch.Tensor, positions: torch.Tensor, round_keys=None):
    """The target's keyed draw at every node: ctx_nodes int64 [B, N, C] (each node's context),
    positions int64 [B, N]. ``round_keys`` (the wrong variant) replaces the positions."""
    batch, nodes, _ = ctx_nodes.shape
    rows = _rows(target, ctx_nodes.reshape(batch * nodes, -1)).view(batch, nodes, VOCAB)
    keys = positions if round_keys is None else round_keys
    return keyed_draw(rows, seeds.unsqueeze(1).expand(-1, nodes), keys)


def _spec_chains(target, draft, seeds, length, schedule, wrong_keys=False, top2=False):
    """Speculative decoding with chains of ``schedule(round)`` drafts (the same for the batch)."""
    batch = len(seeds)
    ctx = [list(PROMPT) for _ in range(batch)]
    rounds = 0
    while min(len(c) for c in ctx) < len(PROMPT) + length:
        k = schedule(rounds)
        base = torch.tensor([len(c) - 1 for c in ctx])
        chain = torch.tensor([c[-2:] for c in ctx])
        drafts = []
        for i in range(k):  # drafts drawn with the target's keys (the coupled drafter)
            drafts.append(keyed_draw(_rows(draft, chain), seeds, base + i))
            chain = torch.cat([chain, drafts[-1].unsqueeze(1)], 1)
        drafts = torch.stack(drafts, 1) if k else torch.zeros(batch, 0, dtype=torch.int64)
        nodes = torch.stack([chain[:, j:j + 2] for j in range(k + 1)], 1)
        positions = base.unsqueeze(1) + torch.arange(k + 1)
        round_keys = (10_000 + 100 * rounds + torch.arange(k + 1)).expand(batch, -1) if wrong_keys else None
        keyed = _keyed_rows(target, seeds, nodes, positions, round_keys)
        if top2:
            keyed = _top2_accepting(target, seeds, nodes, positions, drafts, keyed)
        result = coupled_chain(drafts, keyed)
        for b in range(batch):
            ctx[b] += result.tokens[b, : int(result.num_accepted[b]) + 1].tolist()
        rounds += 1
    return torch.tensor([c[len(PROMPT): len(PROMPT) + length] for c in ctx])


def _top2_accepting(target, seeds, nodes, positions, drafts, keyed):
    """The law-breaking variant: a draft among the two best keyed scores counts as the draw."""
    batch, count, _ = nodes.shape
    rows = _rows(target, nodes.reshape(batch * count, -1)).view(batch, count, VOCAB)
    scores = keyed_gumbel(seeds.repeat_interleave(count), positions.reshape(-1), VOCAB).view(batch, count, VOCAB)
    best2 = (scores + rows.log()).topk(2, dim=-1).indices
    k = drafts.shape[1]
    in_top2 = (best2[:, :k] == drafts.unsqueeze(-1)).any(-1)
    keyed = keyed.clone()
    keyed[:, :k] = torch.where(in_top2, drafts, keyed[:, :k])
    return keyed


SCHEDULES = {"fixed 3": lambda r: 3, "plain": lambda r: 0, "varying": lambda r: (0, 4, 1, 2, 5)[r % 5]}


@pytest.mark.parametrize("world", [0, 1])
def test_chains_emit_plain_seeded_decoding_pathwise(world):
    target, draft = _world(world)
    seeds = torch.arange(600, dtype=torch.int64) * 7919 + world
    plain = _plain(target, seeds, 6)
    for name, schedule in SCHEDULES.items():
        spec = _spec_chains(target, draft, seeds, 6, schedule)
        assert torch.equal(spec, plain), name


def test_round_keys_variant_depends_on_the_draft_lengths():
    target, draft = _world(0)
    seeds = torch.arange(600, dtype=torch.int64)
    a = _spec_chains(target, draft, seeds, 6, SCHEDULES["fixed 3"], wrong_keys=True)
    b = _spec_chains(target, draft, seeds, 6, SCHEDULES["varying"], wrong_keys=True)
    assert (a != b).any(dim=1).float().mean() > 0.2


def _exact_sequence_law(target, length: int) -> np.ndarray:
    law = np.zeros(VOCAB ** length)
    for index, seq in enumerate(itertools.product(range(VOCAB), repeat=length)):
        ctx, prob = list(PROMPT), 1.0
        for token in seq:
            prob *= float(target[ctx[-2], ctx[-1], token])
            ctx.append(token)
        law[index] = prob
    return law


def _law_p_value(target, sequences: torch.Tensor) -> float:
    index = torch.zeros(len(sequences), dtype=torch.int64)
    for t in range(HORIZON):
        index = index * VOCAB + sequences[:, t]
    counts = torch.bincount(index, minlength=VOCAB ** HORIZON)
    return chi_square_p_value(counts, torch.from_numpy(_exact_sequence_law(target, HORIZON)))


def test_batched_chains_follow_the_target_law():
    target, draft = _world(2)
    seeds = torch.arange(6000, dtype=torch.int64) * 104729 + 17
    spec = _spec_chains(target, draft, seeds, HORIZON, SCHEDULES["varying"])
    assert abs(_exact_sequence_law(target, HORIZON).sum() - 1.0) < 1e-12
    assert _law_p_value(target, spec) > 1e-3


def test_top2_variant_is_rejected_by_the_law_test():
    target, draft = _world(2)
    seeds = torch.arange(6000, dtype=torch.int64) * 104729 + 17
    spec = _spec_chains(target, draft, seeds, HORIZON, SCHEDULES["varying"], top2=True)
    assert _law_p_value(target, spec) < 1e-6


def _tree_round(draft, target, seeds, ctx, depth: int, width: int):
    """One tree round: each node of depth < ``depth`` gets up to ``width`` children drawn
    without replacement by the draft's keyed Gumbel-top-k (the coupled tree drafter)."""
    batch = len(seeds)
    base = torch.tensor([len(c) - 1 for c in ctx])
    tokens, parents, contexts, depths = [[c[-1]] for c in ctx], [[-1] for _ in ctx], [[c[-2:]] for c in ctx], [[0] for _ in ctx]
    for b in range(batch):
        frontier = [0]
        for level in range(depth):
            nxt = []
            for node in frontier:
                row = draft[contexts[b][node][-2], contexts[b][node][-1]]
                key = keyed_gumbel(seeds[b:b + 1], (base[b] + level).view(1), VOCAB)[0]
                for child in (row.log() + key).topk(width).indices.tolist():
                    parents[b].append(node)
                    tokens[b].append(child)
                    contexts[b].append([contexts[b][node][-1], child])
                    depths[b].append(level + 1)
                    nxt.append(len(tokens[b]) - 1)
            frontier = nxt
    cand = torch.tensor(tokens)
    par = torch.tensor(parents)
    from sglang_hsd.verify.tree.layout import links_from_parents

    first, sibling = links_from_parents(par)
    nodes_ctx = torch.tensor(contexts)
    positions = base.unsqueeze(1) + torch.tensor(depths)
    keyed = _keyed_rows(target, seeds, nodes_ctx, positions)
    return coupled_tree(cand, first, sibling, keyed, max_depth=depth)


@pytest.mark.parametrize("shape", [(1, 2), (2, 2), (3, 1), (2, 3)])
def test_trees_emit_plain_seeded_decoding_pathwise(shape):
    target, draft = _world(3)
    seeds = torch.arange(200, dtype=torch.int64) * 31 + 5
    plain = _plain(target, seeds, 5)
    ctx = [list(PROMPT) for _ in seeds]
    accepted = 0
    while min(len(c) for c in ctx) < len(PROMPT) + 5:
        result = _tree_round(draft, target, seeds, ctx, *shape)
        accepted += int(result.num_accepted.sum())
        for b in range(len(seeds)):
            ctx[b] += result.tokens[b, : int(result.num_accepted[b]) + 1].tolist()
    spec = torch.tensor([c[len(PROMPT): len(PROMPT) + 5] for c in ctx])
    assert torch.equal(spec, plain)
    assert accepted > 0


def test_keyed_draw_is_gumbel_max_of_the_row():
    probs = torch.tensor([[0.0, 0.5, 0.5, 0.0], [1.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    seeds, positions = torch.tensor([3, 4]), torch.tensor([7, 8])
    drawn = keyed_draw(probs, seeds, positions)
    assert drawn[0].item() in (1, 2) and drawn[1].item() == 0
    expected = (keyed_gumbel(seeds, positions, 4) + probs.log()).argmax(-1)
    assert torch.equal(drawn, expected)


def test_coupled_chain_respects_draft_lengths_and_shapes():
    drafts = torch.tensor([[1, 2, 3], [1, 2, 3]])
    keyed = torch.tensor([[1, 2, 3, 0], [1, 2, 3, 0]])
    result = coupled_chain(drafts, keyed, draft_lengths=torch.tensor([3, 1]))
    assert result.num_accepted.tolist() == [3, 1]
    assert result.tokens.tolist() == [[1, 2, 3, 0], [1, 2, -1, -1]]
    with pytest.raises(ValueError, match="keyed must be"):
        coupled_chain(drafts, keyed[:, :3])
