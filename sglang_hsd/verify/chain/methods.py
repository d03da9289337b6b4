"""The chain-method registry: one typed entry per verification rule ``verify_chain`` accepts.

``verify_chain``, its Triton dispatch, ``expected_accepted_per_length``, the ``sglang-hsd check``
report and every configuration that names a chain method look methods up here, so a method is
added or described in one place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from sglang_hsd.verify.chain.reference import (
    hsd_expected_accepted,
    hsd_paper_expected_accepted,
    tokenwise_expected_accepted,
    verify_greedy,
    verify_hsd,
    verify_hsd_paper,
    verify_tokenwise,
)
from sglang_hsd.verify.chain.types import ChainVerifyResult
from sglang_hsd.verify.common import ChainUniforms

# (draft_tokens [B, K], draft_probs [B, K, V] or None, target_probs [B, K + 1, V], uniforms,
#  draft_lengths [B] or None) -> ChainVerifyResult; inputs already validated.
ChainRule = Callable[
    [torch.Tensor, Optional[torch.Tensor], torch.Tensor, ChainUniforms, Optional[torch.Tensor]],
    ChainVerifyResult,
]
# (p_draft [N, K], q_draft [N, K], draft_probs [N, K, V], target_probs [N, K + 1, V]), float64
# -> E[accepted] [N] for fixed drafts.
ExpectedAccepted = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class ChainMethod:
    """One chain verification rule.

    Fields:
        name: the key in ``CHAIN_METHODS`` (what ``verify_chain(method=...)`` takes).
        description: one line for listings and reports.
        lossless: the output distribution equals the target's (exact enumeration in
            ``tests/verify/chain/test_methods.py`` and ``sglang-hsd check`` hold every entry to it).
        reads_q: the rule reads ``draft_probs``; ``False`` lets callers pass ``None``.
        reference: the plain-torch implementation (CPU path and kernel oracle).
        triton_kernel: name of the wrapper in ``chain/triton.py`` that implements the rule on a
            GPU, or ``None`` when only the reference exists.
        expected_accepted: exact E[accepted] for fixed drafts (benchmarks), or ``None``.
        deterministic: the rule ignores the uniforms (nothing random to test statistically).
        warning: emitted (once per call site) when the method is used, or ``None``.
    """

    name: str
    description: str
    lossless: bool
    reads_q: bool
    reference: ChainRule
    triton_kernel: str | None = None
    expected_accepted: ExpectedAccepted | None = None
    deterministic: bool = False
    warning: str | None = None


CHAIN_METHODS: dict[str, ChainMethod] = {
    method.name: method
    for method in (
        ChainMethod(
            name="hsd",
            description="capped hierarchical branch resampling (block verification), lossless",
            lossless=True,
            reads_q=True,
            reference=verify_hsd,
            triton_kernel="verify_hsd_triton",
            expected_accepted=hsd_expected_accepted,
        ),
        ChainMethod(
            name="tokenwise",
            description="token-by-token speculative sampling (Leviathan / Chen), lossless",
            lossless=True,
            reads_q=True,
            reference=verify_tokenwise,
            triton_kernel="verify_tokenwise_triton",
            expected_accepted=tokenwise_expected_accepted,
        ),
        ChainMethod(
            name="hsd-paper",
            description="the published code's uncapped final coin; lossy, for comparison only",
            lossless=False,
            reads_q=True,
            reference=verify_hsd_paper,
            expected_accepted=hsd_paper_expected_accepted,
            warning=(
                "method 'hsd-paper' reproduces the published code's uncapped final acceptance and "
                "does NOT preserve the target distribution; use it only for comparison"
            ),
        ),
        ChainMethod(
            name="greedy",
            description="accept while the draft equals the target argmax",
            lossless=False,
            reads_q=False,
            reference=verify_greedy,
            deterministic=True,
        ),
    )
}

# Methods whose output distribution equals the target's, in registry order (a tuple, so it serves
# as argparse choices and in ``in`` checks).
LOSSLESS_CHAIN_METHODS: tuple[str, ...] = tuple(name for name, method in CHAIN_METHODS.items() if method.lossless)
