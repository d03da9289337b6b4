"""The plan file: one typed JSON that ``sglang-hsd plan`` writes and both the runtime
(``sglang-hsd generate --plan``) and the SGLang plugin (``--hsd-plan``) read.

JSON layout, keys in this order (only ``levels`` and ``buffers`` are required, so a hand-written
``{"levels": "exit:4,exit:12,target", "buffers": "3,5"}`` is a plan too)::

    levels, buffers                       the chosen hierarchy in the level grammar of
                                          ``sglang_hsd/levels.py``: "exit:4,exit:12,target", "3,5"
    draft_length, tree, threads, kernel_path, drafter_precision
                                          optional runtime knobs (the round planner's,
                                          ``hierarchy/round_planner.py``): "adaptive:0.4:16", "4:2:8", 2,
                                          "onednn-packed", "bf16"; absent: the runtime's defaults
    predicted_speedup, predicted_seconds_per_token,
    exact_model_speedup, exact_model_seconds_per_token
                                          the planner's predictions for it (docs/hierarchy.md)
    runner_up_single_draft                the same fields for the best one-drafter hierarchy
    model, temperature, top_k, top_p, candidates, alpha, costs, prefix_seconds,
    autoregressive_seconds_per_token      what the planner measured (``PlanMeasurement``)

The knobs are parsed once, when the file is read, into a typed ``RunKnobs``; the runtime uses
those values as they are and writing a plan spells them back in the same text.

The module lives with the runtime because the runtime is what a plan describes; it imports
nothing of ``sglang_hsd.hierarchy``. The planner's ``Plan`` and ``PlanResult`` appear in the
annotations of the two construction helpers (``PlannedHierarchy.from_plan``,
``PlanFile.from_planner``) only, through a type-only import: the helpers read their fields by
name, so the planner is never imported with this module.

Bad input raises ``ValueError`` naming the field (``runner_up_single_draft.buffers``, ...).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from sglang_hsd.draft_length import DraftLengthRule, format_draft_length, parse_draft_length
from sglang_hsd.levels import (
    LevelKind,
    LevelSpec,
    format_buffers,
    format_level_names,
    parse_buffers,
    parse_level_specs,
)
from sglang_hsd.tree_draft import TreeShape
from sglang_hsd.runtime.kernel_paths import PATH_MKL, PATH_PACKED
from sglang_hsd.runtime.kernel_setup import parse_drafter_precision

if TYPE_CHECKING:
    from sglang_hsd.hierarchy.planner import Plan, PlanResult

PREDICTION_FIELDS = (
    "predicted_speedup", "predicted_seconds_per_token", "exact_model_speedup", "exact_model_seconds_per_token",
)
RUNNER_UP_FIELD = "runner_up_single_draft"
# The kernel paths a plan may name: the two the runtime's linear layers run.
KERNEL_PATHS = (PATH_MKL, PATH_PACKED)


class NoTree(Enum):
    """The ``tree`` knob ``"none"``: chains. A value of its own rather than None, because a plan
    that says ``none`` overrides ``--tree`` while a plan without the knob leaves it as it is."""

    CHAINS = "none"


CHAINS = NoTree.CHAINS


@dataclass(frozen=True)
class RunKnobs:
    """The runtime knobs a plan runs its hierarchy with, parsed; None: the runtime's default.

    Fields:
        draft_length: ``--draft-length``, a ``DraftLengthRule`` as ``parse_draft_length``
            returns it (``fixed``: ``DraftLengthRule()``); only rules with a spelling
            (``format_draft_length``) are accepted.
        tree: ``--tree``, a ``TreeShape`` or ``CHAINS`` (``none``).
        threads: ``--threads``, an int >= 1.
        kernel_path: the linear layers' kernel path, ``PATH_MKL`` or ``PATH_PACKED``
            (``pack_linears``).
        drafter_precision: ``--drafter-precision``, a ``kernel_setup.DRAFTER_PRECISIONS`` name
            (checked by ``parse_drafter_precision``). The name, not the weight-copy kind that
            parser returns: that is None for fp32, which here would read as "no knob".
    """

    draft_length: DraftLengthRule | None = None
    tree: TreeShape | NoTree | None = None
    threads: int | None = None
    kernel_path: str | None = None
    drafter_precision: str | None = None

    def __post_init__(self) -> None:
        if self.draft_length is not None:
            if not isinstance(self.draft_length, DraftLengthRule):
                raise ValueError(f"draft_length must be a DraftLengthRule, got {self.draft_length!r}")
            format_draft_length(self.draft_length)  # a rule the file cannot spell would change when written
        if self.tree is not None and not isinstance(self.tree, (TreeShape, NoTree)):
            raise ValueError(f"tree must be a TreeShape or CHAINS, got {self.tree!r}")
        if self.threads is not None and (isinstance(self.threads, bool) or not isinstance(self.threads, int)
                                         or self.threads < 1):
            raise ValueError(f"threads must be >= 1, got {self.threads!r}")
        if self.kernel_path is not None and self.kernel_path not in KERNEL_PATHS:
            raise ValueError(f"kernel_path must be one of {list(KERNEL_PATHS)}, got {self.kernel_path!r}")
        if self.drafter_precision is not None:
            parse_drafter_precision(self.drafter_precision, name="drafter_precision")

    def present(self) -> dict[str, Any]:
        """The knobs the plan sets, by field name, in the file's order (typed values)."""
        return {key: getattr(self, key) for key, *_ in _KNOBS if getattr(self, key) is not None}

    def to_json(self) -> dict[str, Any]:
        """The knobs present as the command line spells them:
        ``{"draft_length": "adaptive:0.4:16", "tree": "none", "threads": 2, ...}``."""
        spellers = {key: spell for key, _, _, spell in _KNOBS}
        return {key: spellers[key](value) for key, value in self.present().items()}

    @classmethod
    def from_json(cls, data: dict, prefix: str = "") -> RunKnobs:
        """Parse the knobs present in ``data``; ``prefix`` names the enclosing field in error
        messages (``plan field <prefix>tree must be none or D:k:N ...``)."""
        values = {}
        for key, kind, parse, _ in _KNOBS:
            raw = _field(data, key, kind, prefix, required=False)
            if raw is not None:
                values[key] = _parse_knob(parse, raw, f"plan field {prefix}{key}")
        try:
            return cls(**values)
        except ValueError as err:  # the messages start with the field's name
            raise ValueError(f"plan field {prefix}{err}") from None


def _parse_knob(parse: Callable[[Any, str], Any], raw: Any, name: str) -> Any:
    """``parse(raw, name)`` with ``name`` leading every error (the parsers' own messages start
    with it; the values' checks, e.g. a threshold out of range, do not)."""
    try:
        return parse(raw, name)
    except ValueError as err:
        message = str(err)
        raise ValueError(message if message.startswith(name) else f"{name}: {message}") from None


def _parse_tree(text: str, name: str) -> TreeShape | NoTree:
    """``--tree`` text -> a ``TreeShape``, or ``CHAINS`` for ``none``."""
    shape = TreeShape.parse(text, name=name)
    return CHAINS if shape is None else shape


def _spell_tree(tree: TreeShape | NoTree) -> str:
    return tree.value if isinstance(tree, NoTree) else str(tree)


def _as_is(value: Any, name: str = "") -> Any:
    """A knob whose JSON value is its typed value (checked by ``RunKnobs``)."""
    return value


# Each knob: (field, JSON type, text -> typed value naming the field, typed value -> JSON value).
_KNOBS: tuple[tuple[str, type, Callable[[Any, str], Any], Callable[[Any], Any]], ...] = (
    ("draft_length", str, parse_draft_length, format_draft_length),
    ("tree", str, _parse_tree, _spell_tree),
    ("threads", int, _as_is, _as_is),
    ("kernel_path", str, _as_is, _as_is),
    ("drafter_precision", str, _as_is, _as_is),
)


@dataclass(frozen=True)
class PlannedHierarchy:
    """One hierarchy of a plan file and the planner's predictions for it.

    Fields:
        levels: cheapest first, the target last, each with its buffer (``LevelSpec.buffer``;
            methods are not part of a plan and keep their default).
        predicted_speedup / predicted_seconds_per_token: the planner's objective (the latency
            formula of docs/hierarchy.md) for this hierarchy; None when the file has none.
        exact_model_speedup / exact_model_seconds_per_token: the same hierarchy under the
            runtime's exact latency model (buffer overshoot); None when the file has none.
        knobs: the runtime knobs to run it with (``RunKnobs``; empty: the runtime's defaults).
    """

    levels: tuple[LevelSpec, ...]
    predicted_speedup: float | None = None
    predicted_seconds_per_token: float | None = None
    exact_model_speedup: float | None = None
    exact_model_seconds_per_token: float | None = None
    knobs: RunKnobs = dataclasses.field(default_factory=RunKnobs)

    def __post_init__(self) -> None:
        if not self.levels or self.levels[-1].kind is not LevelKind.TARGET:
            raise ValueError(f"levels: the last level must be the target, got {format_level_names(self.levels)!r}")

    @property
    def level_names(self) -> str:
        """The levels in the grammar, ready for ``--levels``: ``"exit:4,exit:12,target"``."""
        return format_level_names(self.levels)

    @property
    def buffers(self) -> list[int]:
        """One buffer per level below the target, ready for ``parse_levels``."""
        return [level.buffer for level in self.levels[:-1]]

    @property
    def buffer_text(self) -> str:
        """The buffers as ``--buffers`` takes them: ``"3,5"`` (``""`` for ``target`` alone)."""
        return format_buffers(self.levels)

    @property
    def autoregressive(self) -> bool:
        """The target alone: plain decoding, no speculation."""
        return len(self.levels) == 1

    @classmethod
    def from_plan(cls, plan: Plan, exits: list[int]) -> PlannedHierarchy:
        """The planner's ``Plan`` over candidate ids (id i < len(exits): ``exit:exits[i]``; the
        last id: the target)."""
        levels = [
            LevelSpec(LevelKind.EXIT, layer=exits[i], buffer=size)
            for i, size in zip(plan.levels[:-1], plan.buffers)
        ]
        return cls(
            (*levels, LevelSpec(LevelKind.TARGET)),
            predicted_speedup=plan.speedup,
            predicted_seconds_per_token=plan.latency,
            exact_model_speedup=plan.exact_speedup,
            exact_model_seconds_per_token=plan.exact_latency,
        )

    def to_json(self) -> dict[str, Any]:
        """``{"levels": ..., "buffers": ..., <knobs present>, <predictions present>}``."""
        out: dict[str, Any] = {"levels": self.level_names, "buffers": self.buffer_text}
        out.update(self.knobs.to_json())
        out.update({key: getattr(self, key) for key in PREDICTION_FIELDS if getattr(self, key) is not None})
        return out

    @classmethod
    def from_json(cls, data: dict, prefix: str = "") -> PlannedHierarchy:
        """Read the fields of ``to_json`` from ``data``; ``prefix`` names the enclosing field in
        error messages."""
        levels_text = _field(data, "levels", str, prefix)
        buffers_text = _field(data, "buffers", str, prefix)
        try:
            levels = parse_level_specs(levels_text)
        except ValueError as err:
            raise ValueError(f"plan field {prefix}levels: {err}") from None
        buffers = parse_buffers(buffers_text, name=f"plan field {prefix}buffers")
        if len(buffers) != len(levels) - 1:
            raise ValueError(
                f"plan field {prefix}buffers must hold {len(levels) - 1} values (one per level below "
                f"the target of {levels_text!r}), got {buffers_text!r}")
        if buffers:
            try:
                levels = parse_level_specs(levels_text, buffers)
            except ValueError as err:
                raise ValueError(f"plan field {prefix}buffers: {err}") from None
        predictions = {key: _field(data, key, float, prefix, required=False) for key in PREDICTION_FIELDS}
        knobs = RunKnobs.from_json(data, prefix)
        try:
            return cls(levels, **predictions, knobs=knobs)
        except ValueError as err:
            raise ValueError(f"plan field {prefix}{err}") from None


@dataclass(frozen=True)
class PlanMeasurement:
    """What the planner measured on the model.

    Fields:
        model: model name or folder.
        temperature / top_k / top_p: the sampling settings acceptance was measured at.
        candidates: the candidate exit layers (level id i is ``exit:candidates[i]``).
        alpha: float [K + 1][K + 1], acceptance of level i's tokens by level j (i < j; the last
            id is the target).
        costs: the ``CostModel``'s ``as_dict()``.
        prefix_seconds: seconds of the target's first L layers on one position, keyed by str(L).
        autoregressive_seconds_per_token: one plain decoding step.
    """

    model: str
    temperature: float
    top_k: int
    top_p: float
    candidates: list[int]
    alpha: list[list[float]]
    costs: dict
    prefix_seconds: dict[str, float]
    autoregressive_seconds_per_token: float

    def to_json(self) -> dict[str, Any]:
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}

    @classmethod
    def from_json(cls, data: dict) -> PlanMeasurement:
        types = {"model": str, "temperature": float, "top_k": int, "top_p": float, "candidates": list,
                 "alpha": list, "costs": dict, "prefix_seconds": dict, "autoregressive_seconds_per_token": float}
        return cls(**{name: _field(data, name, kind) for name, kind in types.items()})


@dataclass(frozen=True)
class PlanFile:
    """A plan: the hierarchy to run, the runner-up and the measurements behind them.

    Fields:
        best: the hierarchy ``generate --plan`` and ``--hsd-plan`` run.
        runner_up_single_draft: the best hierarchy with one drafter (None if absent).
        measurement: what was measured (None for a hand-written plan).
    """

    best: PlannedHierarchy
    runner_up_single_draft: PlannedHierarchy | None = None
    measurement: PlanMeasurement | None = None

    @classmethod
    def from_planner(cls, result: PlanResult, exits: list[int], measurement: PlanMeasurement) -> PlanFile:
        """The plan file of a planner run over candidate exits ``exits``.

        When even the best hierarchy is predicted slower than autoregressive decoding, ``best`` is
        the target alone (predicted speed-up 1; the exact-model fields keep the best hierarchy's
        numbers) and the runner-up still holds the best one-drafter hierarchy.
        """
        best = PlannedHierarchy.from_plan(result.best, exits)
        if result.best.speedup < 1.0:
            best = dataclasses.replace(
                best, levels=(LevelSpec(LevelKind.TARGET),), predicted_speedup=1.0,
                predicted_seconds_per_token=measurement.autoregressive_seconds_per_token)
        return cls(best, PlannedHierarchy.from_plan(result.best_single_draft, exits), measurement)

    def to_json(self) -> dict[str, Any]:
        out = self.best.to_json()
        if self.runner_up_single_draft is not None:
            out[RUNNER_UP_FIELD] = self.runner_up_single_draft.to_json()
        if self.measurement is not None:
            out.update(self.measurement.to_json())
        return out

    @classmethod
    def from_json(cls, data: Any) -> PlanFile:
        if not isinstance(data, dict):
            raise ValueError(f"a plan must be a JSON object, got {type(data).__name__}")
        runner_up = None
        if RUNNER_UP_FIELD in data:
            runner_up = PlannedHierarchy.from_json(_field(data, RUNNER_UP_FIELD, dict), f"{RUNNER_UP_FIELD}.")
        measured = [field.name for field in dataclasses.fields(PlanMeasurement) if field.name in data]
        measurement = PlanMeasurement.from_json(data) if measured else None
        return cls(PlannedHierarchy.from_json(data), runner_up, measurement)

    @classmethod
    def read(cls, path: str | Path) -> PlanFile:
        """Read and validate a plan file; ``ValueError`` names the file and the bad field."""
        try:
            data = json.loads(Path(path).read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: a plan file must be JSON ({err})") from None
        try:
            return cls.from_json(data)
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from None

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=2))


def _field(data: dict, name: str, kind: type, prefix: str = "", required: bool = True):
    """``data[name]`` checked to be a ``kind`` (an int passes as a float); None if absent and not
    ``required``."""
    if name not in data:
        if required:
            raise ValueError(f"plan field {prefix}{name} is missing")
        return None
    value = data[name]
    accepted = (int, float) if kind is float else kind
    if isinstance(value, bool) or not isinstance(value, accepted):
        raise ValueError(f"plan field {prefix}{name} must be a {kind.__name__}, got {value!r}")
    return value
