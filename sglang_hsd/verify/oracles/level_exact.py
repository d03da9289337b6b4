"""Exact law of the server's whole round with the level-synchronous drafter (``tree/level_draft.py``).

Not a re-derivation: the batched ``LevelDrafter`` itself is run on every drafting outcome. Its
draws are inverse-CDF on pre-drawn uniforms, one per pool slot; the outcomes are enumerated slot
level by level: a run of the drafter shows the q rows of the level's forwarded nodes, and every
batch row splits into one row per ordered sequence of the node's k draws (without replacement),
each uniform in the middle of its token's CDF interval given the earlier draws, the row's
probability multiplied by the draws' shares. Deterministic rows and padding beams do not split.
A last run gives every outcome's tree (the pool layout's verify-layout links and q rows); equal
trees are merged and each gets the verifier's exact law (``tree_exact``, ``drafting="fixed"``,
with the tree's own q rows), which ``tests/verify/tree/test_exact.py`` ties to ``verify_tree``.

The draft model is the world's q read at a context: ``"path"`` (the node's path, what a draft model
with exact KV gives) or ``"slot"`` (the tokens fed to the same beam slot at earlier forwards, as
SGLang's per-slot draft KV cache gives beams whose parent sat in another slot). The verifier reads
the q rows the drafter recorded, so both are lossless; ``"slot"`` checks that nothing assumes
exact draft contexts.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from sglang_hsd.verify.oracles.exact import RoundLaw, TabularWorld, prefix_offset, target_prefix_distribution, total_variation
from sglang_hsd.verify.oracles.tree_exact import chain_rounds
from sglang_hsd.verify.oracles.tree_exact import rrs_outcomes, traversal_outcomes
from sglang_hsd.verify.tree.expand import ExpandConfig
from sglang_hsd.verify.tree.level_draft import LevelDrafter, LevelTree

CONTEXTS = ("path", "slot")
QFn = Callable[[torch.Tensor], torch.Tensor]  # paths int64 [B, M, L] (column 0: root) -> q float [B, M, V]


def drive(drafter: LevelDrafter, q_fn: QFn, root_tokens: torch.Tensor, context: str = "path") -> LevelTree:
    """Run the draft loop as the server does: ``q_fn`` plays the draft model on each forward.

    Args:
        root_tokens: int64 [B], column 0 of the contexts handed to ``q_fn``.
        context: ``"path"``: a beam's context is its parent beam's (``hidden_rows``) plus its
            token; ``"slot"``: the same beam slot's previous context plus its token.
    """
    if context not in CONTEXTS:
        raise ValueError(f"context must be one of {CONTEXTS}, got {context!r}")
    k = drafter.cfg.topk
    step = drafter.first()
    contexts = root_tokens.view(-1, 1)  # [B, 1] before forward 0, then [B * k, level + 2]
    while step is not None:
        if context == "path" or contexts.shape[0] != step.input_ids.shape[0]:
            parent = contexts[step.hidden_rows]
        else:
            parent = contexts
        contexts = torch.cat([parent, step.input_ids.view(-1, 1)], 1)
        q_rows = q_fn(contexts.view(-1, k, contexts.shape[1])).reshape(contexts.shape[0], -1)
        step = drafter.step(q_rows)
    return drafter.finish()


def table_q_fn(world: TabularWorld, prefix: tuple) -> QFn:
    """q rows of ``world`` after ``prefix`` plus the drafted part of each context (column 0 skipped)."""
    vocab = world.vocab_size
    table = torch.as_tensor(world.draft, dtype=torch.float64)
    prefix_value = sum(t * vocab ** (len(prefix) - 1 - i) for i, t in enumerate(prefix))

    def q_fn(paths: torch.Tensor) -> torch.Tensor:
        drafted = paths[..., 1:]
        n = drafted.shape[-1]
        place = vocab ** torch.arange(n - 1, -1, -1)
        code = prefix_offset(vocab, len(prefix) + n) + prefix_value * vocab**n + (drafted * place).sum(-1)
        return table[code]

    return q_fn


def _run(world, prefix, rule, cfg, uniforms, deterministic, context) -> tuple[LevelDrafter, LevelTree]:
    rows = uniforms.shape[0]
    root_q = torch.as_tensor(world.q(tuple(prefix)), dtype=torch.float64).expand(rows, -1).clone()
    drafter = LevelDrafter(cfg, rule, root_q, torch.full((rows,), deterministic), uniforms=uniforms, validate=False)
    tree = drive(drafter, table_q_fn(world, tuple(prefix)), torch.zeros(rows, dtype=torch.long), context)
    return drafter, tree


def _split_forward(state, uniforms, probs, source, f: int):
    """Split every row on the k draws of forwarded node f: one row per ordered draw sequence.

    ``source`` int64 [R]: the row of ``state`` (the last run) each current row continues."""
    k = state.cfg.topk
    remaining = state.fwd_q[source, f].double().clone()
    vocab = torch.arange(remaining.shape[1])
    may_split = state.fwd_active[source, f] & ~state.deterministic[source]
    for j in range(k):
        total = remaining.sum(-1, keepdim=True)
        splits = may_split & (total.squeeze(-1) > 0)
        share = torch.where(total > 0, remaining / total.clamp_min(1e-300), 0.0)
        middle = share.cumsum(-1) - share / 2
        choice = torch.where(splits.unsqueeze(-1), share > 0, vocab == 0)  # [R, V]
        row, token = choice.nonzero(as_tuple=True)
        uniforms, source, may_split = uniforms[row].clone(), source[row], may_split[row]
        uniforms[:, f, j] = torch.where(splits[row], middle[row, token], uniforms[:, f, j])
        probs = probs[row] * torch.where(splits[row], share[row, token], 1.0)
        remaining = remaining[row].clone()
        remaining[torch.arange(row.shape[0]), token] = torch.where(splits[row], 0.0, remaining[torch.arange(row.shape[0]), token])
    return uniforms, probs, source


def draft_law(world, prefix, rule: str, cfg: ExpandConfig, deterministic=False, context="path") -> list[tuple[float, LevelTree]]:
    """Every tree ``LevelDrafter`` can draft from ``prefix``: [(probability, one-row LevelTree)], merged."""
    num_fwd = 1 + cfg.topk * (cfg.depth - 1)
    uniforms = torch.full((1, num_fwd, cfg.topk), 0.5, dtype=torch.float64)
    probs = torch.ones(1, dtype=torch.float64)
    for level in range(cfg.depth):  # the q rows of a level's forwards are known after one run
        drafter, _ = _run(world, prefix, rule, cfg, uniforms, deterministic, context)
        source = torch.arange(probs.shape[0])
        forwards = [0] if level == 0 else range(1 + (level - 1) * cfg.topk, 1 + level * cfg.topk)
        for f in forwards:
            uniforms, probs, source = _split_forward(drafter.state, uniforms, probs, source, f)
    _, tree = _run(world, prefix, rule, cfg, uniforms, deterministic, context)
    # Merge equal trees: same tokens, links and q rows of the nodes with children.
    has_children = (tree.retrive_next_token >= 0).unsqueeze(-1)
    key = torch.cat([tree.candidates.double(), tree.retrive_next_token.double(), tree.retrive_next_sibling.double(),
                     torch.where(has_children, tree.draft_probs.double(), 0.0).flatten(1)], 1)
    unique, inverse = torch.unique(key, dim=0, return_inverse=True)
    merged = torch.zeros(unique.shape[0], dtype=torch.float64).index_add_(0, inverse, probs)
    first_row = torch.full((unique.shape[0],), probs.shape[0], dtype=torch.long).scatter_reduce_(
        0, inverse, torch.arange(probs.shape[0]), "amin")
    return [(float(merged[u]), _row(tree, int(first_row[u]))) for u in range(unique.shape[0])]


def _row(tree: LevelTree, r: int) -> LevelTree:
    return LevelTree(*(getattr(tree, name)[r : r + 1] for name in LevelTree.__dataclass_fields__))


class _TreeWorld:
    """The world's p with the drafted tree's own q rows (keyed by context)."""

    def __init__(self, world: TabularWorld, rows: dict):
        self.world, self.rows, self.vocab_size = world, rows, world.vocab_size

    def p(self, ctx):
        return self.world.p(ctx)

    def q(self, ctx):
        return self.rows.get(ctx, np.zeros(self.vocab_size))


def _verify_view(world, prefix: tuple, tree: LevelTree, reported_q=None):
    """(``_TreeWorld``, nested shape) of a one-row tree, read from its verify-layout links.

    ``reported_q``: a world whose q rows the verifier is given instead of the tree's own rows."""
    first, sibling = tree.retrive_next_token[0].tolist(), tree.retrive_next_sibling[0].tolist()
    tokens, probs = tree.candidates[0].tolist(), tree.draft_probs[0].double().numpy()
    rows = {}

    def shape_of(node: int, ctx: tuple) -> tuple:
        rows[ctx] = probs[node] if reported_q is None else reported_q.q(ctx)
        children, child = [], first[node]
        while child >= 0:
            children.append((tokens[child], shape_of(child, ctx + (tokens[child],))))
            child = sibling[child]
        return tuple(children)

    shape = shape_of(0, tuple(prefix))
    return _TreeWorld(world, rows), shape


VERIFIERS = {"hsd": traversal_outcomes, "rrs": rrs_outcomes}


def level_round_law(world, rule: str, cfg: ExpandConfig, prefix=(), method="hsd", deterministic=False, context="path",
                    drafts: list | None = None, reported_q=None) -> RoundLaw:
    """Exact law of one round: ``draft_law`` x the verifier's exact law on each tree (bonus included).

    ``drafts``: ``draft_law``'s output for this prefix, when already computed. ``reported_q``: a
    world whose q the verifier reads instead of the rows the children were drawn from (a wrong
    variant: a drafter that reports another q than it sampled)."""
    if drafts is None:
        drafts = draft_law(world, tuple(prefix), rule, cfg, deterministic, context)
    emitted: dict = {}
    expected = 0.0
    for tree_prob, tree in drafts:
        tree_world, shape = _verify_view(world, tuple(prefix), tree, reported_q)
        for (path, nxt), prob in VERIFIERS[method](tree_world, tuple(prefix), None, None, "fixed", shape=shape).items():
            emitted[path + (nxt,)] = emitted.get(path + (nxt,), 0.0) + tree_prob * prob
            expected += tree_prob * prob * len(path)
    return RoundLaw(emitted, expected)


def level_prefix_tv(world, rule, cfg: ExpandConfig, length: int, methods=("hsd",), deterministic=False,
                    context="path", reported_q=None) -> dict[str, float]:
    """{method: TV between the emitted and the target law of the first ``length`` tokens} (chained
    rounds; the drafting law of each prefix is enumerated once for all ``methods``; ``reported_q``
    as in ``level_round_law``)."""
    drafts: dict = {}

    def round_law(method):
        def law(prefix):
            if prefix not in drafts:
                drafts[prefix] = draft_law(world, prefix, rule, cfg, deterministic, context)
            return level_round_law(world, rule, cfg, prefix, method, drafts=drafts[prefix],
                                   reported_q=reported_q).emitted
        return law

    target = target_prefix_distribution(world, length)
    return {method: total_variation(chain_rounds(round_law(method), world, cfg.depth, length), target) for method in methods}
