"""Typed configuration of a speculative hierarchy: which levels, their buffers and verify rules."""

from __future__ import annotations

from dataclasses import dataclass, field

from sglang_hsd.verify import CHAIN_METHODS


@dataclass(frozen=True)
class LevelSpec:
    """One level of the hierarchy, from the cheapest (index 0, the drafter) to the target (last).

    Fields:
        kind: ``"exit"`` (the target's first ``layer`` layers plus an exit head), ``"model"``
            (a separate small model with the target's tokenizer; drafter only), ``"eagle3"`` (an
            EAGLE-3 head over the target's hidden states; drafter only) or ``"target"``.
        layer: exit layer L for ``"exit"`` (1 <= L < number of target layers).
        buffer: tokens this level hands up per proposal: for the drafter, the draft length N_d;
            for an intermediate level, how many provisional tokens it accumulates (N_i) before
            the level above verifies them. Unused for the target.
        method: chain rule this level uses to verify the level below (unused for the drafter).
        model_path: for ``"model"``: a folder loadable by ``CausalLM.from_pretrained``; for
            ``"eagle3"``: an exported head folder (``Eagle3Head.from_pretrained``).
    """

    kind: str
    layer: int | None = None
    buffer: int = 4
    method: str = "hsd"
    model_path: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("exit", "model", "eagle3", "target"):
            raise ValueError(f"level kind must be 'exit', 'model', 'eagle3' or 'target', got {self.kind!r}")
        if self.kind == "exit" and (self.layer is None or self.layer < 1):
            raise ValueError(f"an 'exit' level needs a layer index >= 1, got {self.layer}")
        if self.kind in ("model", "eagle3") and not self.model_path:
            raise ValueError(f"a {self.kind!r} level needs model_path")
        if self.buffer < 1:
            raise ValueError(f"buffer must be >= 1, got {self.buffer}")
        if self.method not in CHAIN_METHODS:
            raise ValueError(f"method must be one of {sorted(CHAIN_METHODS)}, got {self.method!r}")

    @property
    def name(self) -> str:
        if self.kind == "exit":
            return f"exit:{self.layer}"
        if self.kind in ("model", "eagle3"):
            return f"{self.kind}:{self.model_path}"
        return "target"


@dataclass(frozen=True)
class HierarchyConfig:
    """A drafter, any number of intermediate exit levels, and the target.

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
    """

    levels: tuple[LevelSpec, ...] = field(default_factory=lambda: (LevelSpec("target"),))
    reuse_kv: bool = True
    window: bool = False

    def __post_init__(self) -> None:
        if not self.levels or self.levels[-1].kind != "target":
            raise ValueError("the last level must be the target")
        if any(level.kind == "target" for level in self.levels[:-1]):
            raise ValueError("only the last level may be the target")
        if any(level.kind in ("model", "eagle3") for level in self.levels[1:]):
            raise ValueError("a separate 'model' or 'eagle3' level can only be the drafter (first level)")
        exits = [level.layer for level in self.levels if level.kind == "exit"]
        if exits != sorted(set(exits)):
            raise ValueError(
                f"exit layers must strictly increase from drafter to target (L_d < L_i), got {exits}"
            )
        if self.window:
            if len(self.levels) != 3:  # the middle one is then an exit (checked above)
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

    def check_depth(self, num_layers: int) -> None:
        """Raise unless every exit layer lies strictly inside the target's ``num_layers``."""
        for level in self.levels:
            if level.kind == "exit" and not 1 <= level.layer < num_layers:
                raise ValueError(
                    f"exit layer {level.layer} out of range: the target has {num_layers} layers, "
                    f"so an exit must be in [1, {num_layers - 1}]"
                )


def parse_levels(
    spec: str, buffers: list[int] | None = None, methods: list[str] | None = None, window: bool = False
) -> HierarchyConfig:
    """Parse ``"exit:4,exit:12,target"`` (or ``"model:/path,target"``, ``"eagle3:/dir,exit:16,target"``,
    or ``"target"``).

    Args:
        buffers: one per non-target level (N_d for the drafter, N_i for intermediates).
        methods: one per verifying level (every level but the drafter), or a single method for all.
        window: ``HierarchyConfig.window``.
    """
    names = [part.strip() for part in spec.split(",") if part.strip()]
    num_below = len(names) - 1
    buffers = list(buffers) if buffers else [4] * num_below
    if len(buffers) != num_below:
        raise ValueError(f"--buffers needs {num_below} values (one per level below the target), got {buffers}")
    methods = list(methods) if methods else ["hsd"]
    if len(methods) == 1:
        methods = methods * num_below
    if len(methods) != num_below:
        raise ValueError(f"--methods needs 1 or {num_below} values, got {methods}")
    levels = []
    for index, name in enumerate(names):
        kind, _, arg = name.partition(":")
        # The drafter verifies nothing; level i >= 1 verifies with methods[i - 1].
        method = methods[index - 1] if index > 0 else "hsd"
        buffer = buffers[index] if index < num_below else 1
        if kind == "exit":
            if not arg.isdigit():
                raise ValueError(f"level {name!r}: expected exit:<layer index>")
            levels.append(LevelSpec("exit", layer=int(arg), buffer=buffer, method=method))
        elif kind in ("model", "eagle3"):
            levels.append(LevelSpec(kind, buffer=buffer, method=method, model_path=arg))
        elif kind == "target" and not arg:
            levels.append(LevelSpec("target", method=method))
        else:
            raise ValueError(f"unknown level {name!r}: expected exit:<layer>, model:<path>, eagle3:<dir> or target")
    return HierarchyConfig(tuple(levels), window=window)
