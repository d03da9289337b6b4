"""Chain (topk = 1) verification.

``api.py`` is the entry point (``verify_chain``), ``methods.py`` the registry of rules
(``CHAIN_METHODS``), ``reference.py`` the plain-torch rules with their math, ``triton.py`` the GPU
kernel for ``hsd`` and ``tokenwise``, ``types.py`` the result type shared by both.
"""

from sglang_hsd.verify.chain.api import expected_accepted_per_length, verify_chain
from sglang_hsd.verify.chain.methods import CHAIN_METHODS, LOSSLESS_CHAIN_METHODS, ChainMethod
from sglang_hsd.verify.chain.reference import hsd_weights
from sglang_hsd.verify.chain.types import ChainVerifyResult

__all__ = [
    "CHAIN_METHODS",
    "LOSSLESS_CHAIN_METHODS",
    "ChainMethod",
    "ChainVerifyResult",
    "expected_accepted_per_length",
    "hsd_weights",
    "verify_chain",
]
