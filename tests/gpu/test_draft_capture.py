"""The sampled-tree round captured in a CUDA graph (``tree_draft/tiny_round.py``: a tiny random
draft head, ``LevelDrafter`` with keyed noise, then ``verify_tree`` on the Triton path), for every
lossless child sampler: ``inverse_cdf`` (the default), ``argmax_first_cdf`` and ``gumbel_topk``.

A graph is captured once on static input buffers; replays on new inputs copied into them must
equal the eager round token for token (keyed noise: no generator state, so replay and eager draw
the same tree). Eager rounds also run under ``torch.cuda.set_sync_debug_mode("error")``, which
raises on any operation that synchronises with the host. Both need a real GPU (no smoke version).
"""

from __future__ import annotations

import pytest
import torch

from sglang_hsd.tree_draft import DraftPlan, TreeShape
from sglang_hsd.tree_draft.tiny_round import TinyHead, round_inputs, whole_round
from tests.gpu import _support as support

pytestmark = pytest.mark.skipif(not support.CUDA or support.SMOKE, reason="CUDA graphs need a CUDA device")

CASES = [  # (shape, rule, batch, vocab, child sampler)
    ((4, 2, 8), "spine_wide", 4, 32000, "inverse_cdf"),
    ((5, 4, 8), "spine_wide", 16, 128256, "inverse_cdf"),
    ((3, 2, 6), "beam", 64, 32000, "inverse_cdf"),
    ((5, 4, 8), "spine_wide", 16, 128256, "argmax_first_cdf"),
    ((4, 2, 8), "beam", 64, 32000, "argmax_first_cdf"),
    ((5, 4, 8), "spine_wide", 16, 128256, "gumbel_topk"),
]
HIDDEN = 64


def _assert_same(eager, replayed, what: str):
    (tree_a, result_a), (tree_b, result_b) = eager, replayed
    for index, (a, b) in enumerate(zip(tree_a + result_a, tree_b + result_b)):
        same = torch.allclose(a, b) if a.is_floating_point() else torch.equal(a, b)
        assert same, f"{what}: output {index} differs between eager and graph replay"


@pytest.mark.parametrize("shape,rule,batch,vocab,sampler", CASES)
def test_round_replays_equal_to_eager(shape, rule, batch, vocab, sampler):
    device = torch.device("cuda")
    head = TinyHead(vocab, HIDDEN, device=device)
    run = whole_round(head, DraftPlan.build(TreeShape(*shape), rule, device, sampler))
    static = round_inputs(batch, shape, vocab, HIDDEN, seed=0, device=device)
    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up (Triton compiles, allocator pools) off the capture
            for _ in range(2):
                run(**static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = run(**static)
        accepted = 0
        for seed in (1, 2, 3):
            fresh = round_inputs(batch, shape, vocab, HIDDEN, seed=seed, device=device)
            for name, value in fresh.items():
                static[name].copy_(value)
            graph.replay()
            eager = run(**fresh)
            _assert_same(eager, out, f"seed {seed}")
            accepted += int(eager[1][1].sum())
        assert accepted > 0  # rounds accepted drafts: not trivial trees


@pytest.mark.parametrize("shape,rule,batch,vocab,sampler", CASES[1:2] + CASES[3:5])
def test_eager_round_never_synchronises(shape, rule, batch, vocab, sampler):
    device = torch.device("cuda")
    head = TinyHead(vocab, HIDDEN, device=device)
    run = whole_round(head, DraftPlan.build(TreeShape(*shape), rule, device, sampler))
    inputs = round_inputs(batch, shape, vocab, HIDDEN, seed=5, device=device)
    with torch.no_grad():
        run(**inputs)  # warm-up: Triton compiles outside the checked region
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            run(**inputs)
        finally:
            torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("sampler", ["inverse_cdf", "argmax_first_cdf"])
def test_cpu_and_cuda_draw_the_same_tree(sampler):
    """Keyed noise is a function of (seed, position, level, column) alone: the same round on two
    devices (standing in for two tensor-parallel ranks) drafts the same tree."""
    from sglang_hsd.tree_draft import KeyedNoise, LevelDrafter

    shape, batch, vocab = TreeShape(4, 2, 8), 8, 32000
    gen = torch.Generator().manual_seed(0)
    table = torch.softmax(3 * torch.randn(97, vocab, generator=gen, dtype=torch.float64), -1)
    root_q = table[torch.arange(batch)]
    seed, position = torch.randint(0, 2**40, (batch,), generator=gen), torch.randint(0, 999, (batch,), generator=gen)
    trees = []
    for device in (torch.device("cpu"), torch.device("cuda")):
        drafter = LevelDrafter(DraftPlan.build(shape, "spine_wide", device, sampler), root_q.to(device),
                               torch.zeros(batch, dtype=torch.bool, device=device),
                               KeyedNoise(seed.to(device), position.to(device)), validate=False)
        step = drafter.first()
        while step is not None:
            step = drafter.step(table.to(device)[step.input_ids % 97])
        tree = drafter.finish()
        trees.append([t.cpu() for t in (tree.parent_list, tree.top_scores_index, tree.draft_tokens)])
    for a, b in zip(*trees):
        assert torch.equal(a, b)
