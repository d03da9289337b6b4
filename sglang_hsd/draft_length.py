"""How many tokens the drafter proposes per round: a fixed N_d or an adaptive stopping rule.

``fixed``: every round drafts the drafter level's buffer N_d (``LevelSpec.buffer``).

``adaptive`` (the rule of Hugging Face assisted generation, made lossless): per request, the
drafter stops after drafting token x_t when its *confidence* in that token, c_t(x_t) =
softmax(logits_t)[x_t] (its raw distribution: temperature 1, no top-k / top-p; ``confidence``), is
below ``threshold`` and at least ``min_length`` tokens were drafted, or when the request's length
cap is reached. The cap adapts from past rounds only: after a round whose drafts were all accepted it
grows by ``grow``, else it becomes ``accepted + 1``; always clamped to
[``min_length``, ``max_length``], starting at ``max_length``.

Why it is lossless (``docs/hierarchy.md``): whether position t + 1 is drafted depends only on
the tokens drafted so far (x_1..x_t, which are all kept) and on the past rounds, so the draft length
is a stopping time and every chain rule stays exact. Deciding on x_t and then dropping it (stopping
*before* a low-probability token) is not: the kept x_t would then be drawn from q conditioned on
being likely, not from q. ``verify/oracles/adaptive_exact.py`` checks both exactly.

The confidence is not the q the verifier sees (q_t is the sampling transform of the same logits;
at temperature 0 it is one-hot, so q_t(x_t) = 1 would never stop a greedy draft). Any function of
the drafted prefix will do for a stopping time, so losslessness does not depend on which one; the
raw confidence makes greedy and sampled requests stop alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import torch


class DraftLengthKind(StrEnum):
    """``FIXED``: N_d tokens every round; ``ADAPTIVE``: the stopping rule of the module docstring."""

    FIXED = "fixed"
    ADAPTIVE = "adaptive"


@dataclass(frozen=True)
class DraftLengthRule:
    """The drafter's draft-length rule.

    Fields:
        kind: a ``DraftLengthKind`` (its string value is accepted and converted).
        threshold: adaptive: stop after a drafted token whose confidence (``confidence``: the
            drafter's untransformed softmax, not the sampled q) is below this, in [0, 1] (0 never
            stops early; HF's default is 0.4).
        min_length: adaptive: the threshold never stops a draft shorter than this (>= 1).
        max_length: adaptive: longest draft and the first round's cap (>= min_length, <= 64).
        grow: adaptive: cap increase after a round whose drafts were all accepted (>= 0).
    """

    kind: DraftLengthKind = DraftLengthKind.FIXED
    threshold: float = 0.4
    min_length: int = 1
    max_length: int = 16
    grow: int = 2

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "kind", DraftLengthKind(self.kind))
        except ValueError:
            raise ValueError(
                f"kind must be one of {[k.value for k in DraftLengthKind]}, got {self.kind!r}"
            ) from None
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"threshold must be in [0, 1], got {self.threshold}")
        if self.min_length < 1:
            raise ValueError(f"min_length must be >= 1, got {self.min_length}")
        if not self.min_length <= self.max_length <= 64:
            raise ValueError(f"max_length must be in [min_length={self.min_length}, 64], got {self.max_length}")
        if self.grow < 0:
            raise ValueError(f"grow must be >= 0, got {self.grow}")

    @property
    def adaptive(self) -> bool:
        return self.kind is DraftLengthKind.ADAPTIVE

    def longest(self, fixed_length: int) -> int:
        """The longest draft of one round (buffer capacity): N_d = ``fixed_length`` or ``max_length``."""
        return self.max_length if self.adaptive else fixed_length

    def initial_caps(self, batch: int, fixed_length: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """Every request's length cap for its first round. int64 [batch]."""
        return torch.full((batch,), self.longest(fixed_length), dtype=torch.long, device=device)

    @staticmethod
    def confidence(logits: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
        """The drafter's confidence in the token it drew: softmax(logits)[token] at temperature 1.

        Args:
            logits: float [R, V], the drafter's logits before any sampling transform.
            token: int64 [R], the drawn token.

        Returns: float32 [R]. One logsumexp per row (no [R, V] softmax is kept).
        """
        logits = logits.float()
        return (logits.gather(1, token.unsqueeze(-1)).squeeze(-1) - logits.logsumexp(-1)).exp()

    def stops(self, confidence: torch.Tensor, drafted: torch.Tensor) -> torch.Tensor:
        """Whether a row stops drafting after a token (besides reaching its cap).

        Args:
            confidence: float [R], the drafter's confidence in the token it just drew (``confidence``).
            drafted: int64 [R], tokens drafted this round, that one included.

        Returns: bool [R] (all False for ``fixed``).
        """
        if not self.adaptive:
            return torch.zeros_like(drafted, dtype=torch.bool)
        return (confidence < self.threshold) & (drafted >= self.min_length)

    def next_caps(self, caps: torch.Tensor, drafted: torch.Tensor, accepted: torch.Tensor) -> torch.Tensor:
        """Caps for the next round from this round's outcome (past rounds only).

        Args:
            caps: int64 [R], this round's caps; drafted: int64 [R], tokens drafted (<= caps);
            accepted: int64 [R], of those, how many the level above accepted.

        Returns: int64 [R] (``caps`` unchanged for ``fixed``).
        """
        if not self.adaptive:
            return caps
        grown = torch.where(accepted >= drafted, caps + self.grow, accepted + 1)
        return grown.clamp(self.min_length, self.max_length)


def parse_draft_length(text: str, name: str = "--draft-length") -> DraftLengthRule:
    """``"fixed"``, ``"adaptive"``, ``"adaptive:<threshold>"`` or ``"adaptive:<threshold>:<max_length>"``.

    Raises ``ValueError`` naming ``name`` for anything else (and the field for a bad value).
    """
    kind, *args = text.strip().split(":")
    if kind == DraftLengthKind.FIXED and not args:
        return DraftLengthRule()
    if kind != DraftLengthKind.ADAPTIVE or len(args) > 2:
        raise ValueError(f"{name} must be fixed or adaptive[:threshold[:max_length]], got {text!r}")
    try:
        threshold = float(args[0]) if args else DraftLengthRule.threshold
        max_length = int(args[1]) if len(args) > 1 else DraftLengthRule.max_length
    except ValueError:
        raise ValueError(f"{name}: threshold must be a number and max_length an integer, got {text!r}") from None
    return DraftLengthRule(DraftLengthKind.ADAPTIVE, threshold=threshold, max_length=max_length)


def format_draft_length(rule: DraftLengthRule) -> str:
    """The ``--draft-length`` spelling of ``rule``: ``"fixed"`` or ``"adaptive:<threshold>:<max_length>"``,
    so that ``parse_draft_length(format_draft_length(rule)) == rule``.

    Raises ``ValueError`` for a rule the grammar cannot spell (``min_length`` or ``grow`` off their
    defaults, or a fixed rule carrying adaptive settings): writing it would silently change it.
    """
    text = f"adaptive:{rule.threshold}:{rule.max_length}" if rule.adaptive else DraftLengthKind.FIXED.value
    if parse_draft_length(text) != rule:
        raise ValueError(f"{rule} has no --draft-length spelling (only kind, threshold and max_length have one)")
    return text
