"""Exact expected accepted draft tokens per round: stock top-k trees vs sampled trees with real q.

Same drafter q and tree shape (topk 2, depth 3, V 4) in every row: SGLang's stock tree (top-k
children, verified ``target-only``) against children sampled without replacement from q and
verified with ``rrs`` or ``hsd``. Run with ``-s`` to see the per-world tables.

Where hsd loses: in peaked worlds (Dirichlet concentration 0.3) the stock top-k tree wins in a few
worlds (see the printed ``peaked`` table: the drafter's top-2 already covers almost all target
mass, so sampling the second child sometimes wastes the slot top-k spends on the target's runner
up). Tiny vocabularies overstate the gains: with V = 4 and topk = 2 a sampled tree covers half the
vocabulary at every node.
"""

import pytest

from sglang_hsd.verify.oracles import exact, tree_exact

pytestmark = pytest.mark.exact

TOPK, DEPTH, VOCAB = 2, 3, 4
WORLDS = range(8)


def _table(concentration):
    rows = []
    for seed in WORLDS:
        world = exact.random_world(VOCAB, DEPTH, seed=seed, concentration=concentration)
        rows.append(
            (
                seed,
                tree_exact.tree_expected_accepted(world, "target-only", TOPK, DEPTH, (), "top-k"),
                tree_exact.tree_expected_accepted(world, "rrs", TOPK, DEPTH, (), "without-replacement"),
                tree_exact.tree_expected_accepted(world, "hsd", TOPK, DEPTH, (), "without-replacement"),
            )
        )
    return rows


@pytest.mark.parametrize("label,concentration", [("flat", 1.0), ("peaked", 0.3)])
def test_tree_expected_accepted_table(label, concentration):
    rows = _table(concentration)
    print(f"\n{label}: expected accepted draft tokens per round, V={VOCAB} topk={TOPK} depth={DEPTH}")
    print("world  top-k/target-only  sampled/rrs  sampled/hsd  hsd-target  hsd-rrs")
    for seed, stock, rrs, hsd in rows:
        print(f"{seed:5d}  {stock:17.4f}  {rrs:11.4f}  {hsd:11.4f}  {hsd - stock:+10.4f}  {hsd - rrs:+7.4f}")
    means = [sum(col) / len(rows) for col in zip(*rows)][1:]
    print(f" mean  {means[0]:17.4f}  {means[1]:11.4f}  {means[2]:11.4f}  {means[2] - means[0]:+10.4f}  {means[2] - means[1]:+7.4f}")
    stock_mean, rrs_mean, hsd_mean = means
    assert hsd_mean > stock_mean
    assert hsd_mean > rrs_mean
    losers = [seed for seed, stock, _, hsd in rows if hsd < stock]
    print(f"worlds where the stock top-k tree beats sampled hsd: {losers}")
    # Traversal never does worse than top-down rejection on the same sampled tree in these worlds.
    assert all(hsd >= rrs - 1e-12 for _, _, rrs, hsd in rows)


@pytest.mark.parametrize("seed", [0, 1])
def test_topk1_tree_acceptance_equals_chain(seed):
    world = exact.random_world(3, DEPTH, seed=seed)
    tree = tree_exact.tree_expected_accepted(world, "hsd", 1, DEPTH)
    chain = exact.expected_accepted(world, "hsd", DEPTH)
    assert tree == pytest.approx(chain, abs=1e-13)
