"""The tree-method registry: one typed entry per verification rule ``verify_tree`` accepts.

The rules and why each is (or is not) lossless are in ``reference.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from sglang_hsd.verify.tree.reference import (
    greedy_final_node,
    hsd_final_node,
    rrs_final_node,
    target_only_final_node,
)
from sglang_hsd.verify.tree.types import TreeBatch, TreeUniforms

# (tree, uniforms) -> (accepted node int64 [B], next-token weights float [B, V], unnormalised).
TreeRule = Callable[[TreeBatch, TreeUniforms], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class TreeMethod:
    """One tree verification rule.

    Fields:
        name: the key in ``TREE_METHODS`` (what ``verify_tree(method=...)`` takes).
        description: one line for listings.
        final_node: the plain-torch rule (CPU path and kernel oracle).
        reads_q: the rule reads ``draft_probs``; ``False`` lets callers pass ``None``.
        lossless: the output distribution equals the target's for trees drafted as the rule
            expects (``tests/verify/tree/test_exact.py``).
        distinct_siblings: lossless only when siblings carry distinct tokens (checked on input).
        triton_kernel: name of the wrapper in ``tree/triton.py`` implementing the rule, or ``None``.
        argmax_next_token: the token after the accepted path is the argmax of the weights
            instead of an inverse-CDF draw with ``uniforms.sample``.
    """

    name: str
    description: str
    final_node: TreeRule
    reads_q: bool
    lossless: bool
    distinct_siblings: bool
    triton_kernel: str | None = None
    argmax_next_token: bool = False


TREE_METHODS: dict[str, TreeMethod] = {
    method.name: method
    for method in (
        TreeMethod(
            name="hsd",
            description="traversal verification with the real q, leaves tested bottom-up",
            final_node=hsd_final_node,
            reads_q=True,
            lossless=True,
            distinct_siblings=True,
            triton_kernel="hsd_final_node_triton",
        ),
        TreeMethod(
            name="rrs",
            description="top-down recursive rejection sampling with the real q",
            final_node=rrs_final_node,
            reads_q=True,
            lossless=True,
            distinct_siblings=True,
        ),
        TreeMethod(
            name="target-only",
            description="SGLang's walk: nodes treated as one-hot, one coin per accepted node",
            final_node=target_only_final_node,
            reads_q=False,
            lossless=True,
            distinct_siblings=True,
            triton_kernel="target_only_final_node_triton",
        ),
        TreeMethod(
            name="greedy",
            description="follow the child whose token is the target argmax",
            final_node=greedy_final_node,
            reads_q=False,
            lossless=False,
            distinct_siblings=False,
            argmax_next_token=True,
        ),
    )
}
