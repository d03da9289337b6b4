"""Random verification inputs built directly on a device, for the GPU check (``benchmarks/gpu_check.py``)
and its kernel tests (``tests/gpu/``).

Rows are softmaxes of random float32 logits generated on the device (no host copies, so a
[64, 64, 128256] batch is built in milliseconds). Three input regimes, each catching a different
class of kernel fault:

* ``close``: the target is 80 % the draft plus 20 % an unrelated row, so p/q is near 1 and drafts
  are accepted deep (long entry / test walks, capped ratios above 1 for chain ``hsd``);
* ``unrelated``: draft and target independent, so most requests reject early and the residual
  ``max(0, p - q)`` rows are wide (folds up to the root in trees);
* ``peaked``: draft and target share one sharp logit vector plus small noise, so rows are nearly
  one-hot; p(x) can underflow to exactly 0 and residuals can be empty (the fallback paths).

Trees have any node count N: the parent of node n is drawn uniformly from the ``reach`` nodes
before it, with the reach cycling over the batch rows (1: a chain, 3: deep and narrow, N: a
random recursive tree, bushy at the root), and every node's children are drawn from its parent's
draft row, without replacement (distinct siblings, in drafting order) or i.i.d.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_hsd.verify.tree.layout import depths_from_parents, links_from_parents

REGIMES = ("close", "unrelated", "peaked")
# Logit scale of the random rows: LLM next-token rows are peaked (the top token often holds more
# than 10 % of the mass), and scale 3 over 128256 tokens puts most of the mass on a few hundred.
LOGIT_SCALE = 3.0
# ``peaked``: sharp shared logits; the small noise makes draft and target disagree now and then.
PEAKED_SCALE = 12.0
PEAKED_NOISE = 0.3
# ``close``: share of the unrelated row mixed into the target.
CLOSE_MIX = 0.2
# Per-row parent reach of random trees (see the module docstring); the last entry means "all".
TREE_REACHES = (1, 3, None)


def _rows(shape: tuple[int, ...], scale: float, generator: torch.Generator, device) -> torch.Tensor:
    return torch.softmax(scale * torch.randn(*shape, device=device, generator=generator), dim=-1)


def draft_and_target_rows(
    batch: int, draft_rows: int, target_rows: int, vocab: int, regime: str, generator: torch.Generator, device
) -> tuple[torch.Tensor, torch.Tensor]:
    """q float32 [batch, draft_rows, V] and p float32 [batch, target_rows, V] in ``regime``.

    Row t of p is paired with row t of q (t < min(draft_rows, target_rows)); extra target rows
    (a chain's bonus row) are unrelated to any draft row.
    """
    if regime not in REGIMES:
        raise ValueError(f"regime must be one of {REGIMES}, got {regime!r}")
    if regime == "peaked":
        rows = max(draft_rows, target_rows)
        base = torch.randn(batch, rows, vocab, device=device, generator=generator)
        noise_q = torch.randn(batch, draft_rows, vocab, device=device, generator=generator)
        q = torch.softmax(PEAKED_SCALE * (base[:, :draft_rows] + PEAKED_NOISE * noise_q), dim=-1)
        noise_p = torch.randn(batch, target_rows, vocab, device=device, generator=generator)
        return q, torch.softmax(PEAKED_SCALE * (base[:, :target_rows] + PEAKED_NOISE * noise_p), dim=-1)
    q = _rows((batch, draft_rows, vocab), LOGIT_SCALE, generator, device)
    p = _rows((batch, target_rows, vocab), LOGIT_SCALE, generator, device)
    if regime == "close":
        paired = min(draft_rows, target_rows)
        p[:, :paired] = (1 - CLOSE_MIX) * q[:, :paired] + CLOSE_MIX * p[:, :paired]
    return q, p


def chain_inputs(
    batch: int, num_draft: int, vocab: int, regime: str, generator: torch.Generator, device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A chain batch for ``verify_chain``: tokens int64 [B, K] drawn from q, q float32 [B, K, V],
    p float32 [B, K + 1, V]."""
    q, p = draft_and_target_rows(batch, num_draft, num_draft + 1, vocab, regime, generator, device)
    tokens = torch.multinomial(q.view(-1, vocab), 1, generator=generator).view(batch, num_draft)
    return tokens, q, p


@dataclass
class TreeInputs:
    """A batch of draft trees in SGLang's layout with their rows (arguments of ``verify_tree``).

    Fields:
        candidates, first_child, next_sibling, parents: int64 [B, N] (``tree/layout.py``).
        draft_probs, target_probs: float32 [B, N, V]; row n is q / p given the path to node n.
        max_depth: depth of the deepest node over the batch (the hot path's ``max_depth``).
        draft_mode: ``"without-replacement"`` or ``"iid"``, how the children were drawn.
    """

    candidates: torch.Tensor
    first_child: torch.Tensor
    next_sibling: torch.Tensor
    parents: torch.Tensor
    draft_probs: torch.Tensor
    target_probs: torch.Tensor
    max_depth: int
    draft_mode: str

    def links(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(candidates, retrive_next_token, retrive_next_sibling): the first three arguments of
        ``verify_tree``."""
        return self.candidates, self.first_child, self.next_sibling


def random_parents(batch: int, num_nodes: int, generator: torch.Generator, device) -> torch.Tensor:
    """Parents int64 [B, N] of random trees (root -1, parent[n] < n); shapes cycle over
    ``TREE_REACHES`` row by row."""
    node = torch.arange(num_nodes, device=device)
    reach = torch.tensor([r or num_nodes for r in TREE_REACHES], device=device)
    row_reach = reach[torch.arange(batch, device=device) % len(TREE_REACHES)].unsqueeze(-1)  # [B, 1]
    span = torch.minimum(node.unsqueeze(0), row_reach)  # how many earlier nodes may be the parent
    pick = torch.rand(batch, num_nodes, device=device, generator=generator)
    offset = torch.minimum((pick * span).long(), (span - 1).clamp_min(0))
    return torch.where(node == 0, -1, node - 1 - offset)


def sibling_rank(parents: torch.Tensor) -> torch.Tensor:
    """int64 [B, N]: how many earlier nodes share node n's parent (0 for a first child)."""
    num_nodes = parents.shape[1]
    same = parents.unsqueeze(-1) == parents.unsqueeze(-2)  # [B, n, m]
    earlier = torch.ones(num_nodes, num_nodes, dtype=torch.bool, device=parents.device).tril(-1)
    return (same & earlier).sum(-1)


def tree_inputs(
    batch: int, num_nodes: int, vocab: int, regime: str, draft_mode: str, generator: torch.Generator, device
) -> TreeInputs:
    """Random trees of exactly ``num_nodes`` nodes with rows in ``regime`` (module docstring).

    Children of node n are drawn from q row n: ``draft_mode="without-replacement"`` draws them
    sequentially without replacement (distinct siblings, listed in drawing order), ``"iid"`` with
    replacement. One host synchronisation (the widest sibling list and the deepest node).
    """
    if draft_mode not in ("without-replacement", "iid"):
        raise ValueError(f"draft_mode must be 'without-replacement' or 'iid', got {draft_mode!r}")
    draft, target = draft_and_target_rows(batch, num_nodes, num_nodes, vocab, regime, generator, device)
    parents = random_parents(batch, num_nodes, generator, device)
    rank = sibling_rank(parents)
    widest = int(rank.max()) + 1
    draws = torch.multinomial(draft.view(-1, vocab), widest, replacement=(draft_mode == "iid"), generator=generator)
    draws = draws.view(batch, num_nodes, widest)
    parent_draws = draws.gather(1, parents.clamp_min(0).unsqueeze(-1).expand(-1, -1, widest))  # [B, N, widest]
    children = parent_draws.gather(2, rank.unsqueeze(-1)).squeeze(-1)
    root_token = torch.randint(vocab, (batch,), device=device, generator=generator)
    candidates = torch.where(parents >= 0, children, root_token.unsqueeze(-1))
    first_child, next_sibling = links_from_parents(parents)
    max_depth = int(depths_from_parents(parents).max())
    return TreeInputs(candidates, first_child, next_sibling, parents, draft, target, max_depth, draft_mode)
