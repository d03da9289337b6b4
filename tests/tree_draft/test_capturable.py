"""CPU proxies for CUDA-graph capture of a sampled tree round: the draft loop and the verify step.

A captured graph replays fixed kernels on fixed buffers, so a round must (1) never wait for the
host: no ``.item()``, ``.tolist()``, ``bool(tensor)`` and friends (checked by making them raise
while a round runs), and (2) trace into one graph: ``torch.compile(fullgraph=True)`` refuses any
graph break; the compiled round must equal the eager round token for token (same keyed noise,
same uniforms). The GPU check (``tests/gpu/``) captures the same round in a real CUDA graph.

The draft model here is a tiny EAGLE-like head: a beam's hidden state is tanh(embedding of its
token + the hidden state of the row it continues), its q the softmax of a projection.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from sglang_hsd.tree_draft import DraftPlan, KeyedNoise, LevelDrafter, TreeShape
from sglang_hsd.verify import ChainUniforms, TreeUniforms, verify_chain, verify_tree

VOCAB, HIDDEN = 24, 8
SHAPES = [(3, 2, 6), (4, 2, 8), (5, 4, 8)]
RULES = ["spine_wide", "beam"]
HOST_SYNCS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy")


@contextlib.contextmanager
def forbid_host_sync():
    """Make every tensor -> host conversion raise (what would wait for the device in a round)."""
    saved = {name: getattr(torch.Tensor, name) for name in HOST_SYNCS}

    def refuse(name):
        def method(self, *args, **kwargs):
            raise AssertionError(f"host synchronisation inside a round: Tensor.{name}")
        return method

    try:
        for name in HOST_SYNCS:
            setattr(torch.Tensor, name, refuse(name))
        yield
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)


class TinyHead(torch.nn.Module):
    def __init__(self, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.embed = torch.nn.Parameter(torch.randn(VOCAB, HIDDEN, generator=gen))
        self.proj = torch.nn.Parameter(2 * torch.randn(HIDDEN, VOCAB, generator=gen))

    def forward(self, ids: torch.Tensor, parent_hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = torch.tanh(self.embed[ids] + parent_hidden)
        return torch.softmax(hidden @ self.proj, -1), hidden


def draft_round(head: TinyHead, plan: DraftPlan, root_hidden, root_q, deterministic, seed, position):
    """One draft round as the server's loop runs it; returns the tree's tensors."""
    drafter = LevelDrafter(plan, root_q, deterministic, KeyedNoise(seed, position), validate=False)
    hidden = root_hidden
    step = drafter.first()
    for _ in range(plan.shape.depth - 1):
        q_rows, hidden = head(step.input_ids, hidden[step.hidden_rows])
        step = drafter.step(q_rows)
    tree = drafter.finish()
    return (tree.parent_list, tree.top_scores_index, tree.candidates, tree.draft_probs,
            tree.retrive_next_token, tree.retrive_next_sibling, tree.depths, tree.num_kept)


def verify_round(tree, target_probs, accept, sample, depth):
    """The verify step after the target's forward, as the server calls it (no checks, depth given)."""
    _, _, candidates, draft_probs, next_token, next_sibling, _, _ = tree
    result = verify_tree(candidates, next_token, next_sibling, draft_probs, target_probs, method="hsd",
                         uniforms=TreeUniforms(accept, sample), validate=False, max_depth=depth, backend="torch")
    return result.accept_index, result.num_accepted, result.tokens


def _inputs(shape, batch=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    root_hidden = torch.randn(batch, HIDDEN, generator=gen)
    root_q = torch.softmax(2 * torch.randn(batch, VOCAB, generator=gen), -1)
    deterministic = torch.tensor([False, True, False][:batch])
    seed_t = torch.randint(0, 2**40, (batch,), generator=gen)
    position = torch.randint(0, 1000, (batch,), generator=gen)
    target = torch.softmax(2 * torch.randn(batch, shape[2], VOCAB, generator=gen), -1)
    accept = torch.rand(batch, shape[2], generator=gen)
    sample = torch.rand(batch, generator=gen)
    return root_hidden, root_q, deterministic, seed_t, position, target, accept, sample


def test_the_detector_catches_a_host_sync():
    with forbid_host_sync(), pytest.raises(AssertionError, match="host synchronisation"):
        bool(torch.ones(1) > 0)


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("shape", SHAPES)
def test_round_has_no_host_sync(rule, shape):
    head, plan = TinyHead(), DraftPlan.build(TreeShape(*shape), rule)
    root_hidden, root_q, det, seed, position, target, accept, sample = _inputs(shape)
    with torch.no_grad(), forbid_host_sync():
        tree = draft_round(head, plan, root_hidden, root_q, det, seed, position)
        verify_round(tree, target, accept, sample, shape[0])
        draft_probs = torch.softmax(torch.randn(3, shape[2] - 1, VOCAB), -1)
        tokens = torch.zeros(3, shape[2] - 1, dtype=torch.long)
        verify_chain(tokens, draft_probs, target, method="hsd", validate=False,
                     uniforms=ChainUniforms(accept[:, : shape[2] - 1], sample), backend="torch")


# inductor generates and builds C++ (about a minute a shape here); aot_eager traces the same graph
# (graph breaks are found by dynamo for every backend) and runs it op by op.
@pytest.mark.parametrize("shape,rule,backend", [((3, 2, 6), "spine_wide", "inductor"), ((5, 4, 8), "beam", "aot_eager")])
def test_round_compiles_without_graph_breaks_and_equals_eager(shape, rule, backend):
    head, plan = TinyHead(), DraftPlan.build(TreeShape(*shape), rule)
    root_hidden, root_q, det, seed, position, target, accept, sample = _inputs(shape)

    def whole_round(root_hidden, root_q, det, seed, position, target, accept, sample):
        tree = draft_round(head, plan, root_hidden, root_q, det, seed, position)
        # A target close to the drafter, so the round accepts drafts (rows of leaves: noise only).
        close = 0.8 * tree[3] + 0.2 * target
        return tree, verify_round(tree, close / close.sum(-1, keepdim=True), accept, sample, shape[0])

    torch._dynamo.reset()
    compiled = torch.compile(whole_round, fullgraph=True, backend=backend)
    with torch.no_grad():
        eager_tree, eager_result = whole_round(root_hidden, root_q, det, seed, position, target, accept, sample)
        tree, result = compiled(root_hidden, root_q, det, seed, position, target, accept, sample)
    for name, a, b in zip(("parent_list", "top_scores_index", "candidates"), eager_tree, tree):
        assert torch.equal(a, b), name
    assert torch.allclose(eager_tree[3], tree[3])
    for a, b in zip(eager_tree[4:], tree[4:]):
        assert torch.equal(a, b)
    for a, b in zip(eager_result, result):
        assert torch.equal(a, b)
    assert int(eager_result[1].max()) > 0  # the round accepted something: not a trivial tree
