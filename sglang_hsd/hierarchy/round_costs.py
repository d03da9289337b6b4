"""What a drafter call and a target call cost on this machine, per thread count and kernel path.

The round planner prices a candidate's rounds (``replay.ReplayStats``: how many drafter and
target forwards of how many rows) with these tables. A *setting* is what the runtime can choose at
start-up: torch's intra-op threads, the kernel path of the linear layers (``runtime/kernel_paths.py``:
``mkl`` = ``F.linear``, ``onednn-packed`` = oneDNN prepacked weights, few-row calls padded where
measured cheaper, as ``SpeculativeGenerator(pack_linears=True)`` runs them) and a separate
drafter's weight copy. Only the copy changes numbers (the drafter's), so the rest changes speed only.
A sampled tree round's drawing and verification are timed per tree shape (``tree_costs.py``).

A call on n rows is timed as the runtime runs it, at batch 1 with a KV cache of ``context_len``
positions (rolled back after each timing): the forward of its layers, the head and the sampling
transform on all n rows; a target call also runs ``verify_chain`` on n - 1 drafts. For an exit
drafter (KV shared with the target) the drafter's call is layers [0, L) and the target's is layers
[L, N) plus [0, L) on the one position no level has processed yet. Rows between the measured ones
are interpolated (``costs._interp``).

With a separate drafter, the target's exits may be timed as a middle level (``middle_replay.py``):
the exit's verification call (layers [0, L), its head) and the target's above it (layers [L, N)
on every row, [0, L) on the last), once per threads and kernel path. A prompt's prefill is timed
at a few prompt lengths, as the runtime's first round runs it: the target's layers over every
prompt position (and a separate drafter's, on its weight copy, for shapes that run it), the head
on the last position; one cold call per length, no repeats (every prompt is a new row count).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Mapping, Sequence

import torch

from sglang_hsd.hierarchy.call_timer import CallTimer
from sglang_hsd.hierarchy.costs import _interp
from sglang_hsd.hierarchy.middle_record import check_middle_layers
from sglang_hsd.runtime.kernel_paths import PATH_MKL, PATH_PACKED, single_row_split
from sglang_hsd.runtime.kernel_setup import DRAFTER_PRECISIONS, parse_drafter_precision
from sglang_hsd.runtime.model import CausalLM
from sglang_hsd.sampling import SamplingParams

KERNEL_PATHS = (PATH_MKL, PATH_PACKED)
DEFAULT_ROWS = (1, 2, 3, 4, 6, 8, 12, 17, 25)


@dataclass(frozen=True)
class KernelSetting:
    """Threads and kernels the runtime runs with.

    Fields:
        threads: torch intra-op threads (>= 1).
        kernel_path: one of ``KERNEL_PATHS`` (the target's and a separate drafter's linears).
        drafter_precision: a ``DRAFTER_PRECISIONS`` name, the weight copy a separate drafter's
            single-row steps read (``fp32`` for an exit drafter).
    """

    threads: int
    kernel_path: str
    drafter_precision: str = "fp32"

    def __post_init__(self) -> None:
        if self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        if self.kernel_path not in KERNEL_PATHS:
            raise ValueError(f"kernel_path must be one of {KERNEL_PATHS}, got {self.kernel_path!r}")
        parse_drafter_precision(self.drafter_precision, name="drafter_precision")

    @property
    def packed(self) -> bool:
        return self.kernel_path == PATH_PACKED

    @property
    def label(self) -> str:
        drafter = "" if self.drafter_precision == "fp32" else f", drafter {self.drafter_precision}"
        return f"{self.threads} thread{'s' if self.threads > 1 else ''}, {self.kernel_path}{drafter}"


@dataclass(frozen=True)
class RoundCosts:
    """Measured seconds of the runtime's calls under one ``KernelSetting``.

    Fields:
        setting: the threads and kernel path they were measured with.
        rows: the row counts measured (increasing, from 1).
        draft_seconds: a drafter call on n rows (head and sampling transform on every row).
        verify_seconds: a target call on n rows, head, transform and ``verify_chain`` of n - 1 drafts.
        sample_seconds: one draw from a vocabulary row (a drafted token, or a plain decoding step's).
        lookup_seconds: one prompt lookup that finds nothing (every n-gram tried) on a context of
            the planning prompts' length: the most a lookup level's step costs.
        prefill_lengths, target_prefill_seconds, drafter_prefill_seconds: prompt prefills
            (``prefill``).
        middle_layers: exits of the target timed as a level between a separate drafter and the
            target (``middle_replay.py``), increasing.
        middle_seconds: per middle layer L, that exit's verification on n rows: layers [0, L), its
            head and transform on every row, ``verify_chain`` of n - 1 drafts.
        tail_seconds: per middle layer L, the target's verification above it on n rows: layers
            [L, N) on n rows and [0, L) on the last, head, transform, ``verify_chain``.
        tree_shapes, tree_seconds: per tree shape ``"D:k:N"``, a round's drawing and verification (``tree``).
    """

    setting: KernelSetting
    rows: tuple[int, ...]
    draft_seconds: tuple[float, ...]
    verify_seconds: tuple[float, ...]
    sample_seconds: float
    lookup_seconds: float = 0.0
    prefill_lengths: tuple[int, ...] = ()
    target_prefill_seconds: tuple[float, ...] = ()
    drafter_prefill_seconds: tuple[float, ...] = ()
    middle_layers: tuple[int, ...] = ()
    middle_seconds: tuple[tuple[float, ...], ...] = ()
    tail_seconds: tuple[tuple[float, ...], ...] = ()
    tree_shapes: tuple[str, ...] = ()
    tree_seconds: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        layers = self.middle_layers
        if list(layers) != sorted(set(layers)) or len(self.middle_seconds) != len(layers) \
                or len(self.tail_seconds) != len(layers) or len(self.tree_shapes) != len(self.tree_seconds) \
                or any(len(row) != len(self.rows) for row in (*self.middle_seconds, *self.tail_seconds)):
            raise ValueError(f"middle_layers must increase, with one row of {len(self.rows)} seconds per layer in "
                             f"middle_seconds and tail_seconds, and tree_seconds one entry per tree shape; got "
                             f"layers {layers}, {[len(r) for r in self.middle_seconds]}, "
                             f"{[len(r) for r in self.tail_seconds]}, trees {self.tree_shapes}, {self.tree_seconds}")
        n = len(self.prefill_lengths)
        if list(self.prefill_lengths) != sorted(set(self.prefill_lengths)) or any(x < 1 for x in self.prefill_lengths):
            raise ValueError(f"prefill_lengths must be increasing positive lengths, got {self.prefill_lengths}")
        if len(self.target_prefill_seconds) != n or len(self.drafter_prefill_seconds) not in (0, n):
            raise ValueError(f"prefill seconds need one entry per prefill length ({n}), got "
                             f"{len(self.target_prefill_seconds)} (target), {len(self.drafter_prefill_seconds)} (drafter)")

    def draft(self, rows: int) -> float:
        return _interp(self.rows, self.draft_seconds, rows)

    def verify(self, rows: int) -> float:
        return _interp(self.rows, self.verify_seconds, rows)

    def _middle_index(self, layer: int) -> int:
        if layer not in self.middle_layers:
            raise ValueError(f"no middle exit timed at layer {layer} (timed: {self.middle_layers})")
        return self.middle_layers.index(layer)

    def middle(self, layer: int, rows: int) -> float:
        """The exit at ``layer`` verifying on ``rows`` rows (a middle level's call)."""
        return _interp(self.rows, self.middle_seconds[self._middle_index(layer)], rows)

    def tail(self, layer: int, rows: int) -> float:
        """The target verifying on ``rows`` rows above its exit at ``layer``."""
        return _interp(self.rows, self.tail_seconds[self._middle_index(layer)], rows)

    def tree(self, shape) -> float:
        """A ``TreeShape`` round's drawing and ``verify_tree`` beyond its calls' chain pricing
        (``tree_costs.tree_round_extra``); 0 for costs timed without trees (older tables)."""
        if not self.tree_shapes:
            return 0.0
        if str(shape) not in self.tree_shapes:
            raise ValueError(f"no tree round timed at shape {shape} (timed: {', '.join(self.tree_shapes)})")
        return self.tree_seconds[self.tree_shapes.index(str(shape))]

    @property
    def plain_step_seconds(self) -> float:
        """One plain decoding step: the target on one row and a draw."""
        return self.verify(1) + self.sample_seconds

    def round_seconds(self, drafter_calls: dict[int, float], target_calls: dict[int, float], drafted: float,
                      lookups: float = 0.0, middle_calls: dict[int, float] | None = None,
                      middle_layer: int | None = None) -> float:
        """Seconds of drafter calls ``{rows: count}``, target calls ``{rows: count}``, ``drafted``
        draws and ``lookups`` prompt lookups; with ``middle_layer``, ``middle_calls`` of the exit
        there and target calls that run only the layers above it."""
        if middle_layer is None:
            if middle_calls:
                raise ValueError("middle_calls need the middle_layer they run")
            target = sum(count * self.verify(rows) for rows, count in target_calls.items())
        else:
            target = (sum(count * self.tail(middle_layer, rows) for rows, count in target_calls.items())
                      + sum(count * self.middle(middle_layer, rows) for rows, count in (middle_calls or {}).items()))
        return (sum(count * self.draft(rows) for rows, count in drafter_calls.items()) + target
                + drafted * self.sample_seconds + lookups * self.lookup_seconds)

    def prefill(self, prompt_len: int, drafter: bool) -> float:
        """Seconds of one prompt's prefill of ``prompt_len`` positions: the target's, plus a
        separate drafter's when ``drafter`` (a shape that runs it); interpolated between the timed
        lengths, extrapolated from the last two above them (held at the first below); 0 when none
        was timed."""
        if not self.prefill_lengths:
            return 0.0
        seconds = self._prefill(self.target_prefill_seconds, prompt_len)
        if drafter and self.drafter_prefill_seconds:
            seconds += self._prefill(self.drafter_prefill_seconds, prompt_len)
        return seconds

    def _prefill(self, values: tuple[float, ...], prompt_len: int) -> float:
        if len(values) == 1:  # one length: proportional to the prompt
            return values[0] * prompt_len / self.prefill_lengths[0]
        return _interp(self.prefill_lengths, values, prompt_len)

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> RoundCosts:
        return cls(KernelSetting(**data["setting"]), tuple(data["rows"]), tuple(data["draft_seconds"]),
                   tuple(data["verify_seconds"]), float(data["sample_seconds"]),
                   float(data.get("lookup_seconds", 0.0)), tuple(data.get("prefill_lengths", ())),
                   tuple(data.get("target_prefill_seconds", ())), tuple(data.get("drafter_prefill_seconds", ())),
                   tuple(data.get("middle_layers", ())), tuple(tuple(r) for r in data.get("middle_seconds", ())),
                   tuple(tuple(r) for r in data.get("tail_seconds", ())), tuple(data.get("tree_shapes", ())),
                   tuple(data.get("tree_seconds", ())))


@dataclass(frozen=True)
class DrafterSpec:
    """The drafter the costs are measured for: a separate ``model``, or the target's exit at
    ``layer`` (with ``head``, or the target's final norm + LM head when None)."""

    model: CausalLM | None = None
    layer: int | None = None
    head: torch.nn.Module | None = None

    def __post_init__(self) -> None:
        if (self.model is None) == (self.layer is None):
            raise ValueError("DrafterSpec needs exactly one of model (a separate drafter) and layer (an exit)")


def _model_calls(timer: CallTimer, target: CausalLM, drafter: DrafterSpec, setting: KernelSetting,
                 rows: tuple[int, ...], prefill_lengths: tuple[int, ...], verified: dict) -> tuple[list, list, tuple]:
    """The drafter's calls, the target's (without ``verify_chain``) and the drafter's prefills under
    ``setting`` (its kernels already in place); ``verified``: the target's calls per (threads,
    kernel path), filled here, as they do not depend on the drafter's weight copy."""
    if drafter.model is None:
        layer = drafter.layer
        draft = [timer.call(target, 0, layer, n, drafter.head) for n in rows]
        verify = [timer.call(target, layer, target.num_layers, n, extra=(0, layer)) for n in rows]
        return draft, verify, ()  # the exit's layers are the target's first: its prefill covers them
    drafter.model.set_weight_copy(DRAFTER_PRECISIONS[setting.drafter_precision])
    draft = [timer.call(drafter.model, 0, drafter.model.num_layers, n) for n in rows]
    # On its weight copy: the copy may serve a prefill's rows too, so timed per setting.
    drafter_prefill = tuple(timer.prefill(drafter.model, n) for n in prefill_lengths)
    key = (setting.threads, setting.kernel_path)
    verified[key] = verified.get(key) or [timer.call(target, 0, target.num_layers, n) for n in rows]
    return draft, verified[key], drafter_prefill


def _checked_rows(rows: Sequence[int], drafter: DrafterSpec, settings: Sequence[KernelSetting]) -> tuple[int, ...]:
    """The row counts to time, sorted, starting at 1; settings an exit drafter can run."""
    rows = tuple(sorted(set(int(n) for n in rows)))
    if not rows or rows[0] != 1:
        raise ValueError(f"rows must include 1, got {rows}")
    if drafter.model is None and any(s.drafter_precision != "fp32" for s in settings):
        raise ValueError("settings: an exit drafter runs the target's own weights; drafter_precision must be fp32")
    return rows


def _use_setting(models: Sequence[CausalLM], setting: KernelSetting) -> None:
    """Threads and linears as the runtime runs them under ``setting`` (packed at this thread
    count's split, ``kernel_paths``)."""
    torch.set_num_threads(setting.threads)
    for model in models:
        model.unpack_linears()
        if setting.packed:
            model.pack_linears(single_row_split(model))


@torch.inference_mode()
def measure_round_costs(
    target: CausalLM,
    drafter: DrafterSpec,
    settings: Sequence[KernelSetting],
    params: SamplingParams = SamplingParams(0.0),
    context_len: int = 128,
    rows: Sequence[int] = DEFAULT_ROWS,
    repeats: int = 3,
    progress=None,
    lookup_ngram: int | None = None,
    prefill_lengths: Sequence[int] = (),
    middle_layers: Sequence[int] = (),
    middle_heads: Mapping[int, torch.nn.Module] | None = None,
    trees: Sequence = (),
) -> list[RoundCosts]:
    """Time drafter and target calls of ``rows`` rows under every setting (threads are restored,
    the models are left unpacked).

    Args:
        progress: optional callable(str) told which setting is being measured.
        lookup_ngram: also time a prompt lookup of this longest n-gram (``lookup_seconds``).
        prefill_lengths: also time a prefill of each of these prompt lengths (``RoundCosts.prefill``;
            empty: predictions leave the prefill out).
        middle_layers: also time the target's exit at each of these layers as a level between a
            separate drafter and the target (with ``middle_heads[layer]``, or the logit lens), and
            the target's calls above it (``RoundCosts.middle``, ``RoundCosts.tail``).
        trees: ``TreeShape`` s whose rounds' drawing and verification are timed (``RoundCosts.tree``),
            once per thread count.
    """
    middle_layers = check_middle_layers(middle_layers, target.num_layers, drafter.model is not None)
    prefill_lengths = tuple(sorted(set(int(n) for n in prefill_lengths)))
    rows = _checked_rows(rows, drafter, settings)
    models = [target] + ([drafter.model] if drafter.model is not None else [])
    threads_before = torch.get_num_threads()
    timer = CallTimer(models, params, context_len, rows[-1], repeats)
    results, verified, target_prefills, middles, tree_extras = [], {}, {}, {}, {}
    try:
        for setting in settings:
            if progress is not None:
                progress(setting.label)
            key = (setting.threads, setting.kernel_path)
            _use_setting(models, setting)
            draft, verify, drafter_prefill = _model_calls(timer, target, drafter, setting, rows, prefill_lengths,
                                                          verified)
            if key not in target_prefills:
                target_prefills[key] = tuple(timer.prefill(target, n) for n in prefill_lengths)
            chains = [timer.verify_chain(target.vocab_size, n) for n in rows]
            verify = [v + c for v, c in zip(verify, chains)]
            if key not in middles:  # the target's own layers: once per kernels, not per drafter copy
                middles[key] = timer.middle_calls(target, middle_layers, middle_heads or {}, rows, chains)
            lookup = timer.lookup(target.vocab_size, context_len, lookup_ngram) if lookup_ngram else 0.0
            sample = timer.sample(target.vocab_size)
            if setting.threads not in tree_extras:  # no linear layers: the kernel path does not matter
                tree_extras[setting.threads] = timer.tree_rounds(trees, target.vocab_size, sample)
            results.append(RoundCosts(setting, rows, tuple(draft), tuple(verify), sample,
                                      lookup, prefill_lengths, target_prefills[key], drafter_prefill,
                                      middle_layers, *middles[key], tuple(str(t) for t in trees),
                                      tree_extras[setting.threads]))
    finally:
        torch.set_num_threads(threads_before)
        if drafter.model is not None:
            drafter.model.set_weight_copy(None)
        for model in models:
            model.unpack_linears()
    return results
