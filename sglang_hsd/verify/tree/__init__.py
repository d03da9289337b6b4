"""Tree (topk > 1) verification in SGLang's draft-tree layout.

``api.py`` is the entry point (``verify_tree``), ``methods.py`` the registry of rules
(``TREE_METHODS``), ``reference.py`` the plain-torch rules with their math, ``triton.py`` the GPU
kernels for ``hsd`` and ``target-only``, ``types.py`` the shared types. Around them: ``layout.py``
reads SGLang's first-child / next-sibling links, ``mask.py`` builds tree attention masks,
``validation.py`` checks ``verify_tree``'s inputs. Trees are drafted by ``sglang_hsd.tree_draft``
(the server's and the runtime's drafter); the exact study's sequential drafters are in
``sglang_hsd/verify/oracles/``.
"""

from sglang_hsd.verify.tree.api import DRAFT_MODES, verify_tree
from sglang_hsd.verify.tree.layout import depths_from_parents, parents_from_links
from sglang_hsd.verify.tree.mask import FlashInferTreeMask, flashinfer_tree_mask, pack_bits, tree_attention_mask
from sglang_hsd.verify.tree.methods import TREE_METHODS, TreeMethod
from sglang_hsd.verify.tree.types import TreeBatch, TreeUniforms, TreeVerifyResult

__all__ = [
    "DRAFT_MODES",
    "TREE_METHODS",
    "FlashInferTreeMask",
    "TreeBatch",
    "TreeMethod",
    "TreeUniforms",
    "TreeVerifyResult",
    "depths_from_parents",
    "flashinfer_tree_mask",
    "pack_bits",
    "parents_from_links",
    "tree_attention_mask",
    "verify_tree",
]
