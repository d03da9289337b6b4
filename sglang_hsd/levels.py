"""The level grammar of a speculative hierarchy, parsed in one place.

A hierarchy is written cheapest level first, the target last, comma-separated::

    exit:8,exit:16,target              the target's first 8 and 16 layers (plus exit heads), then the target
    model:smollm2-135m,target          a separate drafter model with the target's tokenizer
    eagle3:/path/to/head,exit:16,target    an EAGLE-3 head drafts
    lookup:3,model:qwen2.5-coder-0.5b,target    n-gram lookup drafts, the small model verifies them
    target                             autoregressive decoding

``eagle3`` and ``lookup`` levels can only be the drafter (the first level); a ``model`` level is the
drafter or the level right above a ``lookup`` drafter (``runtime/config.py`` checks what spans
levels). Every level below the target has a buffer (the drafter's draft length N_d, an intermediate
level's N_i) and every level above the drafter a chain verify method, a name in
``sglang_hsd.verify.CHAIN_METHODS``.

``sglang-hsd generate`` (``--levels``, ``--buffers``, ``--methods``), the plan file of
``sglang-hsd plan`` (``runtime/plan_file.py``) and the SGLang plugin's ``--hsd-plan`` all read levels
through ``parse_level_specs``; the runtime's ``HierarchyConfig`` adds the checks that span levels.
docs/hierarchy.md describes levels, buffers and windowed rounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from sglang_hsd.verify import CHAIN_METHODS

# The chain rule a level verifies with unless told otherwise (one of CHAIN_METHODS).
DEFAULT_CHAIN_METHOD = "hsd"
# Buffer of a level built by hand without one; the parser always sets it.
DEFAULT_BUFFER = 4
# Longest n-gram a ``lookup`` level matches unless told (``lookup:<n>``).
DEFAULT_LOOKUP_NGRAM = 3


class LevelKind(StrEnum):
    """What computes a level's distribution.

    ``EXIT``: the target's first L layers plus an exit head; ``MODEL``: a separate small model
    with the target's tokenizer; ``EAGLE3``: an EAGLE-3 head over the target's hidden states;
    ``LOOKUP``: no network: the continuation of the latest earlier occurrence of the last n tokens
    (prompt lookup, ``sglang_hsd/lookup_draft.py``), a deterministic draft whose q is one-hot;
    ``TARGET``: the full target (the last level).
    """

    EXIT = "exit"
    MODEL = "model"
    EAGLE3 = "eagle3"
    LOOKUP = "lookup"
    TARGET = "target"

    @property
    def drafter_only(self) -> bool:
        """A level that can only draft (never verify a level below it)."""
        return self in (LevelKind.EAGLE3, LevelKind.LOOKUP)

    @property
    def needs_path(self) -> bool:
        """A level loaded from a folder or registry name (``LevelSpec.model_path``)."""
        return self in (LevelKind.MODEL, LevelKind.EAGLE3)


@dataclass(frozen=True)
class LevelSpec:
    """One level of the hierarchy, from the cheapest (index 0, the drafter) to the target (last).

    Fields:
        kind: a ``LevelKind`` (its string value is accepted and converted).
        layer: exit layer L for ``EXIT`` (1 <= L < number of target layers).
        buffer: tokens this level hands up per proposal: for the drafter, the draft length N_d;
            for an intermediate level, how many provisional tokens it accumulates (N_i) before
            the level above verifies them. Unused for the target.
        method: chain rule this level uses to verify the level below (unused for the drafter);
            a name in ``sglang_hsd.verify.CHAIN_METHODS``.
        model_path: for ``MODEL``: a folder loadable by ``CausalLM.from_pretrained`` (or a
            registry name, for ``sglang-hsd generate``); for ``EAGLE3``: an exported head folder
            (``Eagle3Head.from_pretrained``).
        ngram: for ``LOOKUP``: the longest n-gram matched (>= 1; shorter ones are tried next).
    """

    kind: LevelKind
    layer: int | None = None
    buffer: int = DEFAULT_BUFFER
    method: str = DEFAULT_CHAIN_METHOD
    model_path: str | None = None
    ngram: int | None = None

    def __post_init__(self) -> None:
        try:
            kind = LevelKind(self.kind)
        except ValueError:
            raise ValueError(
                f"level kind must be one of {[k.value for k in LevelKind]}, got {self.kind!r}"
            ) from None
        object.__setattr__(self, "kind", kind)
        if kind is LevelKind.EXIT and (self.layer is None or self.layer < 1):
            raise ValueError(f"an 'exit' level needs a layer index >= 1, got {self.layer}")
        if kind.needs_path and not self.model_path:
            raise ValueError(f"a '{kind}' level needs model_path")
        if kind is LevelKind.LOOKUP:
            if self.ngram is None:
                object.__setattr__(self, "ngram", DEFAULT_LOOKUP_NGRAM)
            if self.ngram < 1:
                raise ValueError(f"a 'lookup' level needs ngram >= 1, got {self.ngram}")
        if self.buffer < 1:
            raise ValueError(f"buffer must be >= 1, got {self.buffer}")
        if self.method not in CHAIN_METHODS:
            raise ValueError(f"method must be one of {tuple(CHAIN_METHODS)}, got {self.method!r}")

    @property
    def name(self) -> str:
        """The level in the grammar: ``exit:8``, ``model:<path>``, ``eagle3:<dir>``, ``lookup:3``,
        ``target``."""
        if self.kind is LevelKind.EXIT:
            return f"exit:{self.layer}"
        if self.kind is LevelKind.LOOKUP:
            return f"lookup:{self.ngram}"
        if self.kind.needs_path:
            return f"{self.kind}:{self.model_path}"
        return str(LevelKind.TARGET)


def parse_level_specs(
    spec: str, buffers: list[int] | None = None, methods: list[str] | None = None
) -> tuple[LevelSpec, ...]:
    """Parse ``"exit:4,exit:12,target"`` (or ``"model:/path,target"``, ``"eagle3:/dir,exit:16,target"``,
    or ``"target"``) into levels, cheapest first.

    Args:
        spec: the comma-separated level names (module docstring).
        buffers: one per non-target level (N_d for the drafter, N_i for intermediates);
            default 4 each.
        methods: one per verifying level (every level but the drafter), or a single method for
            all; default ``DEFAULT_CHAIN_METHOD``.

    Returns:
        One ``LevelSpec`` per name. Raises ``ValueError`` naming the bad level, or
        ``--buffers`` / ``--methods`` for a wrong count.
    """
    names = [part.strip() for part in spec.split(",") if part.strip()]
    if not names:
        raise ValueError(f"levels must name at least the target, got {spec!r}")
    num_below = len(names) - 1
    buffers = list(buffers) if buffers else [DEFAULT_BUFFER] * num_below
    if len(buffers) != num_below:
        raise ValueError(f"--buffers needs {num_below} values (one per level below the target), got {buffers}")
    methods = list(methods) if methods else [DEFAULT_CHAIN_METHOD]
    if len(methods) == 1:
        methods = methods * num_below
    if len(methods) != num_below:
        raise ValueError(f"--methods needs 1 or {num_below} values, got {methods}")
    levels = []
    for index, name in enumerate(names):
        # The drafter verifies nothing; level i >= 1 verifies with methods[i - 1].
        method = methods[index - 1] if index > 0 else DEFAULT_CHAIN_METHOD
        buffer = buffers[index] if index < num_below else 1
        levels.append(_parse_level_name(name, buffer, method))
    return tuple(levels)


def _parse_level_name(name: str, buffer: int, method: str) -> LevelSpec:
    kind, _, arg = name.partition(":")
    if kind == LevelKind.EXIT:
        if not arg.isdigit():
            raise ValueError(f"level {name!r}: expected exit:<layer index>")
        return LevelSpec(LevelKind.EXIT, layer=int(arg), buffer=buffer, method=method)
    if kind in (LevelKind.MODEL, LevelKind.EAGLE3):
        return LevelSpec(LevelKind(kind), buffer=buffer, method=method, model_path=arg)
    if kind == LevelKind.LOOKUP:
        if arg and not arg.isdigit():
            raise ValueError(f"level {name!r}: expected lookup or lookup:<longest n-gram>")
        return LevelSpec(LevelKind.LOOKUP, buffer=buffer, method=method, ngram=int(arg) if arg else None)
    if kind == LevelKind.TARGET and not arg:
        return LevelSpec(LevelKind.TARGET, method=method)  # a target hands nothing up: no buffer
    raise ValueError(f"unknown level {name!r}: expected exit:<layer>, model:<path>, eagle3:<dir>, "
                     "lookup[:<n>] or target")


def separate_model(levels: tuple[LevelSpec, ...] | list[LevelSpec]) -> LevelSpec | None:
    """The ``model`` level of ``levels`` (the drafter, or the verifier of a ``lookup`` drafter),
    None without one (a hierarchy holds at most one)."""
    return next((level for level in levels if level.kind is LevelKind.MODEL), None)


def format_level_names(levels: tuple[LevelSpec, ...] | list[LevelSpec]) -> str:
    """The grammar string of ``levels``: ``"exit:4,exit:12,target"``."""
    return ",".join(level.name for level in levels)


def parse_buffers(text: str, name: str = "--buffers") -> list[int]:
    """``"3,5"`` -> ``[3, 5]``; an empty string gives ``[]``.

    Raises ``ValueError`` naming ``name`` unless every comma-separated part is an integer.
    """
    if not text.strip():
        return []
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"{name} must be comma-separated integers, got {text!r}") from None


def format_buffers(levels: tuple[LevelSpec, ...] | list[LevelSpec]) -> str:
    """The buffers of every level below the target as ``"3,5"`` (``""`` for ``target`` alone)."""
    return ",".join(str(level.buffer) for level in levels[:-1])
