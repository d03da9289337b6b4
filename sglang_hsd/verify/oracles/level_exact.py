"""Exact law of the server's whole round with the level-synchronous drafter (``sglang_hsd/tree_draft/``).

Not a re-derivation: the batched ``LevelDrafter`` itself is run on every drafting outcome. Its
children come from a child sampler fed by noise; here the noise is chosen (``TableNoise``) so that
the sampler draws one given ordered sequence, and each sequence is weighted by the sampler's law:
Plackett-Luce for ``inverse_cdf`` and ``gumbel_topk`` (draws without replacement, which
``tests/tree_draft/test_noise.py`` checks the keyed noise samples), q's argmax then Plackett-Luce
on the rest for ``argmax_first_cdf`` and ``argmax_first``, i.i.d. for ``with_replacement``. The
crafted noise of a uniform-fed sampler puts u_j in the middle of t_j's interval of the cumulative
mass of the tokens not drawn before it. Outcomes
are enumerated level by level: a run of the drafter shows the q rows of the level's forwarded
nodes, and every batch row splits into one row per ordered draw sequence of a node, the row's
probability multiplied by the sequence's. Deterministic rows and padding beams do not split. A
last run gives every outcome's tree (the pool layout's verify-layout links and q rows); equal
trees are merged and each gets the verifier's exact law (``tree_exact``, ``drafting="fixed"``,
with the tree's own q rows; ``"fixed-argmax-first"`` for argmax-first samplers), which
``tests/verify/tree/test_exact.py`` ties to ``verify_tree``.

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
from sglang_hsd.tree_draft import (
    CHILD_SAMPLERS, DEFAULT_CHILD_SAMPLER, DraftPlan, LevelDrafter, LevelTree, TableNoise, TreeShape, forward_slice,
)

CONTEXTS = ("path", "slot")
# The law of each child sampler (``tree_draft.CHILD_SAMPLERS``, ``_ordered_draws``).
SAMPLER_LAWS = {"inverse_cdf": "without-replacement", "argmax_first_cdf": "argmax-first",
                "gumbel_topk": "without-replacement", "with_replacement": "with-replacement",
                "argmax_first": "argmax-first"}
# verify_tree's draft mode -> the ``tree_exact`` drafting of one given tree verified that way.
FIXED_DRAFTING = {"without-replacement": "fixed", "argmax-first": "fixed-argmax-first"}
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
    k = drafter.shape.topk
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


def _run(world, prefix, plan: DraftPlan, noise: torch.Tensor, deterministic, context) -> tuple[LevelDrafter, LevelTree]:
    rows = noise.shape[0]
    root_q = torch.as_tensor(world.q(tuple(prefix)), dtype=torch.float64).expand(rows, -1).clone()
    drafter = LevelDrafter(plan, root_q, torch.full((rows,), deterministic), TableNoise(noise, plan.shape.topk))
    tree = drive(drafter, table_q_fn(world, tuple(prefix)), torch.zeros(rows, dtype=torch.long), context)
    return drafter, tree


def _ordered_draws(q: torch.Tensor, k: int, law: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every ordered sequence of k draws from each row of ``q`` (float64 [R, V]) and its probability.

    Without replacement (the law of Gumbel top-k, ``tree_draft/noise.py``): P(t_1..t_m) =
    prod_j q(t_j) / (remaining mass before draw j), m = min(k, #positive q); argmax-first: t_1 =
    argmax q with probability 1, then the same; with replacement: prod_j q(t_j) / sum q. Returns (source row int64 [R'], tokens int64 [R', k] (-1 past the
    support), probability float64 [R'])."""
    source = torch.arange(q.shape[0])
    tokens = torch.full((q.shape[0], k), -1, dtype=torch.long)
    probs = torch.ones(q.shape[0], dtype=torch.float64)
    remaining = q.clone()
    vocab = torch.arange(q.shape[1])
    for j in range(k):
        total = remaining.sum(-1, keepdim=True)
        splits = total.squeeze(-1) > 0
        share = torch.where(total > 0, remaining / total.clamp_min(1e-300), 0.0)
        if j == 0 and law == "argmax-first":  # the drafter's argmax (first maximum, as torch's)
            share = torch.zeros_like(share).scatter(1, remaining.argmax(-1, keepdim=True), 1.0)
        choice = torch.where(splits.unsqueeze(-1), share > 0, vocab == 0)  # [R, V]
        row, token = choice.nonzero(as_tuple=True)
        source, tokens, remaining = source[row], tokens[row].clone(), remaining[row].clone()
        tokens[:, j] = torch.where(splits[row], token, -1)
        probs = probs[row] * torch.where(splits[row], share[row, token], 1.0)
        if law != "with-replacement":
            at = torch.arange(row.shape[0])
            remaining[at, token] = torch.where(splits[row], 0.0, remaining[at, token])
    return source, tokens, probs


def _noise_for(q: torch.Tensor, tokens: torch.Tensor, draws: int) -> torch.Tensor:
    """Gumbel noise [R, S, V] under which the sampler draws ``tokens`` (int64 [R, k], -1 none):
    every positive-q key log q + g becomes 0 but a bonus; with one noise vector (top-k) the j-th
    token's bonus is k - j, with one vector per draw (with replacement) draw j's token gets 1."""
    k = tokens.shape[1]
    base = torch.where(q > 0, -torch.log(q.clamp_min(1e-300)), 0.0)  # [R, V]
    noise = base.unsqueeze(1).repeat(1, draws, 1)
    for j in range(k):
        valid = tokens[:, j] >= 0
        slot = 0 if draws == 1 else j
        at = torch.arange(q.shape[0])
        bonus = float(k - j) if draws == 1 else 1.0
        noise[at, slot, tokens[:, j].clamp_min(0)] += torch.where(valid, bonus, 0.0)
    return noise


def _uniforms_for(q: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Uniforms [R, k] under which a sequential sampler draws ``tokens`` (int64 [R, k], -1 none):
    u_j in the middle of t_j's interval of the cumulative mass of the tokens not drawn before it
    (0.5 where there is no draw j, and for a first token the sampler fixes itself)."""
    remaining = q.clone()
    at = torch.arange(q.shape[0])
    uniforms = torch.full(tokens.shape, 0.5, dtype=torch.float64)
    for j in range(tokens.shape[1]):
        token = tokens[:, j].clamp_min(0)
        before = torch.where(torch.arange(q.shape[1]) < token.unsqueeze(-1), remaining, 0.0).sum(-1)
        total = remaining.sum(-1)
        middle = (before + 0.5 * remaining[at, token]) / total.clamp_min(1e-300)
        uniforms[:, j] = torch.where(tokens[:, j] >= 0, middle, 0.5)
        remaining[at, token] = torch.where(tokens[:, j] >= 0, 0.0, remaining[at, token])
    return uniforms


def _split_forward(state, plan: DraftPlan, noise, probs, source, f: int):
    """Split every row on the k draws of forwarded node f: one row per ordered draw sequence,
    its noise set to produce that sequence (``source`` int64 [R]: the row of ``state``, the last
    run, each current row continues). Deterministic rows and inactive forwards do not split."""
    k, sampler = plan.shape.topk, plan.sampler
    q = state.fwd_q[source, f].double()
    may_split = state.fwd_active[source, f] & ~state.deterministic[source]
    if sampler.name not in SAMPLER_LAWS:
        raise ValueError(f"no exact law for child sampler {sampler.name!r}; add it to SAMPLER_LAWS")
    outcome_source, tokens, outcome_probs = _ordered_draws(q, k, SAMPLER_LAWS[sampler.name])
    keep = may_split[outcome_source] | (torch.arange(outcome_source.shape[0]) == _first_outcome(outcome_source))
    outcome_source, tokens = outcome_source[keep], tokens[keep]
    split = may_split[outcome_source]
    outcome_probs = torch.where(split, outcome_probs[keep], 1.0)
    noise = noise[outcome_source].clone()
    if sampler.noise == "uniform":
        crafted = _uniforms_for(q[outcome_source], tokens)
        noise[:, f] = torch.where(split.view(-1, 1), crafted, noise[:, f])
    else:
        crafted = _noise_for(q[outcome_source], tokens, noise.shape[2])
        noise[:, f] = torch.where(split.view(-1, 1, 1), crafted, noise[:, f])
    return noise, probs[outcome_source] * outcome_probs, source[outcome_source]


def _first_outcome(outcome_source: torch.Tensor) -> torch.Tensor:
    """int64 [R']: for each outcome, the index of the first outcome of the same source row."""
    first = torch.full((int(outcome_source.max()) + 1,), outcome_source.shape[0], dtype=torch.long)
    first.scatter_reduce_(0, outcome_source, torch.arange(outcome_source.shape[0]), "amin")
    return first[outcome_source]


def draft_law(world, prefix, rule: str, cfg: TreeShape, deterministic=False, context="path",
              sampler: str = DEFAULT_CHILD_SAMPLER) -> list[tuple[float, LevelTree]]:
    """Every tree ``LevelDrafter`` can draft from ``prefix``: [(probability, one-row LevelTree)], merged."""
    plan = DraftPlan.build(cfg, rule, "cpu", sampler)
    vocab = world.vocab_size
    draws = plan.sampler.noise_draws(cfg.topk)
    if plan.sampler.noise == "uniform":  # the rows that do not split keep the middle of (0, 1)
        noise = torch.full((1, cfg.num_forwards, draws), 0.5, dtype=torch.float64)
    else:
        noise = torch.zeros(1, cfg.num_forwards, draws, vocab, dtype=torch.float64)
    probs = torch.ones(1, dtype=torch.float64)
    for level in range(cfg.depth):  # the q rows of a level's forwards are known after one run
        drafter, _ = _run(world, prefix, plan, noise, deterministic, context)
        source = torch.arange(probs.shape[0])
        fwd = forward_slice(level, cfg.topk)
        for f in range(fwd.start, fwd.stop):
            noise, probs, source = _split_forward(drafter.state, plan, noise, probs, source, f)
    _, tree = _run(world, prefix, plan, noise, deterministic, context)
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


def level_round_law(world, rule: str, cfg: TreeShape, prefix=(), method="hsd", deterministic=False, context="path",
                    drafts: list | None = None, reported_q=None, sampler: str = DEFAULT_CHILD_SAMPLER,
                    verify_mode: str | None = None) -> RoundLaw:
    """Exact law of one round: ``draft_law`` x the verifier's exact law on each tree (bonus included).

    ``drafts``: ``draft_law``'s output for this prefix, when already computed. ``reported_q``: a
    world whose q the verifier reads instead of the rows the children were drawn from (a wrong
    variant: a drafter that reports another q than it sampled). ``verify_mode``: the
    ``verify_tree`` draft mode the verifier assumes (a key of ``FIXED_DRAFTING``; None: the
    sampler's own ``draft_mode``; another one is a wrong pairing)."""
    if drafts is None:
        drafts = draft_law(world, tuple(prefix), rule, cfg, deterministic, context, sampler)
    drafting = FIXED_DRAFTING[verify_mode or CHILD_SAMPLERS[sampler].draft_mode]
    emitted: dict = {}
    expected = 0.0
    for tree_prob, tree in drafts:
        tree_world, shape = _verify_view(world, tuple(prefix), tree, reported_q)
        for (path, nxt), prob in VERIFIERS[method](tree_world, tuple(prefix), None, None, drafting, shape=shape).items():
            emitted[path + (nxt,)] = emitted.get(path + (nxt,), 0.0) + tree_prob * prob
            expected += tree_prob * prob * len(path)
    return RoundLaw(emitted, expected)


def level_prefix_tv(world, rule, cfg: TreeShape, length: int, methods=("hsd",), deterministic=False,
                    context="path", reported_q=None, sampler: str = DEFAULT_CHILD_SAMPLER,
                    verify_mode: str | None = None) -> dict[str, float]:
    """{method: TV between the emitted and the target law of the first ``length`` tokens} (chained
    rounds; the drafting law of each prefix is enumerated once for all ``methods``; ``reported_q``
    and ``verify_mode`` as in ``level_round_law``)."""
    drafts: dict = {}

    def round_law(method):
        def law(prefix):
            if prefix not in drafts:
                drafts[prefix] = draft_law(world, prefix, rule, cfg, deterministic, context, sampler)
            return level_round_law(world, rule, cfg, prefix, method, drafts=drafts[prefix],
                                   reported_q=reported_q, sampler=sampler, verify_mode=verify_mode).emitted
        return law

    target = target_prefix_distribution(world, length)
    return {method: total_variation(chain_rounds(round_law(method), world, cfg.depth, length), target) for method in methods}
