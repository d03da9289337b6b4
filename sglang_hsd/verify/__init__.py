"""Lossless verifiers for speculative decoding.

``verify_chain`` verifies one draft chain per request (``chain.py``), ``verify_tree`` one draft
tree per request in SGLang's layout (``tree.py``; drafting in ``tree_draft.py``, attention masks in
``tree_mask.py``); the exact-enumeration oracles live in ``exact.py`` and ``tree_exact.py``.
"""

from sglang_hsd.verify.chain import (
    CHAIN_METHODS,
    LOSSLESS_CHAIN_METHODS,
    ChainVerifyResult,
    verify_chain,
)
from sglang_hsd.verify.common import PLACEHOLDER_TOKEN_ID, ChainUniforms
from sglang_hsd.verify.tree import TREE_METHODS, TreeUniforms, TreeVerifyResult, verify_tree
from sglang_hsd.verify.tree_draft import DraftTree, sample_tree, topk_tree
from sglang_hsd.verify.tree_mask import flashinfer_tree_mask, tree_attention_mask

__all__ = [
    "CHAIN_METHODS",
    "LOSSLESS_CHAIN_METHODS",
    "ChainUniforms",
    "ChainVerifyResult",
    "PLACEHOLDER_TOKEN_ID",
    "verify_chain",
    "TREE_METHODS",
    "DraftTree",
    "TreeUniforms",
    "TreeVerifyResult",
    "flashinfer_tree_mask",
    "sample_tree",
    "topk_tree",
    "tree_attention_mask",
    "verify_tree",
]
