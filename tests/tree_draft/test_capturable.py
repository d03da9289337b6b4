"""CPU proxies for CUDA-graph capture of a sampled tree round: the draft loop and the verify step.

A captured graph replays fixed kernels on fixed buffers, so a round must (1) never wait for the
host: no ``.item()``, ``.tolist()``, ``bool(tensor)`` and friends (checked by making them raise
while a round runs), and (2) trace into one graph: ``torch.compile(fullgraph=True)`` refuses any
graph break; the compiled round must equal the eager round token for token (same keyed noise,
same uniforms). The round is ``tree_draft/tiny_round.py``'s; the GPU check
(``tests/gpu/test_draft_capture.py``) captures it in a real CUDA graph.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from sglang_hsd.tree_draft import DraftPlan, TreeShape
from sglang_hsd.tree_draft.tiny_round import TinyHead, round_inputs, whole_round
from sglang_hsd.verify import ChainUniforms, verify_chain

VOCAB = 24
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


def test_the_detector_catches_a_host_sync():
    with forbid_host_sync(), pytest.raises(AssertionError, match="host synchronisation"):
        bool(torch.ones(1) > 0)


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("shape", SHAPES)
def test_round_has_no_host_sync(rule, shape):
    head, plan = TinyHead(VOCAB), DraftPlan.build(TreeShape(*shape), rule)
    inputs = round_inputs(3, shape, VOCAB)
    with torch.no_grad(), forbid_host_sync():
        whole_round(head, plan, backend="torch")(**inputs)
        chain_q = torch.softmax(torch.randn(3, shape[2] - 1, VOCAB), -1)
        tokens = torch.zeros(3, shape[2] - 1, dtype=torch.long)
        verify_chain(tokens, chain_q, inputs["target"], method="hsd", validate=False, backend="torch",
                     uniforms=ChainUniforms(inputs["accept"][:, : shape[2] - 1], inputs["sample"]))


# inductor generates and builds C++ (about a minute a shape here); aot_eager traces the same graph
# (graph breaks are found by dynamo for every backend) and runs it op by op.
@pytest.mark.parametrize("shape,rule,backend", [((3, 2, 6), "spine_wide", "inductor"), ((5, 4, 8), "beam", "aot_eager")])
def test_round_compiles_without_graph_breaks_and_equals_eager(shape, rule, backend):
    head, plan = TinyHead(VOCAB), DraftPlan.build(TreeShape(*shape), rule)
    inputs = round_inputs(3, shape, VOCAB)
    run = whole_round(head, plan, backend="torch")
    torch._dynamo.reset()
    compiled = torch.compile(run, fullgraph=True, backend=backend)
    with torch.no_grad():
        eager_tree, eager_result = run(**inputs)
        tree, result = compiled(**inputs)
    for index, (a, b) in enumerate(zip(eager_tree, tree)):
        assert torch.equal(a, b) if index != 3 else torch.allclose(a, b), index
    for a, b in zip(eager_result, result):
        assert torch.equal(a, b)
    assert int(eager_result[1].max()) > 0  # the round accepted something: not a trivial tree
