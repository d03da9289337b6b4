"""The result type every chain implementation (torch reference, Triton kernel) returns."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ChainVerifyResult:
    """Outcome of verifying one chain draft per request.

    Fields:
        num_accepted: int64 [B], accepted draft tokens, in [0, K].
        tokens: int64 [B, K + 1]: the accepted draft tokens, then one corrected token (sampled from
            a residual after a rejection) or bonus token (from p_{K+1} when all K are accepted),
            then ``PLACEHOLDER_TOKEN_ID`` padding. Row b emits ``num_accepted[b] + 1`` tokens.
    """

    num_accepted: torch.Tensor
    tokens: torch.Tensor
