"""Input checks of ``verify_tree`` (host synchronisation; callers on a hot path validate once)."""

from __future__ import annotations

import torch

from sglang_hsd.verify.tree.layout import check_tree_layout, parents_from_links
from sglang_hsd.verify.validation import (
    check_drafted_tokens_have_mass,
    check_prob_rows,
    check_token_ids,
    check_uniforms,
)


def validate_tree_inputs(
    candidates, next_token, next_sibling, draft_probs, target_probs, reads_q: bool, distinct_siblings: bool, uniforms,
    num_kept=None,
) -> None:
    """Raise ``ValueError`` naming the argument on any malformed input (see ``verify_tree``;
    ``num_kept`` declares the filler columns ``check_tree_layout`` accepts)."""
    if not isinstance(candidates, torch.Tensor) or candidates.dim() != 2:
        raise ValueError("candidates must be an int64 tensor of shape [B, N]")
    batch, num_nodes = candidates.shape
    for name, links in (("retrive_next_token", next_token), ("retrive_next_sibling", next_sibling)):
        if not isinstance(links, torch.Tensor) or tuple(links.shape) != (batch, num_nodes):
            raise ValueError(f"{name} must have the shape of candidates [{batch}, {num_nodes}]")
    if not isinstance(target_probs, torch.Tensor) or target_probs.dim() != 3 or tuple(target_probs.shape[:2]) != (batch, num_nodes):
        raise ValueError(
            f"target_probs must have shape [B, N, V] = [{batch}, {num_nodes}, V], got "
            f"{list(getattr(target_probs, 'shape', []))}"
        )
    vocab = target_probs.shape[-1]
    check_token_ids("candidates", candidates, vocab)
    check_tree_layout(next_token, next_sibling, num_kept=num_kept)
    check_prob_rows("target_probs", target_probs)
    parents = parents_from_links(next_token, next_sibling)
    if distinct_siblings:
        _check_distinct_siblings(candidates, parents)
    if uniforms is not None:
        check_uniforms("uniforms.accept", uniforms.accept, (batch, num_nodes))
        check_uniforms("uniforms.sample", uniforms.sample, (batch,))
    if draft_probs is None:
        if reads_q:
            raise ValueError("draft_probs is required for methods that read q ('hsd', 'rrs')")
        return
    if tuple(draft_probs.shape) != (batch, num_nodes, vocab):
        raise ValueError(
            f"draft_probs must have shape [B, N, V] = [{batch}, {num_nodes}, {vocab}], got {list(draft_probs.shape)}"
        )
    if not reads_q:
        return
    has_children = next_token >= 0
    check_prob_rows("draft_probs (rows of nodes with children)", draft_probs[has_children])
    rows = torch.arange(batch, device=candidates.device).unsqueeze(-1)
    q_of_node = draft_probs[rows, parents.clamp_min(0), candidates.long()]  # q_parent(token), [B, N]
    q_of_node[:, 0] = 1.0  # the root was not drafted
    if num_kept is not None:  # nor were filler nodes (their tokens are placeholders)
        filler = torch.arange(num_nodes, device=candidates.device) > num_kept.to(candidates.device).unsqueeze(-1)
        q_of_node = q_of_node.masked_fill(filler, 1.0)
    check_drafted_tokens_have_mass(candidates, q_of_node, name="draft_probs")


def _check_distinct_siblings(candidates: torch.Tensor, parents: torch.Tensor) -> None:
    same_parent = (parents.unsqueeze(-1) == parents.unsqueeze(-2)) & (parents.unsqueeze(-1) >= 0)
    same_token = candidates.unsqueeze(-1) == candidates.unsqueeze(-2)
    eye = torch.eye(candidates.shape[1], dtype=torch.bool, device=candidates.device)
    clash = same_parent & same_token & ~eye
    if bool(clash.any()):
        b, i, j = clash.nonzero()[0].tolist()
        raise ValueError(
            f"candidates: request {b} has siblings {i} and {j} with the same token {int(candidates[b, i])}; "
            "this method and draft mode need distinct siblings (draft without replacement, or "
            "draft_mode='iid' for i.i.d. children)"
        )
