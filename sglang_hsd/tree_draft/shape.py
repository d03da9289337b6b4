"""The shape of a draft tree, as SGLang's flags give it: depth D, k children per node, N nodes.

SGLang's flags: ``--speculative-num-steps`` = D, ``--speculative-eagle-topk`` = k,
``--speculative-num-draft-tokens`` = N counts the root, so a tree holds N - 1 drafted nodes of
depth <= D, chosen from SGLang's pool of k + (D - 1) k^2 candidates (k children of the root, then
k children of each of the k beams of the D - 1 draft forwards). The runtime, the planner and the
benchmarks spell the same shape ``"D:k:N"`` (``TreeShape.parse``).

A tree's *budget* (``TreeShape.at_depth``): the adaptive controller (``--hsd-adaptive``) shrinks a
configured shape round by round to depth d <= D with about d / D of its drafted nodes, so each
depth keeps about the same number of nodes and the per-depth acceptance the controller estimates
stays comparable across budgets.
"""

from __future__ import annotations

import math
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
    def longest_path(self) -> int:
        """The most drafted tokens one round can accept: min(D, N - 1)."""
        return min(self.depth, self.budget)

    @property
    def pool(self) -> int:
        """SGLang's candidate count before pruning: k + (D - 1) k^2."""
        return self.topk + (self.depth - 1) * self.topk**2

    @property
    def num_forwards(self) -> int:
        """Nodes whose children are drawn: the root and the k beams of each of the D - 1 forwards."""
        return 1 + self.topk * (self.depth - 1)

    def at_depth(self, depth: int) -> "TreeShape":
        """The budget of depth ``depth`` within this shape (1 <= depth <= D): the same k,
        ``ceil((N - 1) depth / D)`` drafted nodes (at least enough for a chain of ``depth``
        when N - 1 allows it, at most the pool of that depth). ``at_depth(D)`` is this shape
        whenever N - 1 fits its pool (SGLang's own requirement)."""
        if not isinstance(depth, int) or isinstance(depth, bool) or not 1 <= depth <= self.depth:
            raise ValueError(f"depth must be an int in 1..{self.depth}, got {depth!r}")
        budget = self.budget
        nodes = max(min(depth, budget), math.ceil(budget * depth / self.depth))
        pool = self.topk + (depth - 1) * self.topk**2
        return TreeShape(depth, self.topk, 1 + min(nodes, pool))

    def budgets(self) -> dict[int, "TreeShape"]:
        """{depth: ``at_depth(depth)``} for every depth 1..D."""
        return {depth: self.at_depth(depth) for depth in range(1, self.depth + 1)}

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
