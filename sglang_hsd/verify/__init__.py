"""Lossless verifiers for speculative decoding, one folder per operation.

``chain/`` verifies one draft chain per request (``verify_chain``), ``tree/`` one draft tree per
request in SGLang's layout (``verify_tree``; drafting, layout and attention masks beside it). Each
keeps its plain-torch reference (the CPU path and the kernels' oracle) beside its Triton kernel and
dispatches through one method registry (``CHAIN_METHODS``, ``TREE_METHODS``). ``common.py`` and
``validation.py`` hold what both share. ``oracles/`` holds the exact-enumeration and Monte Carlo
oracles and their statistics, apart from the serving path.
"""

from sglang_hsd.verify.chain import (
    CHAIN_METHODS,
    LOSSLESS_CHAIN_METHODS,
    ChainMethod,
    ChainVerifyResult,
    verify_chain,
)
from sglang_hsd.verify.common import PLACEHOLDER_TOKEN_ID, ChainUniforms
from sglang_hsd.verify.tree import (
    TREE_METHODS,
    TreeMethod,
    TreeUniforms,
    TreeVerifyResult,
    flashinfer_tree_mask,
    tree_attention_mask,
    verify_tree,
)

__all__ = [
    "CHAIN_METHODS",
    "LOSSLESS_CHAIN_METHODS",
    "ChainMethod",
    "ChainUniforms",
    "ChainVerifyResult",
    "PLACEHOLDER_TOKEN_ID",
    "verify_chain",
    "TREE_METHODS",
    "TreeMethod",
    "TreeUniforms",
    "TreeVerifyResult",
    "flashinfer_tree_mask",
    "tree_attention_mask",
    "verify_tree",
]
