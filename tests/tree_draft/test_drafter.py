"""``LevelDrafter`` (``sglang_hsd/tree_draft/drafter.py``): shapes, SGLang's pool layout, bad input.

The pool layout is checked against an independent reconstruction that follows SGLang's tree
builder (``build_tree_efficient``): node n >= 1 is pool slot ``top_scores_index[n - 1]``, its
parent is the root when ``slot // k == 0`` and otherwise the node whose slot is
``parent_list[slot // k]``; every node is prepended to its parent's child list, walking n from
N - 1 down to 1.
"""

import pytest
import torch

from sglang_hsd.verify.oracles.exact import random_world
from sglang_hsd.verify.oracles.level_exact import drive, table_q_fn
from sglang_hsd.tree_draft import DEFAULT_LEVEL_RULE, LEVEL_RULES, DraftPlan, KeyedNoise, LevelDrafter, TreeShape


def _noise(batch: int, gen: torch.Generator | None = None) -> KeyedNoise:
    return KeyedNoise.fresh(torch.zeros(batch, dtype=torch.long), gen)

SHAPES = [(3, 2, 7), (4, 2, 8), (2, 3, 5), (5, 4, 8), (1, 3, 3)]


def _kernel_links(parent_list: list, selected: list, topk: int, num_nodes: int):
    """SGLang's tree builder, written from its rules: (first child, next sibling) lists."""
    first, sibling = [-1] * num_nodes, [-1] * num_nodes
    for i in range(num_nodes - 1, 0, -1):
        parent_block = selected[i - 1] // topk
        position = 0
        if parent_block > 0:
            parent_slot = parent_list[parent_block]
            position = selected.index(parent_slot) + 1
        if first[position] != -1:
            sibling[i] = first[position]
        first[position] = i
    return first, sibling


def _draft(rule, shape, batch=5, vocab=7, seed=0, deterministic=None, context="path"):
    cfg = TreeShape(*shape)
    gen = torch.Generator().manual_seed(seed)
    table = torch.softmax(3 * torch.randn(50_000, vocab, generator=gen, dtype=torch.float64), -1)

    def q_fn(paths):  # context-dependent q from a hashed context
        code = (paths * torch.tensor([7919**i for i in range(paths.shape[-1])])).sum(-1) % table.shape[0]
        return table[code]

    roots = torch.arange(batch)
    det = torch.zeros(batch, dtype=torch.bool) if deterministic is None else deterministic
    drafter = LevelDrafter(DraftPlan.build(cfg, rule), q_fn(roots.view(-1, 1, 1))[:, 0], det, _noise(batch, gen))
    return cfg, drafter, drive(drafter, q_fn, roots, context)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("rule", sorted(LEVEL_RULES))
def test_pool_layout_matches_sglang_tree_builder(rule, shape):
    cfg, drafter, tree = _draft(rule, shape)
    batch, n = 5, cfg.num_draft_tokens
    assert tree.parent_list.shape == (batch, 1 + cfg.topk * (cfg.depth - 1))
    assert tree.top_scores_index.shape == tree.draft_tokens.shape == (batch, n - 1)
    assert tree.draft_probs.shape == (batch, n, 7) and tree.candidates.shape == (batch, n)
    assert (tree.num_kept == n - 1).all()
    assert (tree.top_scores_index.diff(dim=-1) > 0).all() and (tree.top_scores_index < cfg.pool).all()
    for b in range(batch):
        first, sibling = _kernel_links(tree.parent_list[b].tolist(), tree.top_scores_index[b].tolist(), cfg.topk, n)
        assert first == tree.retrive_next_token[b].tolist()
        assert sibling == tree.retrive_next_sibling[b].tolist()
    pool_tokens = drafter.state.pool_tokens.gather(1, tree.top_scores_index)
    assert torch.equal(pool_tokens, tree.draft_tokens) and torch.equal(tree.candidates[:, 1:], tree.draft_tokens)
    assert int(tree.depths.max()) <= cfg.depth


@pytest.mark.parametrize("rule", sorted(LEVEL_RULES))
def test_siblings_are_distinct_draws_with_their_q_rows(rule):
    cfg, _, tree = _draft(rule, (3, 2, 7), context="slot")
    for b in range(tree.candidates.shape[0]):
        parents = tree.parents[b].tolist()
        for node in range(1, cfg.num_draft_tokens):
            parent = parents[node]
            assert tree.draft_probs[b, parent, tree.candidates[b, node]] > 0  # drawn from the parent's row
            same = [m for m in range(1, cfg.num_draft_tokens) if parents[m] == parent]
            assert len({int(tree.candidates[b, m]) for m in same}) == len(same) <= cfg.topk
        leaves = tree.retrive_next_token[b] < 0
        forwarded = tree.draft_probs[b].sum(-1) > 0
        assert forwarded[~leaves].all()


def test_spine_shape():
    """Spine keeps the chain first (beam 0 of every forward), then the chain nodes' later draws."""
    cfg, _, tree = _draft("spine", (4, 2, 8))
    k = cfg.topk
    chain = [0] + [(1 + (d - 1) * k) * k for d in range(1, cfg.depth)]
    assert (tree.parent_list[:, 1 :: k] == torch.tensor(chain[:-1])).all()  # beam 0 forwards the chain
    assert (tree.top_scores_index == torch.tensor([0, 1, 2, 3, 6, 7, 10])).all()
    assert (tree.depths == torch.tensor([0, 1, 1, 2, 2, 3, 3, 4])).all()


def test_deterministic_rows_take_q_top_k():
    det = torch.tensor([True, False, True, False, True])
    cfg, drafter, tree = _draft("spine", (3, 2, 7), deterministic=det)
    for b in torch.nonzero(det).flatten().tolist():
        for node in range(cfg.num_draft_tokens):
            kids = []
            child = int(tree.retrive_next_token[b, node])
            while child >= 0:
                kids.append(int(tree.candidates[b, child]))
                child = int(tree.retrive_next_sibling[b, child])
            if kids:
                top = torch.sort(tree.draft_probs[b, node], descending=True, stable=True).indices[: len(kids)]
                assert kids == top.tolist()


def test_small_support_caps_children():
    """One token of positive q: one child per node; the budget's rest is unreachable filler."""
    cfg = TreeShape(2, 3, 5)
    root_q = torch.tensor([[0.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
    drafter = LevelDrafter(DraftPlan.build(cfg, "beam"), root_q, torch.tensor([False]), _noise(1))
    drafter.first()
    assert drafter.step(torch.tensor([[0.0, 0.0, 1.0, 0.0]] * 3, dtype=torch.float64)) is None
    tree = drafter.finish()
    assert int(tree.num_kept) == 2
    assert tree.parents[0].tolist() == [-1, 0, 1, -1, -1] and tree.candidates[0, 1:3].tolist() == [1, 2]
    assert tree.retrive_next_token[0].tolist() == [1, 2, -1, -1, -1] and (tree.draft_probs[0, 3:] == 0).all()


def test_bad_input():
    cfg = TreeShape(3, 2, 7)
    q = torch.full((2, 5), 0.2, dtype=torch.float64)
    det = torch.zeros(2, dtype=torch.bool)
    plan = DraftPlan.build(cfg, "spine")
    with pytest.raises(ValueError, match="rule"):
        DraftPlan.build(cfg, "nope")
    with pytest.raises(ValueError, match="sampler"):
        DraftPlan.build(cfg, "spine", sampler="nope")
    with pytest.raises(ValueError, match="shape"):
        DraftPlan.build((3, 2, 7), "spine")
    with pytest.raises(ValueError, match="speculative-num-draft-tokens"):
        DraftPlan.build(TreeShape(2, 2, 8), "beam")  # 7 > k + (D - 1) k^2 = 6
    with pytest.raises(ValueError, match="spine"):
        DraftPlan.build(TreeShape(2, 2, 6), "spine")  # spine keeps at most D k = 4
    with pytest.raises(ValueError, match="plan"):
        LevelDrafter(cfg, q, det, _noise(2))
    with pytest.raises(ValueError, match="root_q"):
        LevelDrafter(plan, -q, det, _noise(2))
    with pytest.raises(ValueError, match="deterministic"):
        LevelDrafter(plan, q, det.long(), _noise(2))
    with pytest.raises(ValueError, match="noise"):
        LevelDrafter(plan, q, det, torch.rand(2, 3, 2))
    with pytest.raises(ValueError, match="seed and position"):
        KeyedNoise(torch.zeros(2, dtype=torch.long), torch.zeros(3, dtype=torch.long))
    drafter = LevelDrafter(DraftPlan.build(cfg, DEFAULT_LEVEL_RULE), q, det, _noise(2))
    with pytest.raises(ValueError, match="step"):
        drafter.step(torch.full((4, 5), 0.2))
    with pytest.raises(ValueError, match="finish"):
        drafter.finish()
    drafter.first()
    with pytest.raises(ValueError, match="q_rows"):
        drafter.step(torch.full((2, 5), 0.2))
    with pytest.raises(ValueError, match="q_rows"):
        drafter.step(torch.ones(4, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="q_rows"):
        drafter.step(torch.full((4, 5), float("nan")))
    drafter.step(torch.full((4, 5), 0.2))
    assert drafter.step(torch.full((4, 5), 0.2)) is None
    with pytest.raises(ValueError, match="step"):
        drafter.step(torch.full((4, 5), 0.2))
    assert drafter.finish().num_kept.tolist() == [6, 6]


def test_table_q_fn_reads_prefix_rows():
    world = random_world(3, 4, seed=1)
    q_fn = table_q_fn(world, (2, 1))
    paths = torch.tensor([[[0, 1, 2], [0, 0, 0]]])
    rows = q_fn(paths)
    assert torch.allclose(rows[0, 0], torch.as_tensor(world.q((2, 1, 1, 2))))
    assert torch.allclose(rows[0, 1], torch.as_tensor(world.q((2, 1, 0, 0))))


@pytest.mark.parametrize("rule", ["spine", "spine_wide"])
def test_budget_below_depth_shortens_the_chain(rule):
    cfg, _, tree = _draft(rule, (4, 2, 3))
    assert (tree.top_scores_index == torch.tensor([0, 2])).all()  # c_1, c_2
    assert (tree.parents == torch.tensor([-1, 0, 1])).all() and (tree.depths == torch.tensor([0, 1, 2])).all()


@pytest.mark.parametrize("rule", sorted(LEVEL_RULES))
def test_verify_layout_passes_verify_tree_checks(rule):
    """The verify layout feeds ``verify_tree`` with its input checks on (distinct siblings, drafted
    tokens with q mass, rows of nodes with children are distributions)."""
    from sglang_hsd.verify.tree.api import verify_tree

    cfg, _, tree = _draft(rule, (3, 2, 7), context="slot")
    target = torch.softmax(torch.randn(*tree.draft_probs.shape, dtype=torch.float64), -1)
    for method in ("hsd", "rrs"):
        result = verify_tree(tree.candidates, tree.retrive_next_token, tree.retrive_next_sibling, tree.draft_probs,
                             target, method=method, generator=torch.Generator().manual_seed(0))
        assert (result.num_accepted <= cfg.depth).all()
