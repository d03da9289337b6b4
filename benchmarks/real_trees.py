"""The server's budgeted trees on real model distributions: Monte Carlo, nothing lumped.

``bench_tree_budget.py``'s exact laws need tiny worlds (the target's V - 1 best tokens per node
plus one lumped token). With a weak drafter most of q's mass falls into the lumped token, which
the sampled tree then draws and the target accepts as if it were one token, so the law overstates
sampled children (SmolLM2's EAGLE-3 head: ``benchmarks/README.md``). Here every tree is the
server's own, on the full vocabulary:

* ``draft_trees``: ``tree_draft.LevelDrafter`` (the drafter the server and the runtime run)
  drafts M trees of one context with keyed noise; each draft forward's q rows are the drafter's
  logits at the beams' paths (``drafters.node_logits`` on a ``PrefixModel`` or ``Eagle3Prefix``)
  under the request's sampling parameters;
* ``accepted``: the target's rows at every node (one tree-masked forward per new path, memoised)
  and ``verify_tree`` with the server's verifier (``hsd``; ``draft_mode`` from the child sampler)
  give each tree's accepted drafts;
* ``stock_tree`` / ``stock_accepted_law``: SGLang's stock tree is the same drafter with
  deterministic rows and the ``pruned`` rule (q's top-k children at T = 1, the k best path scores
  of each level forwarded, the N - 1 best kept), and its law of accepted drafts under
  ``target-only`` is exact: node n is the last accepted with probability reach(n) (1 - the
  target mass of n's children), reach = the product of the target probabilities along its path.
"""

from __future__ import annotations

import torch

from benchmarks.bench_tree import target_reach, tree_paths
from benchmarks.drafters import node_logits
from sglang_hsd.sampling import SamplingParams, logits_to_probs
from sglang_hsd.tree_draft import CHILD_SAMPLERS, DraftPlan, KeyedNoise, LevelDrafter, LevelTree, TreeShape
from sglang_hsd.verify import verify_tree


def pool_path(tree_state, row: int, slot: int) -> tuple[int, ...]:
    """Token path (root excluded) to pool slot ``slot`` of batch row ``row`` of a ``LevelState``."""
    k = tree_state.shape.topk
    path = []
    while slot >= 0:
        path.append(int(tree_state.pool_tokens[row, slot]))
        slot = int(tree_state.fwd_pool[row, slot // k])  # the slot of the node that drew it; -1: root
    return tuple(reversed(path))


@torch.inference_mode()
def draft_trees(drafter, plan: DraftPlan, trees: int, params: SamplingParams, generator: torch.Generator,
                deterministic: bool = False) -> LevelTree:
    """``trees`` rows of one context (the drafter's ``set_context`` done) drafted by ``LevelDrafter``.

    q rows are ``logits_to_probs(drafter logits, params)`` [trees * k, V] per draft forward; keyed
    noise with fresh seeds from ``generator``; ``deterministic`` rows take q's top-k.
    """
    root_q = logits_to_probs(drafter.memo[()][None], params).expand(trees, -1).contiguous()
    noise = KeyedNoise.fresh(torch.arange(trees), generator)
    level = LevelDrafter(plan, root_q, torch.full((trees,), deterministic), noise, validate=False)
    step = level.first()
    while step is not None:
        slots = step.pool_index.tolist()
        paths = [pool_path(level.state, row, slot) for row in range(trees) for slot in slots[row]]
        step = level.step(logits_to_probs(node_logits(drafter, paths), params))
    return level.finish()


def target_rows(target, tree: LevelTree, params: SamplingParams) -> torch.Tensor:
    """The target's rows p(. | path to node) of every node of every tree: float [M, N, V]."""
    paths = [tree_paths(tree, row) for row in range(tree.candidates.shape[0])]
    flat = [path for row in paths for path in row]
    return logits_to_probs(node_logits(target, flat), params).view(len(paths), len(paths[0]), -1)


def accepted(target, tree: LevelTree, params: SamplingParams, sampler: str, generator: torch.Generator) -> torch.Tensor:
    """Accepted drafts of each sampled tree under ``hsd``: int64 [M]."""
    res = verify_tree(tree.candidates, tree.retrive_next_token, tree.retrive_next_sibling, tree.draft_probs,
                      target_rows(target, tree, params), method="hsd", generator=generator, validate=False,
                      draft_mode=CHILD_SAMPLERS[sampler].draft_mode, num_kept=tree.num_kept)
    return res.num_accepted


def stock_tree(drafter, shape: TreeShape) -> LevelTree:
    """SGLang's stock tree of the context: one deterministic row, ``pruned`` rule, q at T = 1."""
    plan = DraftPlan.build(shape, "pruned")
    return draft_trees(drafter, plan, 1, SamplingParams(temperature=1.0), torch.Generator(), deterministic=True)


def stock_accepted_law(target, tree: LevelTree, params: SamplingParams, depth: int) -> list[float]:
    """Exact P(a drafts accepted), a = 0 .. ``depth`` (the shape's D), of ``target-only`` on a
    one-row stock tree: node n ends the accepted path with probability reach(n) times the target
    mass its children miss (``bench_tree.target_reach``)."""
    rows = target_rows(target, tree, params)
    reach = target_reach(tree, rows)
    parents, tokens, depths = tree.parents[0].tolist(), tree.candidates[0].tolist(), tree.depths[0].tolist()
    missed = [1.0] * len(parents)
    for node in range(1, len(parents)):
        if parents[node] >= 0:  # filler (q's support ran out) has no parent and reach 0
            missed[parents[node]] -= float(rows[0, parents[node], tokens[node]])
    law = [0.0] * (depth + 1)
    for node, (r, d) in enumerate(zip(reach, depths)):
        law[d] += r * missed[node]
    return law
