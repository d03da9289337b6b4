"""Per-level statistics and the result of one generation."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class LevelStats:
    """What one level did during a generation.

    Fields:
        name: ``exit:8``, ``target``, ...
        rounds: verification calls, counted per request (the drafter: drafting steps per request).
        proposed: draft tokens this level verified (the drafter: tokens it drafted).
        accepted: of those, how many it accepted.
        seconds: wall time spent in this level's forwards and verification.
        drafts: the drafter only: draft rounds, counted per request (``mean_draft_length`` =
            ``proposed / drafts``); 0 for other levels.
    """

    name: str
    rounds: int = 0
    proposed: int = 0
    accepted: int = 0
    seconds: float = 0.0
    drafts: int = 0

    @property
    def mean_draft_length(self) -> float:
        """Tokens drafted per draft round (the drafter; nan for other levels)."""
        return self.proposed / self.drafts if self.drafts else float("nan")

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else float("nan")

    @property
    def mean_accepted(self) -> float:
        """Accepted draft tokens per verification round."""
        return self.accepted / self.rounds if self.rounds else float("nan")

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "rounds": self.rounds,
            "proposed": self.proposed,
            "accepted": self.accepted,
            "acceptance_rate": self.acceptance_rate,
            "mean_accepted": self.mean_accepted,
            "seconds": self.seconds,
            **({"drafts": self.drafts, "mean_draft_length": self.mean_draft_length} if self.drafts else {}),
        }


@dataclass
class GenerationResult:
    """Fields:
    tokens: generated token ids per request (prompt excluded, EOS included when hit).
    levels: ``LevelStats`` per level, drafter first, target last.
    seconds: wall time of the whole generation.
    target_layer_forwards: target decoder-layer applications, summed over tokens (prefill
        included); with KV reuse each position runs through each layer once.
    drafter_layer_forwards: the same for a separate drafter model (0 for early-exit drafters,
        whose layers are the target's and are counted above).
    round_trace: with ``generate(..., trace_rounds=True)``, per request, one dict per target
        round: ``exit_accepted`` (list, drafts the exit level accepted in each of its verifications
        this round), ``target_accepted`` (the exit's buffered tokens the target accepted) and
        ``emitted`` (tokens committed this round, before EOS / max-length cutting). Else empty.
    """

    tokens: list[list[int]]
    levels: list[LevelStats] = field(default_factory=list)
    seconds: float = 0.0
    target_layer_forwards: int = 0
    drafter_layer_forwards: int = 0
    round_trace: list[list[dict]] = field(default_factory=list)

    @property
    def num_generated(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def tokens_per_second(self) -> float:
        return self.num_generated / self.seconds if self.seconds else float("nan")

    @property
    def layer_forwards_per_token(self) -> float:
        """Target layer-forwards per generated token (prefill included)."""
        return self.target_layer_forwards / max(self.num_generated, 1)

    def summary(self) -> str:
        lines = [
            f"{self.num_generated} tokens in {self.seconds:.2f}s = {self.tokens_per_second:.2f} tok/s; "
            f"target layer-forwards per token {self.layer_forwards_per_token:.1f}"
        ]
        for level in self.levels:
            lines.append(
                f"  {level.name:>12}: rounds {level.rounds:5d}  proposed {level.proposed:5d}  "
                f"accepted {level.accepted:5d}  rate {level.acceptance_rate:.3f}  "
                f"accepted/round {level.mean_accepted:.2f}  time {level.seconds:.2f}s"
                + (f"  draft length {level.mean_draft_length:.2f}" if level.drafts else "")
            )
        return "\n".join(lines)

    def as_dict(self) -> dict:
        return {
            "tokens": self.tokens,
            "levels": [level.as_dict() for level in self.levels],
            "seconds": self.seconds,
            "tokens_per_second": self.tokens_per_second,
            "target_layer_forwards": self.target_layer_forwards,
            "drafter_layer_forwards": self.drafter_layer_forwards,
            "layer_forwards_per_token": self.layer_forwards_per_token,
            **({"round_trace": self.round_trace} if self.round_trace else {}),
        }


class RoundTrace:
    """What every target round of every request accepted (``generate(trace_rounds=True)``).

    ``rounds[b]`` is request b's list of round entries (``GenerationResult.round_trace``). An exit
    level's verifications are held open until the target's round that ends them; with no exit level
    (drafter -> target) every entry's ``exit_accepted`` is empty.
    """

    def __init__(self, batch: int) -> None:
        self.rounds: list[list[dict]] = [[] for _ in range(batch)]
        self._open: list[list[int]] = [[] for _ in range(batch)]

    def record(self, is_target: bool, idx: torch.Tensor, accepted: torch.Tensor, emitted: torch.Tensor) -> None:
        """Record one verification of rows ``idx`` (int64 [R]) with ``accepted`` [R] drafts kept; a
        target verification also closes the rows' open rounds, ``emitted`` [R] = tokens kept after
        the buffer's start (before EOS / max-length cutting)."""
        if not is_target:
            for row, count in zip(idx.tolist(), accepted.tolist()):
                self._open[row].append(count)
            return
        for row, count, kept in zip(idx.tolist(), accepted.tolist(), emitted.tolist()):
            self.rounds[row].append({"exit_accepted": self._open[row], "target_accepted": count, "emitted": kept})
            self._open[row] = []
