"""Exact enumeration: chains and trees verified against rows built by ``sampling.filter_probs``
emit the non-speculative sampler's law when a request combines top-k with top-p (and min-p).

The target's law is written out here token by token, as the non-speculative sampler draws it
(``_sequential_law``: one sort of softmax(logits / T), rank < top_k, mass before <= top_p in the
original row, min-p against the row's maximum), independently of ``filter_probs``. The verifiers
receive the rows ``filter_probs`` builds (what the server's verify hooks hand them) and the draft
q of the same transform (the sampled tree's drafter). The wrong variant is the speculative verify
SGLang ships: top-p applied to the row renormalised after top-k.

Vocabulary 5, context-dependent logits (every prefix has its own target and draft logits), the
first 3 emitted tokens over as many rounds as they take, float64 throughout.
"""

import numpy as np
import pytest
import torch

from sglang_hsd.sampling import BatchSamplingParams, filter_probs
from sglang_hsd.tree_draft import DraftPlan, KeyedNoise, LevelDrafter, TreeShape
from sglang_hsd.verify.oracles import exact, tree_exact
from sglang_hsd.verify.oracles.level_exact import drive
from sglang_hsd.verify.oracles.simulate import simulate_tree, target_prefix_probs
from sglang_hsd.verify.oracles.stats import chi_square_p_value

pytestmark = pytest.mark.exact

LOSSLESS_TV = 1e-12  # float64 enumeration reaches ~1e-16
LOSSY_TV = 1e-3  # the renormalised variant is off by 1e-2 or more on these worlds
VOCAB = 5
PREFIX_LEN = 3
# (temperature, top_k, top_p, min_p): Qwen2.5-Instruct's defaults scaled to V = 5, a tighter
# top-p, and top-k + top-p + min-p.
PARAMS = [(0.7, 3, 0.8, 0.0), (1.0, 2, 0.6, 0.0), (1.0, 3, 0.7, 0.1)]


def _sequential_law(probs: np.ndarray, top_k: int, top_p: float, min_p: float) -> np.ndarray:
    """The non-speculative sampler's law of one row (float64 [V]), token by token."""
    order = np.argsort(-probs, kind="stable")
    kept, before = np.zeros_like(probs), 0.0
    for rank, token in enumerate(order):
        if rank < top_k and before <= top_p and probs[token] >= min_p * probs[order[0]]:
            kept[token] = probs[token]
        before += probs[token]
    return kept / kept.sum()


def _renormalised_rows(probs: np.ndarray, top_k: int, top_p: float) -> np.ndarray:
    """The wrong variant: top-k, renormalise, then top-p on the renormalised row (no min-p)."""
    rows = []
    for row in probs:
        order = np.argsort(-row, kind="stable")
        kept = np.zeros_like(row)
        kept[order[:top_k]] = row[order[:top_k]]
        kept /= kept.sum()
        before = np.cumsum(kept[order]) - kept[order]
        kept[order[before > top_p]] = 0.0
        rows.append(kept / kept.sum())
    return np.stack(rows)


def _worlds(params, max_len: int, seed: int):
    """(the world the verifiers see, the non-speculative world, the renormalised world): the same
    context-dependent logits through ``filter_probs`` / ``_sequential_law`` / the wrong variant;
    q is the draft logits through ``filter_probs`` in all three."""
    temperature, top_k, top_p, min_p = params
    rng = np.random.default_rng(seed)
    rows = exact.prefix_offset(VOCAB, max_len + 1)
    target_probs = torch.softmax(torch.from_numpy(rng.normal(0, 1.2, (rows, VOCAB))) / temperature, -1)
    draft_logits = torch.from_numpy(rng.normal(0, 2, (rows, VOCAB))) * 0.5 + torch.log(target_probs)
    batch = BatchSamplingParams(torch.full((rows,), temperature), torch.full((rows,), top_k),
                                torch.full((rows,), top_p, dtype=torch.float64),
                                torch.full((rows,), min_p, dtype=torch.float64))
    served = filter_probs(target_probs, batch).numpy()
    draft = filter_probs(torch.softmax(draft_logits / temperature, -1), batch).numpy()
    law = np.stack([_sequential_law(row, top_k, top_p, min_p) for row in target_probs.numpy()])
    wrong = _renormalised_rows(target_probs.numpy(), top_k, top_p)
    world = lambda target: exact.TabularWorld(VOCAB, max_len, target, draft)  # noqa: E731
    return world(served), world(law), world(wrong)


def _reference(law: exact.TabularWorld) -> dict:
    reference = exact.target_prefix_distribution(law, PREFIX_LEN)
    assert sum(mass > 1e-3 for mass in reference.values()) > 5  # the filters leave a real choice
    return reference


@pytest.mark.parametrize("params", PARAMS)
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("method", ["hsd", "tokenwise"])
def test_chain_emits_the_non_speculative_law(params, seed, method):
    num_draft = 2
    served, law, wrong = _worlds(params, PREFIX_LEN - 1 + num_draft, seed)
    reference = _reference(law)
    got = exact.speculative_prefix_distribution(served, method, num_draft, PREFIX_LEN)
    assert exact.total_variation(got, reference) < LOSSLESS_TV
    wrong_law = exact.speculative_prefix_distribution(wrong, method, num_draft, PREFIX_LEN)
    assert exact.total_variation(wrong_law, reference) > LOSSY_TV


@pytest.mark.parametrize("params", PARAMS)
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("topk,depth", [(2, 2), (3, 2)])
def test_sampled_tree_emits_the_non_speculative_law(params, seed, topk, depth):
    served, law, wrong = _worlds(params, PREFIX_LEN - 1 + depth, seed)
    reference = _reference(law)
    for method in ("hsd", "target-only"):
        got = tree_exact.tree_prefix_distribution(served, method, topk, depth, PREFIX_LEN)
        assert exact.total_variation(got, reference) < LOSSLESS_TV, method
        wrong_law = tree_exact.tree_prefix_distribution(wrong, method, topk, depth, PREFIX_LEN)
        assert exact.total_variation(wrong_law, reference) > LOSSY_TV, method


# ---------------------------------------------------------------------------------------------
# The batched implementation: the server's level-synchronous drafter + ``verify_tree``.
# ---------------------------------------------------------------------------------------------

NUM_SEQUENCES = 12_000
P_VALUE_FLOOR = 1e-4
REJECT_P_VALUE = 1e-6
SHAPE = TreeShape(depth=2, topk=3, num_draft_tokens=6)  # k = 3 > the support top_k 2 leaves q


def _simulate_served_tree(world: exact.TabularWorld, seed: int):
    def draft(q_fn, roots, gen):
        root_q = q_fn(roots.view(-1, 1, 1))[:, 0]
        noise = KeyedNoise.fresh(torch.zeros_like(roots), gen)
        drafter = LevelDrafter(DraftPlan.build(SHAPE, "spine_wide"), root_q,
                               torch.zeros_like(roots, dtype=torch.bool), noise, validate=False)
        return drive(drafter, q_fn, roots, context="slot")

    return simulate_tree(world, "hsd", SHAPE.topk, SHAPE.depth, PREFIX_LEN, NUM_SEQUENCES,
                         torch.Generator().manual_seed(seed), dtype=torch.float64, draft_fn=draft)


@pytest.mark.statistical
def test_batched_tree_round_emits_the_non_speculative_law():
    """The server's drafter (children past q's support marked invalid) and ``verify_tree`` on
    rows built by ``filter_probs``: chi-square against the non-speculative law; the same run on
    the renormalised rows is rejected."""
    served, law, wrong = _worlds(PARAMS[1], PREFIX_LEN - 1 + SHAPE.depth, seed=0)
    _reference(law)
    expected = target_prefix_probs(law, PREFIX_LEN)
    counts = _simulate_served_tree(served, seed=3).prefix_counts(VOCAB)
    assert chi_square_p_value(counts, expected) > P_VALUE_FLOOR
    wrong_counts = _simulate_served_tree(wrong, seed=3).prefix_counts(VOCAB)
    assert chi_square_p_value(wrong_counts, expected) < REJECT_P_VALUE
