"""Compile every Triton kernel for a Hopper GPU (sm_90) on this machine: ``python -m
tests.verify.kernel_compile_check`` prints one line per kernel variant, ``ok`` or the error, and
exits 1 if any failed. Run in a process without ``TRITON_INTERPRET`` (which replaces Triton's
language functions with Python ones and would break the compiler): ``test_kernels_compile.py``
starts it so."""

from __future__ import annotations

import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from sglang_hsd.verify.chain.triton import _chain_verify_kernel
from sglang_hsd.verify.tree.triton import _hsd_tree_kernel, _target_only_tree_kernel

HOPPER = GPUTarget("cuda", 90, 32)
CHAIN = {"draft_ptr": "*i64", "q_ptr": "*fp32", "p_ptr": "*fp32", "accept_u_ptr": "*fp32", "sample_u_ptr": "*fp32",
         "lengths_ptr": "*i64", "num_accepted_ptr": "*i64", "tokens_ptr": "*i64", "K": "i32", "V": "i32",
         "IS_HSD": "constexpr", "BLOCK_V": "constexpr"}
HSD_TREE = {"cand_ptr": "*i64", "first_ptr": "*i64", "sibling_ptr": "*i64", "parent_ptr": "*i64", "mb_ptr": "*fp32",
            "ms_ptr": "*fp32", "weight_ptr": "*fp32", "accept_u_ptr": "*fp32", "final_ptr": "*i64", "num_nodes": "i32",
            "vocab": "i32", "REMOVE_REJECTED": "constexpr", "ARGMAX_FIRST": "constexpr", "BLOCK_V": "constexpr"}
TARGET_ONLY_TREE = {"cand_ptr": "*i64", "first_ptr": "*i64", "sibling_ptr": "*i64", "target_ptr": "*fp32",
                    "accept_u_ptr": "*fp32", "final_ptr": "*i64", "num_nodes": "i32", "vocab": "i32"}
VARIANTS = [  # (kernel, signature, constexpr values)
    (_chain_verify_kernel, CHAIN, {"IS_HSD": True, "BLOCK_V": 1024}),
    (_chain_verify_kernel, CHAIN, {"IS_HSD": False, "BLOCK_V": 1024}),
    (_hsd_tree_kernel, HSD_TREE, {"REMOVE_REJECTED": True, "ARGMAX_FIRST": False, "BLOCK_V": 1024}),
    (_hsd_tree_kernel, HSD_TREE, {"REMOVE_REJECTED": False, "ARGMAX_FIRST": False, "BLOCK_V": 1024}),
    (_hsd_tree_kernel, HSD_TREE, {"REMOVE_REJECTED": True, "ARGMAX_FIRST": True, "BLOCK_V": 1024}),
    (_target_only_tree_kernel, TARGET_ONLY_TREE, {}),
]


def label(kernel, constexprs: dict) -> str:
    return f"{kernel.fn.__name__}({', '.join(f'{k}={v}' for k, v in constexprs.items())})"


def compile_variant(kernel, signature: dict, constexprs: dict) -> int:
    """Compile one variant for ``HOPPER``; returns the size of its cubin in bytes."""
    names = list(signature)
    source = ASTSource(fn=kernel, signature=signature,
                       constexprs={(names.index(name),): value for name, value in constexprs.items()})
    return len(triton.compile(source, target=HOPPER).asm["cubin"])


def main() -> int:
    failed = 0
    for kernel, signature, constexprs in VARIANTS:
        try:
            print(f"ok {label(kernel, constexprs)}: {compile_variant(kernel, signature, constexprs)} bytes of cubin")
        except Exception as error:  # noqa: BLE001 - reported per variant
            failed += 1
            print(f"FAILED {label(kernel, constexprs)}: {type(error).__name__}: {error}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
