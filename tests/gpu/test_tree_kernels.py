"""The Triton tree kernels (``hsd``, ``target-only``) against the torch reference on a GPU, token
for token, at serving sizes.

Trees of exactly N = 8, 16, 32, 64 nodes from random parent arrays (chains, deep narrow trees and
bushy random recursive trees in one batch, ``benchmarks/gpu_inputs.py``) and full trees from
``sample_tree``; children drawn without replacement and, for ``hsd``, i.i.d. (duplicate siblings,
q kept on folds). Each case compares ``verify_tree`` with ``backend="torch"`` and ``"triton"`` on
the same ``TreeUniforms`` (accepted path and emitted tokens, every compared row), and the kernel's
accepted node and next-token weights with the reference rule's (the weights within
``WEIGHTS_RELATIVE_TOL`` of the row maximum, so a fold that writes a wrong row fails even when the
sampled token happens to agree).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest
import torch

from benchmarks.gpu_inputs import REGIMES, TreeInputs, draft_and_target_rows, tree_inputs
from sglang_hsd.verify import TREE_METHODS, TreeUniforms, verify_tree
from sglang_hsd.verify.oracles.full_tree_draft import sample_tree
from sglang_hsd.verify.tree.layout import depths_from_parents
from sglang_hsd.verify.tree.types import TreeBatch
from tests.gpu import _support as support

# (method, draft mode) pairs with a kernel; target-only needs distinct siblings (no iid trees).
KERNEL_PAIRS = (("hsd", "without-replacement"), ("hsd", "iid"), ("target-only", "without-replacement"))


@dataclass(frozen=True)
class TreeCase:
    num_nodes: int
    vocab: int
    batch: int
    regime: str
    seed: int

    def __str__(self) -> str:
        return f"N{self.num_nodes}-V{self.vocab}-B{self.batch}-{self.regime}"


def _cases() -> list[TreeCase]:
    grid = itertools.product(support.TREE_NODES, support.VOCABS, REGIMES)
    return [TreeCase(n, v, support.rotate(support.BATCHES, i), regime, seed=100 + i) for i, (n, v, regime) in enumerate(grid)]


def _run(method: str, tree: TreeInputs, backend: str, validate: bool = False):
    draft = tree.draft_probs if TREE_METHODS[method].reads_q else None

    def run(uniforms):
        result = verify_tree(*tree.links(), draft, tree.target_probs, method=method, uniforms=uniforms,
                             validate=validate, backend=backend, draft_mode=tree.draft_mode, max_depth=tree.max_depth)
        return result.accept_index, result.tokens

    return run


@pytest.fixture(scope="module")
def kernels():
    pytest.importorskip("triton")
    import sglang_hsd.verify.tree.triton as module

    return module


def _check(kernels, monkeypatch, method: str, tree: TreeInputs, label: str, gen: torch.Generator) -> None:
    batch, num_nodes = tree.candidates.shape
    start = TreeUniforms.draw(batch, num_nodes, support.DEVICE, gen)
    uniforms, unstable = support.stable_uniforms(_run(method, tree, "torch"), start, gen)
    reference = _run(method, tree, "torch", validate=True)(uniforms)
    rule = TREE_METHODS[method]
    calls = support.count_calls(monkeypatch, kernels, rule.triton_kernel)
    kernel = _run(method, tree, "triton", validate=True)(uniforms)
    assert calls == [1], "the Triton kernel did not run"
    label = f"{label} (rows {list(tree.target_probs.shape)}, max depth {tree.max_depth}, {support.DEVICE})"
    problems = support.mismatch_report(label, ("accept_index", "tokens"), reference, kernel, unstable)
    problems += _weights_report(kernels, rule, tree, uniforms, unstable, label)
    assert not problems, "\n".join(problems)


def _weights_report(kernels, rule, tree: TreeInputs, uniforms, unstable, label: str) -> list[str]:
    """Accepted node and next-token weights of the kernel against the reference rule."""
    batch_rows = TreeBatch(tree.candidates, tree.first_child, tree.next_sibling, tree.parents,
                           tree.draft_probs if rule.reads_q else None, tree.target_probs,
                           remove_rejected=tree.draft_mode == "without-replacement")
    ref_node, ref_weights = rule.final_node(batch_rows, uniforms)
    out_node, out_weights = getattr(kernels, rule.triton_kernel)(batch_rows, uniforms)
    same = (ref_node == out_node) & ~unstable
    scale = ref_weights.abs().amax(-1).clamp_min(torch.finfo(torch.float32).tiny)
    relative = ((out_weights - ref_weights).abs().amax(-1) / scale).where(same, torch.zeros_like(scale))
    worst = float(relative.max())
    if worst <= support.WEIGHTS_RELATIVE_TOL:
        return []
    row = int(relative.argmax())
    return [f"{label}: next-token weights differ by {worst:.3g} of the row maximum at row {row} "
            f"(node {int(ref_node[row])}; tolerance {support.WEIGHTS_RELATIVE_TOL}); "
            f"rows over tolerance: {(relative > support.WEIGHTS_RELATIVE_TOL).nonzero().flatten().tolist()[:16]}"]


@pytest.mark.parametrize("case", _cases(), ids=str)
@pytest.mark.parametrize("method,draft_mode", KERNEL_PAIRS)
def test_tree_kernel_matches_reference(kernels, monkeypatch, method, draft_mode, case):
    gen = support.generator(case.seed)
    tree = tree_inputs(case.batch, case.num_nodes, case.vocab, case.regime, draft_mode, gen, support.DEVICE)
    _check(kernels, monkeypatch, method, tree, f"tree {method} {draft_mode} {case} seed {case.seed}", gen)


def _full_tree(batch: int, topk: int, depth: int, vocab: int, replacement: bool, gen) -> TreeInputs:
    """A ``sample_tree`` full tree with unrelated target rows, as ``TreeInputs``."""
    num_nodes = sum(topk**d for d in range(depth + 1))
    q_rows, target = draft_and_target_rows(batch, num_nodes, num_nodes, vocab, "close", gen, support.DEVICE)
    offsets = iter(itertools.accumulate([topk**d for d in range(depth)], initial=0))

    def q_fn(paths):  # breadth first: level d's rows are the next paths.shape[1] rows
        start = next(offsets)
        return q_rows[:, start : start + paths.shape[1]]

    root = torch.zeros(batch, dtype=torch.long, device=support.DEVICE)
    drafted = sample_tree(q_fn, topk, depth, gen, replacement=replacement, root_tokens=root)
    mode = "iid" if replacement else "without-replacement"
    return TreeInputs(drafted.candidates, drafted.retrive_next_token, drafted.retrive_next_sibling, drafted.parents,
                      drafted.draft_probs, target, int(depths_from_parents(drafted.parents).max()), mode)


@pytest.mark.parametrize("replacement", [False, True], ids=["without-replacement", "iid"])
def test_tree_kernel_matches_reference_on_sampled_full_trees(kernels, monkeypatch, replacement):
    """Full trees as ``sample_tree`` lays them out (topk 2, depth 5: 63 nodes; 15 in the smoke run)."""
    depth = 3 if support.SMOKE else 5
    gen = support.generator(999)
    tree = _full_tree(support.BATCHES[-1], 2, depth, support.VOCABS[-1], replacement, gen)
    _check(kernels, monkeypatch, "hsd", tree, f"sample_tree topk 2 depth {depth} {tree.draft_mode}", gen)
