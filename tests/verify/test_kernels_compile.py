"""Every Triton kernel compiles for a Hopper GPU (sm_90), ahead of time, on this CPU machine.

``TRITON_INTERPRET=1`` runs kernels as Python and never type-checks them: a global read that is
not a ``tl.constexpr``, or a loop variable whose type changes between branches, only fails when
Triton compiles for a GPU. ``triton.compile`` with a ``GPUTarget`` runs that whole compiler (and
the ptxas the Triton wheel ships) without a device, so these errors surface here first.
"""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from sglang_hsd.verify.chain.triton import _chain_verify_kernel  # noqa: E402
from sglang_hsd.verify.tree.triton import _hsd_tree_kernel, _target_only_tree_kernel  # noqa: E402

HOPPER = GPUTarget("cuda", 90, 32)
CHAIN = {"draft_ptr": "*i64", "q_ptr": "*fp32", "p_ptr": "*fp32", "accept_u_ptr": "*fp32", "sample_u_ptr": "*fp32",
         "lengths_ptr": "*i64", "num_accepted_ptr": "*i64", "tokens_ptr": "*i64", "K": "i32", "V": "i32",
         "IS_HSD": "constexpr", "BLOCK_V": "constexpr"}
HSD_TREE = {"cand_ptr": "*i64", "first_ptr": "*i64", "sibling_ptr": "*i64", "parent_ptr": "*i64", "mb_ptr": "*fp32",
            "ms_ptr": "*fp32", "weight_ptr": "*fp32", "accept_u_ptr": "*fp32", "final_ptr": "*i64", "num_nodes": "i32",
            "vocab": "i32", "REMOVE_REJECTED": "constexpr", "BLOCK_V": "constexpr"}
TARGET_ONLY_TREE = {"cand_ptr": "*i64", "first_ptr": "*i64", "sibling_ptr": "*i64", "target_ptr": "*fp32",
                    "accept_u_ptr": "*fp32", "final_ptr": "*i64", "num_nodes": "i32", "vocab": "i32"}
CASES = [
    (_chain_verify_kernel, CHAIN, {"IS_HSD": True, "BLOCK_V": 1024}),
    (_chain_verify_kernel, CHAIN, {"IS_HSD": False, "BLOCK_V": 1024}),
    (_hsd_tree_kernel, HSD_TREE, {"REMOVE_REJECTED": True, "BLOCK_V": 1024}),
    (_hsd_tree_kernel, HSD_TREE, {"REMOVE_REJECTED": False, "BLOCK_V": 1024}),
    (_target_only_tree_kernel, TARGET_ONLY_TREE, {}),
]


@pytest.mark.parametrize("kernel,signature,constexprs", CASES,
                         ids=[f"{k.fn.__name__}-{'-'.join(f'{a}{b}' for a, b in c.items())}" for k, _, c in CASES])
def test_kernel_compiles_for_hopper(kernel, signature, constexprs):
    # Under TRITON_INTERPRET=1 (the test suite's setting on CPU) ``@triton.jit`` gives an
    # interpreted function; compile the same Python function as a GPU kernel.
    jit = kernel if isinstance(kernel, JITFunction) else JITFunction(kernel.fn)
    names = list(signature)
    source = ASTSource(fn=jit, signature=signature,
                       constexprs={(names.index(name),): value for name, value in constexprs.items()})
    compiled = triton.compile(source, target=HOPPER)
    assert len(compiled.asm["cubin"]) > 0
