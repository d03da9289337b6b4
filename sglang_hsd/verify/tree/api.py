"""``verify_tree``: input checks, dispatch through ``TREE_METHODS`` to the torch reference or a
Triton kernel, and assembly of the accepted path and emitted tokens."""

from __future__ import annotations

import torch

from sglang_hsd.verify.common import PLACEHOLDER_TOKEN_ID, assemble_emitted, inverse_cdf_sample, use_triton
from sglang_hsd.verify.tree.layout import depths_from_parents, parents_from_links
from sglang_hsd.verify.tree.methods import TREE_METHODS
from sglang_hsd.verify.tree.types import TreeBatch, TreeUniforms, TreeVerifyResult
from sglang_hsd.verify.tree.validation import validate_tree_inputs

DRAFT_MODES = ("without-replacement", "iid", "argmax-first")


def verify_tree(
    candidates: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    method: str = "hsd",
    generator: torch.Generator | None = None,
    uniforms: TreeUniforms | None = None,
    validate: bool = True,
    backend: str = "auto",
    draft_mode: str = "without-replacement",
    max_depth: int | None = None,
    num_kept: torch.Tensor | None = None,
) -> TreeVerifyResult:
    """Verify a batch of draft trees (SGLang layout, see ``tree/layout.py``) against the target.

    Args:
        candidates: int64 [B, N], node tokens; column 0 is the root (last verified token).
        retrive_next_token / retrive_next_sibling: int64 [B, N], first child / next sibling, -1 none.
        draft_probs: float [B, N, V]; row n is q(.|path to n), the distribution n's children were
            drafted from (rows of leaves are ignored). ``None`` allowed for methods that ignore q.
        target_probs: float [B, N, V]; row n is p(.|path to n), the target for n's children (and
            the bonus distribution if n is accepted as a leaf).
        method: a key of ``TREE_METHODS``.
        generator / uniforms: randomness (``TreeUniforms`` makes implementations comparable).
        validate: check inputs (host synchronisation); pass ``False`` on hot paths.
        backend: ``"auto"`` (Triton on CUDA when the method has a kernel), ``"torch"``, ``"triton"``.
        draft_mode: how children were drafted: ``"without-replacement"`` (sequentially, earlier
            siblings removed from q and renormalised; also K independent paths merged into a
            prefix tree), ``"iid"`` (children i.i.d. from q, duplicates kept as siblings) or
            ``"argmax-first"`` (a node's first child is q's argmax, its later siblings drawn
            without replacement from q without it: ``tree_draft.CHILD_SAMPLERS["argmax_first"]``).
        max_depth: depth D of the deepest node; computed (one host sync) when ``None``.
        num_kept: int64 [B], optional: request b's tree is nodes 0..num_kept[b] and later columns
            are filler (no links, unreachable), as ``LevelTree`` leaves when q's support runs
            out; validation checks them as filler instead of refusing them as orphans. None:
            every node belongs to the tree. Read by validation only.
    Returns:
        ``TreeVerifyResult``.
    """
    if method not in TREE_METHODS:
        raise ValueError(f"method must be one of {sorted(TREE_METHODS)}, got {method!r}")
    if draft_mode not in DRAFT_MODES:
        raise ValueError(f"draft_mode must be one of {DRAFT_MODES}, got {draft_mode!r}")
    rule = TREE_METHODS[method]
    if validate:
        validate_tree_inputs(
            candidates, retrive_next_token, retrive_next_sibling, draft_probs, target_probs,
            reads_q=rule.reads_q,
            distinct_siblings=rule.distinct_siblings and (draft_mode != "iid" or not rule.reads_q),
            uniforms=uniforms, num_kept=num_kept,
        )
    batch, num_nodes = candidates.shape
    if uniforms is None:
        uniforms = TreeUniforms.draw(batch, num_nodes, target_probs.device, generator)
    parents = parents_from_links(retrive_next_token, retrive_next_sibling)
    depths = depths_from_parents(parents)
    if max_depth is None:
        max_depth = int(depths.max())
    tree = TreeBatch(
        candidates.long(), retrive_next_token.long(), retrive_next_sibling.long(), parents,
        draft_probs, target_probs, remove_rejected=(draft_mode != "iid"), argmax_first=(draft_mode == "argmax-first"),
    )
    if use_triton(backend, method, TREE_METHODS, "tree", target_probs):
        from sglang_hsd.verify.tree import triton as kernels

        final_node, weights = getattr(kernels, rule.triton_kernel)(tree, uniforms)
    else:
        final_node, weights = rule.final_node(tree, uniforms)
    if rule.argmax_next_token:
        next_token = weights.argmax(dim=-1)
    else:
        next_token = inverse_cdf_sample(weights, uniforms.sample)
    return _assemble(tree, depths, max_depth, final_node, next_token)


def _assemble(tree: TreeBatch, depths, max_depth: int, final_node, next_token) -> TreeVerifyResult:
    """Accepted path (root to ``final_node``) and emitted tokens."""
    batch = final_node.shape[0]
    rows = torch.arange(batch, device=final_node.device)
    num_accepted = depths[rows, final_node]
    # Column max_depth + 1 is a sink for writes past the root; dropped below.
    accept_index = torch.full((batch, max_depth + 2), PLACEHOLDER_TOKEN_ID, dtype=torch.long, device=rows.device)
    node = final_node
    for _ in range(max_depth + 1):
        column = torch.where(node >= 0, depths[rows, node.clamp_min(0)], max_depth + 1)
        accept_index[rows, column] = torch.where(node >= 0, node, PLACEHOLDER_TOKEN_ID)
        node = torch.where(node >= 0, tree.parents[rows, node.clamp_min(0)], node)
    accept_index = accept_index[:, : max_depth + 1]
    path_tokens = tree.candidates.gather(1, accept_index[:, 1:].clamp_min(0))
    tokens = assemble_emitted(path_tokens, num_accepted, next_token)
    return TreeVerifyResult(accept_index, num_accepted, tokens)
