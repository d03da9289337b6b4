"""Counters of the SGLang plugin's exit level (``exit_level.py``), reported in ``/server_info``.

Bookkeeping only: the round they count is ``sglang_hsd.verify.window_round``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from sglang_hsd.verify import ChainVerifyResult
from sglang_hsd.verify.window_round import ExitProposal


@dataclass
class ExitLevelStats:
    """Counters of one scheduler process (sums over requests and rounds).

    Fields:
        rounds: request-rounds verified.
        exit_subrounds: exit sub-rounds run (= rounds with exit buffer 1).
        exit_proposed / exit_accepted: drafts shown to / accepted by the exit level.
        target_proposed / target_accepted: chain tokens shown to / accepted by the target.
        emitted: tokens emitted (accepted drafts + the last token of each round).
        layer_forwards / layer_forwards_stock: target layer-token forwards run, and what the
            stock single-level verify would have run (every verify position through all layers).
        seconds: wall time by phase ("lower_forward": layers [0, L) + exit head,
            "exit_verify", "upper_forward": layers [L, N) + LM head).
    """

    rounds: int = 0
    exit_subrounds: int = 0
    exit_proposed: int = 0
    exit_accepted: int = 0
    target_proposed: int = 0
    target_accepted: int = 0
    emitted: int = 0
    layer_forwards: int = 0
    layer_forwards_stock: int = 0
    seconds: dict = field(default_factory=dict)

    def add_round(self, num_draft: int, exit_layer: int, num_layers: int,
                  proposal: ExitProposal, result: ChainVerifyResult,
                  target_accepted: torch.Tensor) -> None:
        batch = int(proposal.chain_len.shape[0])
        chain = int(proposal.chain_len.sum())
        self.rounds += batch
        self.exit_subrounds += int((proposal.sub_accepted >= 0).sum())
        self.exit_proposed += int(proposal.drafted.sum())
        self.exit_accepted += int(proposal.exit_accepted.sum())
        self.target_proposed += chain
        self.target_accepted += int(target_accepted.sum())
        self.emitted += int(result.num_accepted.sum()) + batch
        # The target's last layers run on the root and the first chain_len - 1 chain tokens.
        self.layer_forwards += (int(proposal.lower_positions.sum()) * exit_layer
                                + chain * (num_layers - exit_layer))
        self.layer_forwards_stock += batch * (num_draft + 1) * num_layers

    def as_dict(self) -> dict:
        """The raw counters plus rates (accept rates, accept length at the exit, tokens per
        round, fraction of the stock verify's target layer-forwards saved)."""
        rounds = max(self.rounds, 1)
        return {
            **asdict(self),
            "exit_accept_rate": self.exit_accepted / max(self.exit_proposed, 1),
            "exit_accept_length": (self.exit_accepted + self.exit_subrounds)
            / max(self.exit_subrounds, 1),
            "exit_subrounds_per_round": self.exit_subrounds / rounds,
            "target_tokens_per_round": self.target_proposed / rounds,
            "target_accept_rate": self.target_accepted / max(self.target_proposed, 1),
            "tokens_per_round": self.emitted / rounds,
            "layer_forwards_saved": 1.0 - self.layer_forwards / max(self.layer_forwards_stock, 1),
        }
