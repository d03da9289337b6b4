"""What a sampled tree round costs beyond its model calls: drawing the tree and verifying it.

The call tables (``round_costs.py``) price a round's drafter and target forwards, and for a
chain the verification and the draws of its drafted tokens (``verify_chain`` inside every target
call, ``sample_seconds`` per drafted token). A tree round (``runtime/tree_rounds.py``) draws its
children with ``LevelDrafter`` (a child sampler over the whole vocabulary for every forwarded
node) and verifies with ``verify_tree``: at batch 1 over Qwen's 151,936 tokens a 3:2:6 round spent
about 20 ms there on the 2-core Zen 4 EPYC, against about 5 ms that the tables price for a chain of
5 drafts. :func:`tree_round_extra` times that work once per tree shape and threads, and returns
what it costs beyond the chain pricing the tree's calls already carry, so the planner adds it
once per tree round (``RoundCosts.tree``).
"""

from __future__ import annotations

from typing import Callable

import torch

from sglang_hsd.sampling import SamplingParams
from sglang_hsd.tree_draft import DEFAULT_LEVEL_RULE, DraftPlan, KeyedNoise, LevelDrafter, TreeShape
from sglang_hsd.verify.tree.api import verify_tree


def tree_round_seconds(shape: TreeShape, vocab: int, params: SamplingParams, median: Callable[[Callable], float],
                       generator: torch.Generator) -> float:
    """Seconds of one round's drawing (the runtime's rule and child sampler; q's top-k for a greedy
    request) and ``verify_tree`` (``hsd``) at batch 1, on random q and p rows of ``vocab`` tokens.

    ``median(fn)``: the timer (median of repeated calls of ``fn``).
    """
    plan = DraftPlan.build(shape, DEFAULT_LEVEL_RULE)
    greedy = torch.tensor([params.temperature == 0.0])
    root = torch.softmax(torch.randn(1, vocab, generator=generator), -1)
    beams = torch.softmax(torch.randn(shape.topk, vocab, generator=generator), -1)
    p = torch.softmax(torch.randn(1, shape.num_draft_tokens, vocab, generator=generator), -1)

    def round_once():
        drafter = LevelDrafter(plan, root, greedy, KeyedNoise.fresh(torch.tensor([vocab]), generator), validate=False)
        step = drafter.first()
        while step is not None:
            step = drafter.step(beams)
        tree = drafter.finish()
        verify_tree(tree.candidates, tree.retrive_next_token, tree.retrive_next_sibling, tree.draft_probs, p,
                    method="hsd", generator=generator, validate=False, max_depth=shape.depth,
                    num_kept=tree.num_kept, draft_mode=plan.sampler.draft_mode)

    return median(round_once)


def tree_round_extra(shape: TreeShape, tree_seconds: float, chain_seconds: float, sample_seconds: float) -> float:
    """A tree round's ``tree_seconds`` less what the call tables already price for it: the
    ``verify_chain`` inside its N-row target call (``chain_seconds``) and a draw per kept node
    (``sample_seconds`` each). May be slightly negative where the two are within timing noise."""
    return tree_seconds - chain_seconds - shape.budget * sample_seconds
