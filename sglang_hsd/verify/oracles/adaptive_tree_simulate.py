"""Batched Monte-Carlo rounds of sampled trees under ``BudgetController``: the server's tree drafter and verifier.

The tree counterpart of the chain rounds of ``adaptive_rounds_simulate.simulate_controlled_chain``
(which runs the groups, one controller each, and their updates): ``tree_round`` is its
``round_fn`` for a configured shape (D, k, N). Each group's chosen depth d > 0 drafts the budget
``tree_draft.budget_shapes(shape, rule)[d]`` with the batched ``LevelDrafter`` (q rows of the
tabular world at each node's path, the server's keyed noise) and verifies it with one
``verify_tree`` call per depth in use; d = 0 draws one token from p. The controller is told
``longest_path`` drafted and the accepted path's length, as ``adaptive_tree_exact`` and the
server tell it.

``truncate_on_reject``: the WRONG controller of ``adaptive_rounds_exact.truncated``: a round
rejected after j accepted tokens is shortened to them, the token after them redrawn from p and
the controller told j of j.
"""

from __future__ import annotations

import torch

from sglang_hsd.tree_draft import (CHILD_SAMPLERS, DEFAULT_CHILD_SAMPLER, DEFAULT_LEVEL_RULE, DraftPlan, KeyedNoise,
                                   LevelDrafter, TreeShape, budget_shapes)
from sglang_hsd.verify import verify_tree
from sglang_hsd.verify.oracles.adaptive_rounds_simulate import RoundFn, Tables, plain_rows
from sglang_hsd.verify.oracles.level_exact import drive
from sglang_hsd.verify.oracles.simulate import _node_rows

__all__ = ["tree_round"]


def _path_value(tables: Tables, value: torch.Tensor, tokens: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """Base-V value of each row's context ``value`` [R] followed by its first ``count`` [R] of
    ``tokens`` [R, S]."""
    out = value.clone()
    for slot in range(tokens.shape[1]):
        take = slot < count
        out = torch.where(take, out * tables.vocab + tokens[:, slot].clamp_min(0), out)
    return out


def tree_round(shape: TreeShape, rule: str = DEFAULT_LEVEL_RULE, sampler: str = DEFAULT_CHILD_SAMPLER) -> RoundFn:
    """The ``round_fn`` of sampled trees of configured ``shape`` (the controller's candidates
    must be 0..D); ``rule`` / ``sampler``: keys of ``LEVEL_RULES`` / ``CHILD_SAMPLERS``."""
    budgets = budget_shapes(shape, rule)
    plans = {depth: DraftPlan.build(budget, rule, "cpu", sampler) for depth, budget in budgets.items()}
    draft_mode = CHILD_SAMPLERS[sampler].draft_mode

    def round_fn(tables: Tables, world, method, setup, state, active, lengths, generator, truncate_on_reject):
        if setup.longest != shape.depth:
            raise ValueError(f"the controller's longest candidate ({setup.longest}) must be the "
                             f"tree's depth ({shape.depth})")
        context_len = state["seq_len"][active] + len(world.prompt)
        value = state["value"][active]
        rows = active.shape[0]
        emitted = torch.full((rows, shape.depth + 1), -1, dtype=torch.long)
        drafted = torch.zeros(rows, dtype=torch.long)
        accepted = torch.zeros(rows, dtype=torch.long)
        plain = (lengths == 0).nonzero().squeeze(-1)
        if plain.numel():
            emitted[plain, 0] = plain_rows(tables, context_len[plain], value[plain], generator)
        for depth in sorted(set(lengths.tolist()) - {0}):
            sel = (lengths == depth).nonzero().squeeze(-1)
            base_len, base_value = context_len[sel], value[sel]

            def q_fn(paths: torch.Tensor) -> torch.Tensor:  # [B, M, L], column 0: the root
                drafted_tokens = paths[..., 1:]
                n = drafted_tokens.shape[-1]
                place = tables.vocab ** torch.arange(n - 1, -1, -1)
                code = (tables.offsets[base_len[:, None] + n] + base_value[:, None] * tables.vocab**n
                        + (drafted_tokens * place).sum(-1))
                return tables.q[code]

            roots = torch.zeros(sel.shape[0], dtype=torch.long)
            root_q = q_fn(roots.view(-1, 1, 1))[:, 0]
            noise = KeyedNoise.fresh(torch.zeros_like(roots), generator)
            drafter = LevelDrafter(plans[depth], root_q, torch.zeros_like(roots, dtype=torch.bool), noise,
                                   validate=False)
            tree = drive(drafter, q_fn, roots, context="path")
            target_probs = _node_rows(tables.p, tree, base_len, base_value, tables.offsets, tables.vocab, depth)
            result = verify_tree(tree.candidates, tree.retrive_next_token, tree.retrive_next_sibling,
                                 tree.draft_probs, target_probs, method=method, generator=generator,
                                 validate=False, draft_mode=draft_mode)
            tokens, n_accepted = result.tokens.clone(), result.num_accepted.clone()
            longest = budgets[depth].longest_path
            n_drafted = torch.full_like(n_accepted, longest)
            if truncate_on_reject:  # WRONG: the token after the accepted path redrawn from p
                rejected = (n_accepted < longest).nonzero().squeeze(-1)
                if rejected.numel():
                    path = _path_value(tables, base_value[rejected], tokens[rejected], n_accepted[rejected])
                    tokens[rejected, n_accepted[rejected]] = plain_rows(
                        tables, base_len[rejected] + n_accepted[rejected], path, generator)
                    n_drafted[rejected] = n_accepted[rejected]
            emitted[sel, : tokens.shape[1]] = tokens
            drafted[sel], accepted[sel] = n_drafted, n_accepted
        return emitted, drafted, accepted

    return round_fn
