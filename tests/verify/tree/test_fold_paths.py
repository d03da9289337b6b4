"""``hsd_final_node``'s two paths: the static one (every row folded at every step, what an
accelerator and a compiled round run) and eager CPU's (only the rows that rejected are folded)
give the same final nodes and next-token rows, for every drafting mode."""

import pytest
import torch

from sglang_hsd.tree_draft import DraftPlan, KeyedNoise, LevelDrafter, TreeShape
from sglang_hsd.verify import TreeUniforms
from sglang_hsd.verify.tree import reference
from sglang_hsd.verify.tree.layout import parents_from_links
from sglang_hsd.verify.tree.types import TreeBatch


@pytest.mark.parametrize("sampler", ["inverse_cdf", "argmax_first_cdf"])
@pytest.mark.parametrize("related", [True, False])
def test_both_fold_paths_agree(sampler, related, monkeypatch):
    gen = torch.Generator().manual_seed(7)
    shape, batch, vocab = TreeShape(4, 3, 9), 16, 12
    plan = DraftPlan.build(shape, "spine_wide", sampler=sampler)
    q = torch.softmax(torch.randn(batch * (1 + shape.topk * (shape.depth - 1)), vocab, generator=gen), -1)
    drafter = LevelDrafter(plan, q[:batch], torch.zeros(batch, dtype=torch.bool), KeyedNoise.fresh(torch.arange(batch), gen))
    step, used = drafter.first(), batch
    while step is not None:
        step = drafter.step(q[used : used + batch * shape.topk])
        used += batch * shape.topk
    tree = drafter.finish()
    p = torch.softmax(torch.randn(batch, shape.num_draft_tokens, vocab, generator=gen), -1)
    p = 0.8 * tree.draft_probs + 0.2 * p if related else p
    p = p / p.sum(-1, keepdim=True)
    batch_ = TreeBatch(tree.candidates, tree.retrive_next_token, tree.retrive_next_sibling,
                       parents_from_links(tree.retrive_next_token, tree.retrive_next_sibling), tree.draft_probs, p,
                       remove_rejected=True, argmax_first=plan.sampler.draft_mode == "argmax-first")
    uniforms = TreeUniforms.draw(batch, shape.num_draft_tokens, generator=gen)
    eager_node, eager_rows = reference.hsd_final_node(batch_, uniforms)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)  # the static path
    static_node, static_rows = reference.hsd_final_node(batch_, uniforms)
    assert torch.equal(eager_node, static_node) and len(set(eager_node.tolist())) > 1
    torch.testing.assert_close(eager_rows, static_rows, rtol=1e-6, atol=1e-7)
