"""Triton tree kernels (``hsd``, ``target-only``) vs the torch reference, token for token, under TRITON_INTERPRET=1.

Shapes stay tiny (V <= 16, N <= 7) because the interpreter runs the kernel in Python. Regimes:
mixture drafters (q close to p: long accepts), unrelated drafters (frequent folds up to the
root), i.i.d. children (q kept on folds), and a vocabulary wider than one block (the V loop).
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton")

from sglang_hsd.verify import TREE_METHODS, TreeUniforms, verify_tree  # noqa: E402
from sglang_hsd.verify.oracles.full_tree_draft import sample_tree  # noqa: E402
from sglang_hsd.verify.common import use_triton  # noqa: E402
from sglang_hsd.tree_draft import DraftPlan, KeyedNoise, LevelDrafter, TreeShape  # noqa: E402

pytestmark = pytest.mark.triton


def _rows(gen, shape, vocab, concentration):
    logits = torch.randn(*shape, vocab, generator=gen) / concentration
    return torch.softmax(logits, dim=-1)


def _case(seed, batch, topk, depth, vocab, related, replacement=False):
    gen = torch.Generator().manual_seed(seed)
    num_nodes = sum(topk**d for d in range(depth + 1))
    target = _rows(gen, (batch, num_nodes), vocab, 1.0)
    noise = _rows(gen, (batch, num_nodes), vocab, 1.0)
    draft = 0.7 * target + 0.3 * noise if related else noise
    calls = iter(range(depth))
    offsets = [sum(topk**d for d in range(level)) for level in range(depth + 1)]

    def q_fn(paths):  # level-by-level rows from ``draft`` (the tree is breadth first)
        level = next(calls)
        return draft[:, offsets[level] : offsets[level] + paths.shape[1]]

    tree = sample_tree(q_fn, topk, depth, gen, replacement=replacement, root_tokens=torch.zeros(batch, dtype=torch.long))
    uniforms = TreeUniforms.draw(batch, num_nodes, generator=gen)
    return tree, target, uniforms


CASES = [  # (seed, batch, topk, depth, vocab, related, replacement)
    (0, 12, 2, 2, 8, True, False),
    (1, 12, 2, 2, 8, False, False),
    (2, 8, 3, 1, 16, False, False),
    (3, 8, 2, 2, 5, False, True),
    (4, 6, 1, 3, 16, True, False),
]


@pytest.mark.parametrize("seed,batch,topk,depth,vocab,related,replacement", CASES)
def test_kernel_matches_reference(seed, batch, topk, depth, vocab, related, replacement, monkeypatch):
    tree, target, uniforms = _case(seed, batch, topk, depth, vocab, related, replacement)
    args = (tree.candidates, tree.retrive_next_token, tree.retrive_next_sibling, tree.draft_probs, target)
    mode = "iid" if replacement else "without-replacement"
    reference = verify_tree(*args, method="hsd", uniforms=uniforms, backend="torch", draft_mode=mode)
    calls = []
    import sglang_hsd.verify.tree.triton as tree_triton

    real = tree_triton.hsd_final_node_triton
    monkeypatch.setattr(tree_triton, "hsd_final_node_triton", lambda *a: calls.append(1) or real(*a))
    kernel = verify_tree(*args, method="hsd", uniforms=uniforms, backend="triton", draft_mode=mode)
    assert calls, "the Triton path did not run"
    assert torch.equal(kernel.accept_index, reference.accept_index)
    assert torch.equal(kernel.tokens, reference.tokens)
    # Exercised both outcomes: some requests stop early, some accept deep.
    if seed in (0, 1):
        assert int(reference.num_accepted.min()) < depth


def test_kernel_wide_vocabulary_uses_several_blocks(monkeypatch):
    import sglang_hsd.verify.tree.triton as tree_triton

    monkeypatch.setattr(tree_triton.triton, "next_power_of_2", lambda v: 4)  # force 4 blocks for V=16
    tree, target, uniforms = _case(5, 4, 2, 2, 16, False)
    args = (tree.candidates, tree.retrive_next_token, tree.retrive_next_sibling, tree.draft_probs, target)
    reference = verify_tree(*args, method="hsd", uniforms=uniforms, backend="torch")
    kernel = verify_tree(*args, method="hsd", uniforms=uniforms, backend="triton")
    assert torch.equal(kernel.tokens, reference.tokens)


@pytest.mark.parametrize("seed,topk,depth", [(0, 2, 2), (1, 3, 1)])
def test_target_only_kernel_matches_reference(seed, topk, depth):
    tree, target, uniforms = _case(seed, 12, topk, depth, 8, True)
    args = (tree.candidates, tree.retrive_next_token, tree.retrive_next_sibling, None, target)
    reference = verify_tree(*args, method="target-only", uniforms=uniforms, backend="torch")
    kernel = verify_tree(*args, method="target-only", uniforms=uniforms, backend="triton")
    assert torch.equal(kernel.accept_index, reference.accept_index)
    assert torch.equal(kernel.tokens, reference.tokens)
    assert len(set(reference.num_accepted.tolist())) > 1


def test_auto_backend_uses_torch_on_cpu():
    assert not use_triton("auto", "hsd", TREE_METHODS, "tree", torch.zeros(1))


def _links(parents):
    """First-child / next-sibling links of a parent list whose children appear in index order."""
    n = len(parents)
    first, sibling, last = [-1] * n, [-1] * n, {}
    for node, parent in enumerate(parents):
        if parent < 0:
            continue
        if parent in last:
            sibling[last[parent]] = node
        else:
            first[parent] = node
        last[parent] = node
    return first, sibling


def test_kernel_matches_reference_on_irregular_trees():
    # Different shapes in one batch: a bushy root, a chain, and a lopsided tree.
    shapes = [[-1, 0, 0, 0, 1, 1, 4], [-1, 0, 1, 2, 3, 4, 5], [-1, 0, 1, 0, 2, 1, 3]]
    gen = torch.Generator().manual_seed(11)
    batch, num_nodes, vocab = 24, 7, 6
    parents = [shapes[b % 3] for b in range(batch)]
    links = [_links(p) for p in parents]
    first = torch.tensor([l[0] for l in links])
    sibling = torch.tensor([l[1] for l in links])
    draft = _rows(gen, (batch, num_nodes), vocab, 1.0)
    target = _rows(gen, (batch, num_nodes), vocab, 1.0)
    candidates = torch.zeros(batch, num_nodes, dtype=torch.long)
    for b, plist in enumerate(parents):  # distinct sibling tokens drawn from the parent's q
        for parent in set(plist) - {-1}:
            kids = [n for n, p in enumerate(plist) if p == parent]
            tokens = torch.multinomial(draft[b, parent], len(kids), replacement=False, generator=gen)
            candidates[b, kids] = tokens
    uniforms = TreeUniforms.draw(batch, num_nodes, generator=gen)
    args = (candidates, first, sibling, draft, target)
    reference = verify_tree(*args, method="hsd", uniforms=uniforms, backend="torch")
    kernel = verify_tree(*args, method="hsd", uniforms=uniforms, backend="triton")
    assert torch.equal(kernel.accept_index, reference.accept_index)
    assert torch.equal(kernel.tokens, reference.tokens)
    assert len(set(reference.num_accepted.tolist())) > 1


def test_root_only_tree_emits_one_target_token():
    target = torch.tensor([[[0.0, 1.0, 0.0]]])
    args = (torch.zeros(1, 1, dtype=torch.long), torch.tensor([[-1]]), torch.tensor([[-1]]), target.clone(), target)
    for backend in ("torch", "triton"):
        res = verify_tree(*args, method="hsd", backend=backend)
        assert res.tokens.tolist() == [[1]] and res.num_accepted.tolist() == [0]


def _argmax_first_batch(seed, batch, shape, vocab):
    """A batch of argmax-first trees from the keyed drafter (q per beam from a random table)."""
    gen = torch.Generator().manual_seed(seed)
    cfg = TreeShape(*shape)
    table = torch.softmax(2.0 * torch.randn(batch * cfg.topk, cfg.depth, vocab, generator=gen), -1)
    root_q = torch.softmax(2.0 * torch.randn(batch, vocab, generator=gen), -1)
    drafter = LevelDrafter(DraftPlan.build(cfg, "spine_wide", sampler="argmax_first_cdf"), root_q,
                           torch.zeros(batch, dtype=torch.bool), KeyedNoise.fresh(torch.zeros(batch, dtype=torch.long), gen))
    step, level = drafter.first(), 0
    while step is not None:
        step, level = drafter.step(table[:, level]), level + 1
    tree = drafter.finish()
    noise = torch.softmax(torch.randn(*tree.draft_probs.shape, generator=gen), -1)
    target = torch.where(tree.draft_probs.sum(-1, keepdim=True) > 0, 0.6 * tree.draft_probs + 0.4 * noise, noise)
    return tree, target, TreeUniforms.draw(batch, cfg.num_draft_tokens, generator=gen)


@pytest.mark.parametrize("seed,shape,vocab", [(0, (3, 2, 6), 8), (1, (2, 3, 7), 16)])
def test_kernel_matches_reference_on_argmax_first_trees(seed, shape, vocab):
    """``draft_mode="argmax-first"``: first children entered and folded against a one-hot proposal."""
    tree, target, uniforms = _argmax_first_batch(seed, 24, shape, vocab)
    args = (tree.candidates, tree.retrive_next_token, tree.retrive_next_sibling, tree.draft_probs, target)
    reference = verify_tree(*args, method="hsd", uniforms=uniforms, backend="torch", draft_mode="argmax-first")
    kernel = verify_tree(*args, method="hsd", uniforms=uniforms, backend="triton", draft_mode="argmax-first")
    assert torch.equal(kernel.tokens, reference.tokens)
    sampled = verify_tree(*args, method="hsd", uniforms=uniforms, backend="torch")
    assert not torch.equal(sampled.tokens, reference.tokens)  # the mode changes the outcome
