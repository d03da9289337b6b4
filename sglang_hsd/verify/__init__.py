"""Lossless verifiers for speculative decoding.

``verify_chain`` verifies one draft chain per request (``chain.py``); the exact-enumeration oracle
lives in ``exact.py``.
"""

from sglang_hsd.verify.chain import (
    CHAIN_METHODS,
    LOSSLESS_CHAIN_METHODS,
    ChainVerifyResult,
    verify_chain,
)
from sglang_hsd.verify.common import PLACEHOLDER_TOKEN_ID, ChainUniforms

__all__ = [
    "CHAIN_METHODS",
    "LOSSLESS_CHAIN_METHODS",
    "ChainUniforms",
    "ChainVerifyResult",
    "PLACEHOLDER_TOKEN_ID",
    "verify_chain",
]
