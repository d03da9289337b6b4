"""A whole sampled-tree round on a tiny random draft head: what the capture, compile and GPU checks run.

The head is EAGLE-like: a beam's hidden state is tanh(embedding of its token + the hidden state of
the row it continues), its q the softmax of a projection. ``draft_round`` drives ``LevelDrafter``
with it as the server's loop drives it with a draft model (k beams per forward, hidden rows picked
by the drafter); ``verify_round`` is the verify step the server runs after the target's forward
(no input checks, depth given). Both are pure tensor programs: the tests run them under
``torch.compile(fullgraph=True)``, with host synchronisation forbidden, and captured in a CUDA graph.
"""

from __future__ import annotations

import torch

from sglang_hsd.tree_draft.drafter import DraftPlan, LevelDrafter
from sglang_hsd.tree_draft.noise import KeyedNoise
from sglang_hsd.verify.tree.api import verify_tree
from sglang_hsd.verify.tree.types import TreeUniforms


class TinyHead(torch.nn.Module):
    """Random draft head over ``vocab`` tokens with ``hidden`` features (weights from ``seed``)."""

    def __init__(self, vocab: int, hidden: int = 8, seed: int = 0, device="cpu"):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.embed = torch.nn.Parameter(torch.randn(vocab, hidden, generator=gen).to(device))
        self.proj = torch.nn.Parameter((2 * torch.randn(hidden, vocab, generator=gen)).to(device))

    def forward(self, ids: torch.Tensor, parent_hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """ids int64 [R], parent_hidden float [R, H] -> (q float [R, V], hidden float [R, H])."""
        hidden = torch.tanh(self.embed[ids] + parent_hidden)
        return torch.softmax(hidden @ self.proj, -1), hidden


def draft_round(head: TinyHead, plan: DraftPlan, root_hidden: torch.Tensor, root_q: torch.Tensor,
                deterministic: torch.Tensor, seed: torch.Tensor, position: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """One draft round with keyed noise.

    Args:
        root_hidden: float [B, H]; root_q: float [B, V]; deterministic: bool [B];
        seed, position: int64 [B], the noise keys.
    Returns:
        (parent_list, top_scores_index, candidates, draft_probs, retrive_next_token,
        retrive_next_sibling, depths, num_kept) of the ``LevelTree``.
    """
    drafter = LevelDrafter(plan, root_q, deterministic, KeyedNoise(seed, position), validate=False)
    hidden = root_hidden
    step = drafter.first()
    for _ in range(plan.shape.depth - 1):
        q_rows, hidden = head(step.input_ids, hidden[step.hidden_rows])
        step = drafter.step(q_rows)
    tree = drafter.finish()
    return (tree.parent_list, tree.top_scores_index, tree.candidates, tree.draft_probs,
            tree.retrive_next_token, tree.retrive_next_sibling, tree.depths, tree.num_kept)


def verify_round(tree: tuple[torch.Tensor, ...], target_probs: torch.Tensor, accept: torch.Tensor,
                 sample: torch.Tensor, depth: int, backend: str = "auto",
                 draft_mode: str = "without-replacement") -> tuple[torch.Tensor, ...]:
    """``verify_tree(method="hsd")`` of ``draft_round``'s tree against ``target_probs`` float [B, N, V]
    with uniforms ``accept`` [B, N] and ``sample`` [B] (``draft_mode``: the child sampler's).
    Returns (accept_index, num_accepted, tokens)."""
    _, _, candidates, draft_probs, next_token, next_sibling, _, _ = tree
    result = verify_tree(candidates, next_token, next_sibling, draft_probs, target_probs, method="hsd",
                         uniforms=TreeUniforms(accept, sample), validate=False, max_depth=depth, backend=backend,
                         draft_mode=draft_mode)
    return result.accept_index, result.num_accepted, result.tokens


def whole_round(head: TinyHead, plan: DraftPlan, backend: str = "auto"):
    """The round the checks run: ``draft_round`` then ``verify_round`` against a target near the
    drafter (``close_target``, so drafts are accepted). Returns a function of ``round_inputs``'
    fields giving (the tree's tensors, the verify result's tensors)."""

    def run(root_hidden, root_q, deterministic, seed, position, target, accept, sample):
        tree = draft_round(head, plan, root_hidden, root_q, deterministic, seed, position)
        return tree, verify_round(tree, close_target(tree[3], target), accept, sample, plan.shape.depth, backend,
                                  plan.sampler.draft_mode)

    return run


def close_target(draft_probs: torch.Tensor, noise_rows: torch.Tensor, weight: float = 0.8) -> torch.Tensor:
    """A target near the drafter, so rounds accept drafts: ``weight`` q + (1 - weight) noise rows,
    renormalised (rows of leaves, zero in q, become the noise rows). Both float [B, N, V]."""
    mixed = weight * draft_probs + (1 - weight) * noise_rows
    return mixed / mixed.sum(-1, keepdim=True)


def round_inputs(batch: int, shape, vocab: int, hidden: int = 8, seed: int = 0, device="cpu") -> dict:
    """Random inputs of one round (every third row deterministic): root_hidden, root_q,
    deterministic, seed, position, target [B, N, V], accept [B, N], sample [B]."""
    gen = torch.Generator().manual_seed(seed)
    inputs = dict(
        root_hidden=torch.randn(batch, hidden, generator=gen),
        root_q=torch.softmax(2 * torch.randn(batch, vocab, generator=gen), -1),
        deterministic=torch.arange(batch) % 3 == 1,
        seed=torch.randint(0, 2**40, (batch,), generator=gen),
        position=torch.randint(0, 1000, (batch,), generator=gen),
        target=torch.softmax(2 * torch.randn(batch, shape[2], vocab, generator=gen), -1),
        accept=torch.rand(batch, shape[2], generator=gen),
        sample=torch.rand(batch, generator=gen),
    )
    return {name: value.to(device) for name, value in inputs.items()}
