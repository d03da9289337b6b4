"""What a drafter call and a target call cost on this machine, per thread count and kernel path.

The round planner prices a candidate's rounds (``replay.ReplayStats``: how many drafter and
target forwards of how many rows) with these tables. A *setting* is the pair the runtime can
choose at start-up: torch's intra-op threads and the kernel path of the linear layers
(``runtime/kernel_paths.py``: ``mkl`` = ``F.linear``, ``onednn-packed`` = the target's and a
separate drafter's projections on oneDNN prepacked weights for two rows or more, as
``SpeculativeGenerator(pack_linears=True)`` runs them). Every setting computes the same fp32
numbers, so the choice changes speed only.

A call on n rows is timed as the runtime runs it, at batch 1 with a KV cache of ``context_len``
positions (rolled back after each timing): the forward of its layers, the head and the sampling
transform on all n rows; a target call also runs ``verify_chain`` on n - 1 drafts. For an exit
drafter (KV shared with the target) the drafter's call is layers [0, L) and the target's is layers
[L, N) plus [0, L) on the one position no level has processed yet. Rows between the measured ones
are interpolated (``costs._interp``).

With a separate drafter, the target's exits may be timed as a middle level (``middle_replay.py``):
the exit's verification call (layers [0, L), its head) and the target's above it (layers [L, N)
on every row, [0, L) on the last), once per threads and kernel path.

A prompt's prefill is timed too, at a few prompt lengths, as the runtime's first round runs it: the
target's layers over every prompt position (and a separate drafter's, on its weight copy, for shapes
that run it; an exit drafter's layers are part of the target's), the head on the last position.
One cold call per length, no repeats: every prompt of a generation is a new row count, and its
prefill a first call too (a 1.5B prefill of 150 positions takes seconds on one core).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Mapping, Sequence

import torch

from sglang_hsd.hierarchy.costs import _interp
from sglang_hsd.hierarchy.measure import _median_seconds
from sglang_hsd.hierarchy.middle_record import check_middle_layers
from sglang_hsd.runtime.kernel_paths import PATH_MKL, PATH_PACKED, single_row_split
from sglang_hsd.runtime.kernel_setup import DRAFTER_PRECISIONS, parse_drafter_precision
from sglang_hsd.runtime.model import CausalLM
from sglang_hsd.sampling import SamplingParams, logits_to_probs

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

    def __post_init__(self) -> None:
        layers = self.middle_layers
        if list(layers) != sorted(set(layers)) or len(self.middle_seconds) != len(layers) \
                or len(self.tail_seconds) != len(layers) \
                or any(len(row) != len(self.rows) for row in (*self.middle_seconds, *self.tail_seconds)):
            raise ValueError(f"middle_layers must increase, with one row of {len(self.rows)} seconds per layer in "
                             f"middle_seconds and tail_seconds; got layers {layers}, "
                             f"{[len(r) for r in self.middle_seconds]}, {[len(r) for r in self.tail_seconds]}")
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
                   tuple(tuple(r) for r in data.get("tail_seconds", ())))


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


class _CallTimer:
    """Times calls of the runtime's shape on warmed KV caches of ``context_len`` positions."""

    def __init__(self, models: list[CausalLM], params: SamplingParams, context_len: int, max_rows: int,
                 repeats: int) -> None:
        self.params, self.repeats = params, repeats
        self.generator = torch.Generator().manual_seed(0)
        self.caches, self.bases = {}, {}
        for model in models:
            cache = model.new_cache(1, context_len + max_rows + 1)
            prompt = torch.randint(0, model.vocab_size, (1, context_len), generator=self.generator)
            model.forward_layers(model.embed(prompt), 0, model.num_layers, cache)
            self.caches[id(model)], self.bases[id(model)] = cache, cache.lengths[0].clone()

    def call(self, model: CausalLM, lo: int, hi: int, n: int, head=None, extra: tuple[int, int] | None = None) -> float:
        """Median seconds of layers [lo, hi) on n rows, the head and the transform on all n rows;
        ``extra``: also layers extra[0]..extra[1] on the last row (an exit drafter's catch-up)."""
        cache, base = self.caches[id(model)], self.bases[id(model)]
        hidden = torch.randn(1, n, model.hidden_size, generator=self.generator)

        def run():
            out = model.forward_layers(hidden, lo, hi, cache)
            if extra is not None:
                model.forward_layers(hidden[:, -1:], extra[0], extra[1], cache)
            logits_to_probs(model.exit_logits(out, head), self.params)
            cache.truncate(base)

        return _median_seconds(run, self.repeats, warmup=1)

    def middle_calls(self, target: CausalLM, layers, heads, rows, chains) -> tuple[tuple, tuple]:
        """Per middle layer L, seconds on each of ``rows`` rows of the exit's call (layers [0, L),
        ``heads[L]`` or the lens) and of the target's call above it (layers [L, N), [0, L) on the
        last row), each plus ``chains`` (``verify_chain`` of n - 1 drafts, per row count)."""
        middle = tuple(tuple(self.call(target, 0, layer, n, heads.get(layer)) + c for n, c in zip(rows, chains))
                       for layer in layers)
        tail = tuple(tuple(self.call(target, layer, target.num_layers, n, extra=(0, layer)) + c
                           for n, c in zip(rows, chains)) for layer in layers)
        return middle, tail

    def prefill(self, model: CausalLM, n: int) -> float:
        """Seconds of one cold prefill of n positions on a fresh cache: every layer on n rows, the
        head and the transform on the last (module docstring)."""
        cache = model.new_cache(1, n)
        prompt = torch.randint(0, model.vocab_size, (1, n), generator=self.generator)
        start = time.perf_counter()
        hidden = model.forward_layers(model.embed(prompt), 0, model.num_layers, cache)
        logits_to_probs(model.exit_logits(hidden[:, -1:], None), self.params)
        return time.perf_counter() - start

    def verify_chain(self, vocab: int, n: int) -> float:
        """Median seconds of ``verify_chain`` on n - 1 drafts (0 for n = 1)."""
        from sglang_hsd.verify.chain import verify_chain

        if n == 1:
            return 0.0
        probs = torch.softmax(torch.randn(1, n, vocab, generator=self.generator), -1)
        tokens = torch.randint(0, vocab, (1, n - 1), generator=self.generator)
        return _median_seconds(lambda: verify_chain(tokens, probs[:, : n - 1], probs, generator=self.generator,
                                                    validate=False), self.repeats, warmup=1)

    def lookup(self, vocab: int, context_len: int, ngram: int) -> float:
        """Median seconds of a lookup over ``context_len`` random tokens that finds nothing."""
        from sglang_hsd.lookup_draft import lookup_continuation

        context = torch.randperm(max(vocab, context_len), generator=self.generator)[:context_len]
        return _median_seconds(lambda: lookup_continuation(context, ngram, 1), self.repeats, warmup=1)

    def sample(self, vocab: int) -> float:
        q = torch.softmax(torch.randn(1, vocab, generator=self.generator), -1)
        return _median_seconds(lambda: torch.multinomial(q, 1, generator=self.generator), self.repeats, warmup=1)


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
    """
    middle_layers = check_middle_layers(middle_layers, target.num_layers, drafter.model is not None)
    prefill_lengths = tuple(sorted(set(int(n) for n in prefill_lengths)))
    rows = _checked_rows(rows, drafter, settings)
    models = [target] + ([drafter.model] if drafter.model is not None else [])
    threads_before = torch.get_num_threads()
    timer = _CallTimer(models, params, context_len, rows[-1], repeats)
    results, verified, target_prefills, middles = [], {}, {}, {}
    try:
        for setting in settings:
            if progress is not None:
                progress(setting.label)
            key = (setting.threads, setting.kernel_path)
            _use_setting(models, setting)
            if drafter.model is not None:
                drafter.model.set_weight_copy(DRAFTER_PRECISIONS[setting.drafter_precision])
                draft = [timer.call(drafter.model, 0, drafter.model.num_layers, n) for n in rows]
                # On its weight copy: the copy may serve a prefill's rows too, so timed per setting.
                drafter_prefill = tuple(timer.prefill(drafter.model, n) for n in prefill_lengths)
                # The target's calls do not depend on the drafter's precision: timed once per kernels.
                verify = verified.get(key) or [timer.call(target, 0, target.num_layers, n) for n in rows]
                verified[key] = verify
            else:
                layer = drafter.layer
                draft = [timer.call(target, 0, layer, n, drafter.head) for n in rows]
                verify = [timer.call(target, layer, target.num_layers, n, extra=(0, layer)) for n in rows]
                drafter_prefill = ()  # the exit's layers are the target's first: its prefill covers them
            if key not in target_prefills:
                target_prefills[key] = tuple(timer.prefill(target, n) for n in prefill_lengths)
            chains = [timer.verify_chain(target.vocab_size, n) for n in rows]
            verify = [v + c for v, c in zip(verify, chains)]
            if key not in middles:  # the target's own layers: once per kernels, not per drafter copy
                middles[key] = timer.middle_calls(target, middle_layers, middle_heads or {}, rows, chains)
            lookup = timer.lookup(target.vocab_size, context_len, lookup_ngram) if lookup_ngram else 0.0
            results.append(RoundCosts(setting, rows, tuple(draft), tuple(verify), timer.sample(target.vocab_size),
                                      lookup, prefill_lengths, target_prefills[key], drafter_prefill,
                                      middle_layers, *middles[key]))
    finally:
        torch.set_num_threads(threads_before)
        if drafter.model is not None:
            drafter.model.set_weight_copy(None)
        for model in models:
            model.unpack_linears()
    return results
