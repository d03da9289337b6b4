"""Tree (topk > 1) verification in SGLang's draft-tree layout.

``api.py`` is the entry point (``verify_tree``), ``methods.py`` the registry of rules
(``TREE_METHODS``), ``reference.py`` the plain-torch rules with their math, ``triton.py`` the GPU
kernels for ``hsd`` and ``target-only``, ``types.py`` the shared types. Around them: ``draft.py``
drafts trees with their real q, ``expand.py`` budgeted trees for the server's
(depth, topk, num_draft_tokens), ``level_draft.py`` the same trees drafted
level-synchronously in the server's draft loop (SGLang's pool layout; rules in
``level_rules.py``), ``layout.py`` reads SGLang's first-child / next-sibling links, ``mask.py`` builds tree attention masks, ``validation.py`` checks ``verify_tree``'s inputs.
"""

from sglang_hsd.verify.tree.api import DRAFT_MODES, verify_tree
from sglang_hsd.verify.tree.draft import DraftTree, full_tree_links, sample_tree, topk_tree
from sglang_hsd.verify.tree.expand import DEFAULT_RULE, EXPANSION_RULES, ExpandConfig, ExpansionRule, expand_tree
from sglang_hsd.verify.tree.level_draft import DEFAULT_LEVEL_RULE, LEVEL_RULES, LevelDrafter, LevelRule, LevelTree, StepInput
from sglang_hsd.verify.tree.layout import depths_from_parents, parents_from_links
from sglang_hsd.verify.tree.mask import FlashInferTreeMask, flashinfer_tree_mask, pack_bits, tree_attention_mask
from sglang_hsd.verify.tree.methods import TREE_METHODS, TreeMethod
from sglang_hsd.verify.tree.types import TreeBatch, TreeUniforms, TreeVerifyResult

__all__ = [
    "DEFAULT_LEVEL_RULE",
    "DEFAULT_RULE",
    "LEVEL_RULES",
    "LevelDrafter",
    "LevelRule",
    "LevelTree",
    "StepInput",
    "DRAFT_MODES",
    "EXPANSION_RULES",
    "ExpandConfig",
    "ExpansionRule",
    "TREE_METHODS",
    "DraftTree",
    "FlashInferTreeMask",
    "TreeBatch",
    "TreeMethod",
    "TreeUniforms",
    "TreeVerifyResult",
    "depths_from_parents",
    "expand_tree",
    "flashinfer_tree_mask",
    "full_tree_links",
    "pack_bits",
    "parents_from_links",
    "sample_tree",
    "topk_tree",
    "tree_attention_mask",
    "verify_tree",
]
