"""Typed configuration of the runtime's speculative hierarchy: its levels (``LevelSpec``, parsed by
``sglang_hsd.levels``), KV reuse and windowed rounds, and the checks that span levels."""

from __future__ import annotations

from dataclasses import dataclass, field

from sglang_hsd.draft_length import DraftLengthRule
from sglang_hsd.levels import LevelKind, LevelSpec, parse_level_specs
from sglang_hsd.tree_draft import TreeShape
from sglang_hsd.tree_draft import CHILD_SAMPLERS, DEFAULT_CHILD_SAMPLER, DEFAULT_LEVEL_RULE, LEVEL_RULES, LOSSLESS_LEVEL_RULES

# The tree rule each chain method becomes when the drafter draws a tree (the target level's method).
TREE_METHOD_OF = {"hsd": "hsd", "tokenwise": "rrs", "greedy": "greedy"}
# Drafters that can draft a tree: their forwards take a tree attention mask.
TREE_DRAFTERS = (LevelKind.MODEL, LevelKind.EXIT, LevelKind.EAGLE3)


@dataclass(frozen=True)
class HierarchyConfig:
    """A drafter, any number of intermediate levels (exits of the target, or a separate model
    verifying a ``lookup`` drafter), and the target.

    Fields:
        levels: cheapest first, the target last. A single ``target`` level is plain
            autoregressive decoding.
        reuse_kv: early-exit levels share the target's KV cache and hidden states (each layer
            runs once per position). ``False`` gives every level its own cache, recomputing the
            shared layers: the baseline the reuse is measured against.
        window: every round works inside one verify window of N_d + 1 positions and the target
            keeps no bonus token on full acceptance, as the SGLang plugin's exit level does (an
            EAGLE-3 drafter then also reads target features only up to the token before the last
            committed one, as SGLang's does)
            (``runtime/window.py`` runs the rule of ``verify/window_round.py``); used to compare
            the runtime with the server round by round. Needs exactly three levels (drafter, one ``exit`` level, target) and the exit
            level's buffer N_i <= N_d + 1 (the window holds at most N_d + 1 provisional tokens).
        draft_length: how many tokens the drafter proposes per round (``DraftLengthRule``):
            ``fixed`` drafts the drafter level's buffer N_d; ``adaptive`` stops per request on a
            low-probability drafted token or at a cap adapted from past rounds (at most
            ``max_length``; the drafter's buffer is then unused). Windowed rounds need ``fixed``.
        tree: draft a sampled tree per round instead of a chain (``runtime/tree_rounds.py``):
            depth D, k children per node, N nodes with the root (``TreeShape``); None: chains.
            Needs two levels (a ``model`` or ``exit`` drafter, the target), a fixed draft length,
            no window, and a target method in ``TREE_METHOD_OF``; the drafter's buffer is unused.
        tree_rule: which drafted nodes are forwarded and kept (a lossless key of
            ``tree_draft.LEVEL_RULES``, the server's ``--hsd-tree-rule``).
        tree_children: how a node's children are drawn (a lossless key of
            ``tree_draft.CHILD_SAMPLERS``: ``inverse_cdf``, or ``argmax_first_cdf`` as the server's
            ``--hsd-tree-draft argmax-first``; their Gumbel twins ``gumbel_topk`` / ``argmax_first``
            have the same laws); the verifier is told the sampler's draft mode.
    """

    levels: tuple[LevelSpec, ...] = field(default_factory=lambda: (LevelSpec(LevelKind.TARGET),))
    reuse_kv: bool = True
    window: bool = False
    draft_length: DraftLengthRule = field(default_factory=DraftLengthRule)
    tree: TreeShape | None = None
    tree_rule: str = DEFAULT_LEVEL_RULE
    tree_children: str = DEFAULT_CHILD_SAMPLER

    def __post_init__(self) -> None:
        if not isinstance(self.draft_length, DraftLengthRule):
            raise ValueError(f"draft_length must be a DraftLengthRule, got {self.draft_length!r}")
        if self.window and self.draft_length.adaptive:
            raise ValueError("window=True needs draft_length 'fixed': a window holds exactly N_d + 1 "
                             "positions, so an adaptive draft length cannot be used with windowed rounds")
        if not self.levels or self.levels[-1].kind is not LevelKind.TARGET:
            raise ValueError("the last level must be the target")
        if any(level.kind is LevelKind.TARGET for level in self.levels[:-1]):
            raise ValueError("only the last level may be the target")
        if any(level.kind.drafter_only for level in self.levels[1:]):
            raise ValueError("an 'eagle3' or 'lookup' level can only be the drafter (first level)")
        for index, level in enumerate(self.levels[1:], start=1):
            if level.kind is LevelKind.MODEL and not (index == 1 and self.levels[0].kind is LevelKind.LOOKUP):
                raise ValueError("a separate 'model' level is the drafter (first level) or verifies a 'lookup' "
                                 f"drafter right below it, got {','.join(lv.name for lv in self.levels)}")
        if self.levels[0].kind is LevelKind.LOOKUP and len(self.levels) > 1 and self.draft_length.adaptive:
            raise ValueError("a 'lookup' drafter needs draft_length 'fixed' (its buffer is the most tokens it "
                             "copies; the adaptive rule reads a drafter's confidence, which a lookup has not)")
        exits = [level.layer for level in self.levels if level.kind is LevelKind.EXIT]
        if exits != sorted(set(exits)):
            raise ValueError(
                f"exit layers must strictly increase from drafter to target (L_d < L_i), got {exits}"
            )
        if self.window:
            if len(self.levels) != 3 or self.levels[1].kind is not LevelKind.EXIT:
                names = ",".join(level.name for level in self.levels)
                raise ValueError(
                    f"window=True needs exactly three levels (drafter, one 'exit' level, target), got {names}"
                )
            drafter, middle = self.levels[0], self.levels[1]
            if middle.buffer > drafter.buffer + 1:
                raise ValueError(
                    f"window=True needs the exit level's buffer N_i <= drafter buffer N_d + 1 (one window "
                    f"holds N_d + 1 tokens), got N_i = {middle.buffer}, N_d = {drafter.buffer}"
                )

        if self.tree is not None:
            self._check_tree()

    def _check_tree(self) -> None:
        names = ",".join(level.name for level in self.levels)
        if not isinstance(self.tree, TreeShape):
            raise ValueError(f"tree must be a TreeShape(depth, topk, num_draft_tokens), got {self.tree!r}")
        if len(self.levels) != 2 or self.levels[0].kind not in TREE_DRAFTERS:
            raise ValueError(f"tree needs two levels, a 'model', 'exit' or 'eagle3' drafter and the target, got {names}")
        if self.window or self.draft_length.adaptive:
            raise ValueError("tree needs window=False and draft_length 'fixed' (the tree's depth is the draft length)")
        method = self.levels[1].method
        if method not in TREE_METHOD_OF:
            raise ValueError(f"tree: the target's method must be one of {sorted(TREE_METHOD_OF)}, got {method!r}")
        if self.tree_rule not in LOSSLESS_LEVEL_RULES:
            raise ValueError(f"tree_rule must be one of {list(LOSSLESS_LEVEL_RULES)}, got {self.tree_rule!r}")
        if self.tree_children not in CHILD_SAMPLERS or not CHILD_SAMPLERS[self.tree_children].lossless:
            lossless = [name for name, sampler in CHILD_SAMPLERS.items() if sampler.lossless]
            raise ValueError(f"tree_children must be one of {lossless}, got {self.tree_children!r}")
        cfg, capacity = self.tree, LEVEL_RULES[self.tree_rule].capacity(self.tree)
        if cfg.budget > min(cfg.pool, capacity):
            raise ValueError(
                f"tree: num_draft_tokens - 1 = {cfg.budget} nodes do not fit depth {cfg.depth} with topk "
                f"{cfg.topk} under rule {self.tree_rule!r} (at most {min(cfg.pool, capacity)})")

    @property
    def tree_method(self) -> str | None:
        """The target's tree rule (``TREE_METHOD_OF`` its chain method), None without a tree."""
        return TREE_METHOD_OF[self.levels[-1].method] if self.tree is not None else None

    def check_depth(self, num_layers: int) -> None:
        """Raise unless every exit layer lies strictly inside the target's ``num_layers``."""
        for level in self.levels:
            if level.kind is LevelKind.EXIT and not 1 <= level.layer < num_layers:
                raise ValueError(
                    f"exit layer {level.layer} out of range: the target has {num_layers} layers, "
                    f"so an exit must be in [1, {num_layers - 1}]"
                )


def parse_levels(
    spec: str,
    buffers: list[int] | None = None,
    methods: list[str] | None = None,
    window: bool = False,
    draft_length: DraftLengthRule | None = None,
    tree: TreeShape | None = None,
    tree_rule: str = DEFAULT_LEVEL_RULE,
    tree_children: str = DEFAULT_CHILD_SAMPLER,
) -> HierarchyConfig:
    """A ``HierarchyConfig`` for ``"exit:4,exit:12,target"`` (or ``"model:/path,target"``,
    ``"eagle3:/dir,exit:16,target"``, or ``"target"``); the grammar is ``parse_level_specs``'s.

    Args:
        buffers: one per non-target level (N_d for the drafter, N_i for intermediates).
        methods: one per verifying level (every level but the drafter), or a single method for all.
        window: ``HierarchyConfig.window``.
        draft_length: ``HierarchyConfig.draft_length`` (default ``fixed``).
        tree, tree_rule, tree_children: ``HierarchyConfig.tree`` / ``tree_rule`` / ``tree_children``.
    """
    return HierarchyConfig(parse_level_specs(spec, buffers, methods), window=window,
                           draft_length=draft_length or DraftLengthRule(), tree=tree, tree_rule=tree_rule,
                           tree_children=tree_children)
