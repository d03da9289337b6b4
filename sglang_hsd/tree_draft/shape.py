"""The shape of a draft tree, as SGLang's flags give it: depth D, k children per node, N nodes.

SGLang's flags: ``--speculative-num-steps`` = D, ``--speculative-eagle-topk`` = k,
``--speculative-num-draft-tokens`` = N counts the root, so a tree holds N - 1 drafted nodes of
depth <= D, chosen from SGLang's pool of k + (D - 1) k^2 candidates (k children of the root, then
k children of each of the k beams of the D - 1 draft forwards). The runtime, the planner and the
benchmarks spell the same shape ``"D:k:N"`` (``TreeShape.parse``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TreeShape:
    """Fields: depth D >= 1, topk k >= 1, num_draft_tokens N >= 2 (root included)."""

    depth: int
    topk: int
    num_draft_tokens: int

    def __post_init__(self):
        for name, low in (("depth", 1), ("topk", 1), ("num_draft_tokens", 2)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")

    @property
    def budget(self) -> int:
        """Drafted nodes kept (N - 1)."""
        return self.num_draft_tokens - 1

    @property
    def pool(self) -> int:
        """SGLang's candidate count before pruning: k + (D - 1) k^2."""
        return self.topk + (self.depth - 1) * self.topk**2

    @property
    def num_forwards(self) -> int:
        """Nodes whose children are drawn: the root and the k beams of each of the D - 1 forwards."""
        return 1 + self.topk * (self.depth - 1)

    @classmethod
    def parse(cls, text: str, name: str = "--tree") -> "TreeShape | None":
        """``"none"`` (chains) or ``"D:k:N"``; raises ``ValueError`` naming ``name`` otherwise."""
        if text.strip() == "none":
            return None
        try:
            depth, topk, nodes = (int(x) for x in text.strip().split(":"))
        except ValueError:
            raise ValueError(f"{name} must be none or D:k:N (three integers, e.g. 4:2:8), got {text!r}") from None
        try:
            return cls(depth, topk, nodes)
        except ValueError as err:
            raise ValueError(f"{name} {text!r}: {err}") from None

    def __str__(self) -> str:
        return f"{self.depth}:{self.topk}:{self.num_draft_tokens}"
