"""The ``--hsd-adaptive*`` flags as a typed setting (:class:`AdaptiveSetting`), read once per
scheduler process, and where adaptive lengths apply (:func:`unsupported_reason`). The controller
they configure is ``sglang_hsd/adaptive.py``; the per-round bookkeeping in SGLang,
``adaptive_spec.py``.

``--hsd-adaptive-tuning name=value,...`` sets fields of ``AdaptiveConfig`` (``TUNABLE``: every
field but the candidates, which ``--speculative-num-steps`` gives) instead of their defaults,
e.g. ``draft_margin=1.05``: for comparing controller settings on one workload, or a workload
unlike the ones the defaults were measured on. Values that cannot hold are refused before models
load, naming the flag. The choice of each round still uses past rounds only, so any tuning is
lossless.

This module must not import SGLang (the server-argument checks run before SGLang's worker).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from sglang_hsd.adaptive import AdaptiveConfig
from sglang_hsd.sglang_plugin.config import on_off_from_env

ADAPTIVE_ENV = "SGLANG_HSD_ADAPTIVE"
ADAPTIVE_FLAG = "--hsd-adaptive"
CYCLE_ENV = "SGLANG_HSD_DRAFT_LENGTHS_CYCLE"
CYCLE_FLAG = "--hsd-draft-lengths-cycle"
TRACE_ENV = "SGLANG_HSD_ADAPTIVE_TRACE"
TRACE_FLAG = "--hsd-adaptive-trace"
TUNING_ENV = "SGLANG_HSD_ADAPTIVE_TUNING"
TUNING_FLAG = "--hsd-adaptive-tuning"
# AdaptiveConfig fields the tuning flag may set (the candidates come from --speculative-num-steps).
TUNABLE = {f.name: type(f.default) for f in dataclasses.fields(AdaptiveConfig) if f.name != "candidates"}


@dataclass(frozen=True)
class AdaptiveSetting:
    """Fields:
        enabled: the flag's value (True: on).
        explicit: whether the user set it (the default turns itself off where unsupported;
            an explicit ``on`` is refused there).
        lengths_cycle: ``--hsd-draft-lengths-cycle``: each request's decode rounds take these
            lengths in turn from its first round (a batch: its youngest request's turn) instead
            of the controller's choice (measuring what each length costs, testing the switches
            between them); None: the controller chooses. Each is fixed before the round's
            drafts exist, so the output law is the target's.
        trace_path: ``--hsd-adaptive-trace``: a JSON-lines file that gets one line per decode
            round (what the controller saw, chose and measured; :class:`AdaptiveRounds`); None:
            no trace.
        tuning: ``--hsd-adaptive-tuning``: ``AdaptiveConfig`` fields set instead of their
            defaults, as (name, value) pairs (``TUNABLE``); empty: the defaults.
    """

    enabled: bool = True
    explicit: bool = False
    lengths_cycle: tuple[int, ...] | None = None
    trace_path: str | None = None
    tuning: tuple[tuple[str, float | int], ...] = ()

    @classmethod
    def from_env(cls) -> "AdaptiveSetting":
        value = on_off_from_env(ADAPTIVE_ENV, ADAPTIVE_FLAG)
        return cls(value != "off", explicit=value is not None,
                   lengths_cycle=_parse_cycle(os.environ.get(CYCLE_ENV, "")),
                   trace_path=os.environ.get(TRACE_ENV, "").strip() or None,
                   tuning=_parse_tuning(os.environ.get(TUNING_ENV, "")))

    def config(self, num_steps: int) -> AdaptiveConfig:
        """The controller's configuration for ``--speculative-num-steps`` ``num_steps``; raises
        ``ValueError`` naming ``--hsd-adaptive-tuning`` for values that cannot hold."""
        try:
            return AdaptiveConfig.up_to(num_steps, **dict(self.tuning))
        except ValueError as err:
            if not self.tuning:
                raise
            raise ValueError(f"{TUNING_FLAG}: {err}") from None

    def tuning_problem(self, num_steps: int) -> str | None:
        """Why ``tuning`` cannot be used (values that cannot hold, or nothing to tune), or None."""
        if not self.tuning:
            return None
        idle = self._idle_controller(TUNING_FLAG, f"tunes {ADAPTIVE_FLAG}'s controller")
        if idle is not None:
            return idle
        try:
            self.config(num_steps)
        except ValueError as err:
            return str(err)
        return None

    def _idle_controller(self, flag: str, what: str) -> str | None:
        """Why ``flag`` (which ``what``, e.g. "records --hsd-adaptive's choices") would do
        nothing: the controller is off, or a cycle forces every length; None when it chooses."""
        if not self.enabled:
            return f"{flag}: it {what}; it is off"
        if self.lengths_cycle is not None:
            return (f"{flag} with {CYCLE_FLAG}: the cycle forces every length, the controller "
                    f"chooses nothing; drop one of them")
        return None

    def trace_problem(self) -> str | None:
        """Why ``trace_path`` cannot be written or would stay empty (the lengths are not the
        controller's choice), or None."""
        if self.trace_path is None:
            return None
        idle = self._idle_controller(TRACE_FLAG, f"records {ADAPTIVE_FLAG}'s choices")
        if idle is not None:
            return idle
        path = os.path.abspath(os.path.expanduser(self.trace_path))
        if os.path.isdir(path):
            return f"{TRACE_FLAG} {self.trace_path}: a directory; expected a file to append to"
        folder = os.path.dirname(path)
        if not os.path.isdir(folder):
            return f"{TRACE_FLAG} {self.trace_path}: the folder {folder} does not exist"
        if not os.access(path if os.path.exists(path) else folder, os.W_OK):
            return f"{TRACE_FLAG} {self.trace_path}: not writable"
        return None

    def cycle_problem(self, num_steps: int) -> str | None:
        """Why ``lengths_cycle`` cannot run with ``num_steps`` (``--speculative-num-steps``)."""
        if self.lengths_cycle is None:
            return None
        if not self.enabled:
            return f"{CYCLE_FLAG}: the lengths replace {ADAPTIVE_FLAG}'s choice; it is off"
        bad = [length for length in self.lengths_cycle if not 0 <= length <= num_steps]
        if bad:
            return (f"{CYCLE_FLAG}: every length must be in 0..{num_steps} (--speculative-num-steps), "
                    f"got {bad}")
        return None


def _parse_cycle(text: str) -> tuple[int, ...] | None:
    text = text.strip()
    if not text:
        return None
    try:
        lengths = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"{CYCLE_FLAG} ({CYCLE_ENV}) must be comma-separated draft lengths such as "
                         f"0,0,3, got {text!r}") from None
    return lengths


def _parse_tuning(text: str) -> tuple[tuple[str, float | int], ...]:
    """``name=value,...`` -> (name, value) pairs of ``TUNABLE`` fields, each value of its field's
    type; ``ValueError`` naming the flag otherwise."""
    pairs = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = (x.strip() for x in part.partition("="))
        if not sep or name not in TUNABLE:
            raise ValueError(f"{TUNING_FLAG} ({TUNING_ENV}) takes name=value pairs of "
                             f"{', '.join(TUNABLE)}, got {part!r}")
        try:
            pairs.append((name, TUNABLE[name](value)))
        except ValueError:
            raise ValueError(f"{TUNING_FLAG} ({TUNING_ENV}): {name} must be a{'n integer' if TUNABLE[name] is int else ' number'}, "
                             f"got {value!r}") from None
    return tuple(pairs)


def unsupported_reason(topk: int, exit_layer: bool, device: str = "cpu") -> str | None:
    """Why adaptive budgets cannot run with this shape, or None. Chains choose their length;
    trees (``topk`` > 1) their depth within the configured shape (``tree_draft.budget_shapes``),
    on CPU only: each budget is a runtime state of its own, and GPU trees capture a draft CUDA
    graph per state, which no test here covers."""
    if topk > 1 and device != "cpu":
        return (f"--speculative-eagle-topk {topk} on --device {device} (tree budgets run on CPU; "
                "GPU trees keep their configured shape)")
    if exit_layer:
        return "--hsd-exit-layer (the exit level's verify window is fixed)"
    return None
