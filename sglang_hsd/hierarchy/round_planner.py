"""Choose a drafter's round shape and the runtime knobs from measured costs and replayed acceptance.

The knobs: the round's draft shape (a fixed draft length K, an adaptive stopping rule
``adaptive:threshold:max``, a sampled tree ``D:k:N``, or a prompt lookup at the bottom: copies
verified by the target, ``lookup:n,target``, or by the drafter model first, ``lookup:n,model:D,target``,
a three-level hierarchy; or the target's own exit between a separate drafter and the target,
``model:D,exit:L,target``, another three-level hierarchy, ``middle_replay.py``) and the
``KernelSetting`` (threads, kernel path, drafter precision). Plain decoding under each setting is a
candidate too, so the choice is never predicted slower than plain decoding.

Prediction of a candidate, in seconds per token: replay its rounds over the acceptance records
(``replay.py``: rounds, tokens, drafter and target calls by row count), price the calls with the
setting's measured ``RoundCosts`` and divide by the tokens emitted. Greedy records make the
replayed acceptance exact. Each prompt's prefill is added (``RoundCosts.prefill``: the target's
and, for a shape that runs it, a separate drafter's forward over the prompt, timed at two lengths
and interpolated; without it the first planner run on HumanEval under-predicted every row, by
22-57%, ``benchmarks/README.md``). Costs are
per-call medians, so the prediction still leaves out what the engine does between calls
(bookkeeping, cache compaction): ``benchmarks/bench_round_planner.py`` measures the choice against
plain decoding and the other candidates in one run.

``recording.record_acceptance`` builds the records.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import torch

from sglang_hsd.draft_length import DraftLengthRule, format_draft_length, parse_draft_length
from sglang_hsd.hierarchy.lookup_replay import LookupShape, replay_lookup
from sglang_hsd.hierarchy.middle_replay import MiddleShape, replay_middle
from sglang_hsd.hierarchy.recording import record_acceptance
from sglang_hsd.runtime.plan_file import CHAINS, PlannedHierarchy, RunKnobs
from sglang_hsd.hierarchy.replay import STOP_THRESHOLDS, AcceptanceRecord, ReplayStats, replay_chain, replay_tree
from sglang_hsd.hierarchy.round_costs import DrafterSpec, KernelSetting, RoundCosts, measure_round_costs
from sglang_hsd.levels import LevelKind, LevelSpec
from sglang_hsd.runtime.model import CausalLM
from sglang_hsd.sampling import SamplingParams
from sglang_hsd.tree_draft import TreeShape
from sglang_hsd.tree_draft import DEFAULT_LEVEL_RULE, LEVEL_RULES

DEFAULT_FIXED = tuple(range(1, 17))
DEFAULT_ADAPTIVE = tuple(f"adaptive:{t}:{m}" for t in (0.2, 0.4, 0.6) for m in (8, 16, 24, 32))
# Lookups at the bottom: copies of 4-16 tokens verified by the target, or by the drafter model
# filling a buffer of 8-16 for the target (``lookup_replay.py``).
DEFAULT_LOOKUPS = tuple(LookupShape(3, *sizes) for sizes in ((4,), (8,), (16,), (4, 8), (8, 8), (8, 16), (16, 16)))
DEFAULT_TREES = ((2, 2, 4), (3, 2, 6), (4, 2, 8), (5, 2, 10), (6, 2, 12), (8, 2, 16), (3, 3, 8),
                 (4, 3, 10), (6, 3, 16))


@dataclass(frozen=True)
class RoundShape:
    """How a round drafts. Exactly one of: ``fixed`` (K drafts), ``adaptive`` (a
    ``DraftLengthRule`` of kind adaptive), ``tree`` (a ``TreeShape``), ``lookup`` (a
    ``LookupShape``: a prompt lookup at the bottom), ``middle`` (a ``MiddleShape``: the target's
    exit between a separate drafter and the target); all None: plain decoding.
    """

    fixed: int | None = None
    adaptive: DraftLengthRule | None = None
    tree: TreeShape | None = None
    lookup: LookupShape | None = None
    middle: MiddleShape | None = None

    def __post_init__(self) -> None:
        if sum(x is not None for x in (self.fixed, self.adaptive, self.tree, self.lookup, self.middle)) > 1:
            raise ValueError("a RoundShape is one of fixed, adaptive, tree, lookup and middle")
        if self.fixed is not None and self.fixed < 1:
            raise ValueError(f"fixed draft length must be >= 1, got {self.fixed}")
        if self.adaptive is not None and not self.adaptive.adaptive:
            raise ValueError("adaptive needs a DraftLengthRule of kind adaptive")

    @property
    def plain(self) -> bool:
        return all(x is None for x in (self.fixed, self.adaptive, self.tree, self.lookup, self.middle))

    @property
    def uses_drafter(self) -> bool:
        """The drafter model or exit runs (not plain decoding, not copies verified by the target)."""
        return not self.plain and (self.lookup is None or self.lookup.uses_model)

    @property
    def draft_length(self) -> str:
        """The ``--draft-length`` spelling: ``fixed`` or ``adaptive:threshold:max``."""
        return format_draft_length(self.draft_rule)

    @property
    def draft_rule(self) -> DraftLengthRule:
        """The ``DraftLengthRule`` the runtime drafts with: ``adaptive``, else fixed."""
        return self.adaptive if self.adaptive is not None else DraftLengthRule()

    @property
    def tree_text(self) -> str:
        """The ``--tree`` spelling: ``none`` or ``D:k:N``."""
        return "none" if self.tree is None else str(self.tree)

    @property
    def buffer(self) -> int:
        """The drafter level's buffer: K, the adaptive maximum, the tree's depth, or the level above a
        lookup's (the drafter model's N_1, or the lookup's copies when the target verifies them),
        a middle exit's N_d; 1 for plain."""
        if self.middle is not None:
            return self.middle.draft
        if self.lookup is not None:
            return self.lookup.model_buffer or self.lookup.copies
        if self.fixed is not None:
            return self.fixed
        if self.adaptive is not None:
            return self.adaptive.max_length
        return self.tree.depth if self.tree is not None else 1

    @property
    def label(self) -> str:
        if self.plain:
            return "plain"
        if self.fixed is not None:
            return f"fixed {self.fixed}"
        if self.lookup is not None:
            return self.lookup.label
        if self.middle is not None:
            return self.middle.label
        return self.draft_length if self.adaptive is not None else f"tree {self.tree_text}"

    def levels(self, drafter: LevelSpec | None) -> tuple[LevelSpec, ...]:
        """The hierarchy this shape runs, cheapest first: the lookup (if any), ``drafter`` with its
        buffer replaced by the shape's (if it runs; None is allowed where it does not), the middle
        exit (if any), the target."""
        levels: tuple[LevelSpec, ...] = (LevelSpec(LevelKind.TARGET),)
        if self.middle is not None:
            levels = (LevelSpec(LevelKind.EXIT, buffer=self.middle.buffer, layer=self.middle.layer), *levels)
        if self.uses_drafter:
            levels = (dataclasses.replace(drafter, buffer=self.buffer), *levels)
        if self.lookup is not None:
            levels = (LevelSpec(LevelKind.LOOKUP, buffer=self.lookup.copies, ngram=self.lookup.ngram), *levels)
        return levels

    @property
    def longest(self) -> int:
        """The most positions past the round's start its replay reads."""
        if self.lookup is not None:
            return self.lookup.longest
        if self.middle is not None:
            return self.middle.longest
        return self.tree.depth if self.tree is not None else (self.buffer if not self.plain else 0)


@dataclass(frozen=True)
class RoundPrediction:
    """One candidate's predicted behaviour.

    Fields:
        shape, costs: the draft shape and the setting's measured costs.
        seconds_per_token: predicted time per emitted token.
        tokens_per_round: emitted tokens per target round (1 for plain decoding).
        drafted_per_round: drafter tokens per round (tree: kept nodes).
        prefill_seconds: the mean prompt's prefill, included in ``seconds_per_token`` (0 when the
            costs timed none).
    """

    shape: RoundShape
    costs: RoundCosts
    seconds_per_token: float
    tokens_per_round: float
    drafted_per_round: float
    prefill_seconds: float = 0.0

    @property
    def label(self) -> str:
        return f"{self.shape.label} ({self.costs.setting.label})"


def lookup_candidates(text: str | None, separate_drafter: bool, name: str = "--lookups") -> list[LookupShape]:
    """The lookup candidates of a comma list ``n:K,n:N_d:N_1`` (None: ``DEFAULT_LOOKUPS``, only
    ``n:K`` ones without a separate drafter model, which ``n:N_d:N_1`` needs: refused, naming
    ``name``)."""
    if text is None:
        return [s for s in DEFAULT_LOOKUPS if separate_drafter or not s.uses_model]
    lookups = [LookupShape.parse(part.strip(), name) for part in text.split(",") if part.strip()]
    if not separate_drafter and any(s.uses_model for s in lookups):
        raise ValueError(f"{name}: n:N_d:N_1 needs a separate drafter model (model:<name>), got {text!r}")
    return lookups


def middle_candidates(text: str | None, separate_drafter: bool, name: str = "--middles") -> list[MiddleShape]:
    """The middle-exit candidates of a comma list ``L:N_d:N_1`` (None or '': none; they need a
    separate drafter model: refused otherwise, naming ``name``)."""
    middles = [MiddleShape.parse(part.strip(), name) for part in (text or "").split(",") if part.strip()]
    if middles and not separate_drafter:
        raise ValueError(f"{name}: an exit between the drafter and the target needs a separate drafter model "
                         f"(model:<name>), got {text!r}")
    return middles


def candidate_shapes(
    fixed: Sequence[int] = DEFAULT_FIXED,
    adaptive: Sequence[str] = DEFAULT_ADAPTIVE,
    trees: Sequence[tuple[int, int, int]] = DEFAULT_TREES,
    lookups: Sequence[LookupShape] = (),
    middles: Sequence[MiddleShape] = (),
) -> list[RoundShape]:
    """Plain decoding and every given shape. Trees that ``spine_wide`` cannot fill, adaptive
    thresholds outside ``replay.STOP_THRESHOLDS`` and lookups of different n-grams (one recording
    serves them) raise ``ValueError`` naming them."""
    shapes = [RoundShape()]
    shapes += [RoundShape(fixed=k) for k in fixed]
    for text in adaptive:
        rule = parse_draft_length(text, name="adaptive candidate")
        if not rule.adaptive or rule.threshold not in STOP_THRESHOLDS:
            raise ValueError(f"adaptive candidate {text!r}: needs adaptive:<threshold>:<max> with a threshold "
                             f"in {STOP_THRESHOLDS}")
        shapes.append(RoundShape(adaptive=rule))
    rule = LEVEL_RULES[DEFAULT_LEVEL_RULE]
    for depth, topk, nodes in trees:
        cfg = TreeShape(depth, topk, nodes)
        if cfg.budget > min(cfg.pool, rule.capacity(cfg)):
            raise ValueError(f"tree candidate {depth}:{topk}:{nodes} does not fit rule {DEFAULT_LEVEL_RULE!r}")
        shapes.append(RoundShape(tree=cfg))
    if len({shape.ngram for shape in lookups}) > 1:
        raise ValueError(f"lookup candidates must share one n-gram, got {sorted({s.ngram for s in lookups})}")
    shapes += [RoundShape(lookup=shape) for shape in lookups]
    shapes += [RoundShape(middle=shape) for shape in middles]
    return shapes


def replay(shape: RoundShape, records: list[AcceptanceRecord], new_tokens: int) -> ReplayStats:
    """The shape's rounds over the records (plain decoding: one target call per token)."""
    if shape.plain:
        tokens = float(new_tokens * len(records))
        return ReplayStats(tokens, tokens, 0.0, {}, {1: tokens})
    if shape.tree is not None:
        return replay_tree(records, new_tokens, shape.tree)
    if shape.lookup is not None:
        return replay_lookup(records, new_tokens, shape.lookup)
    if shape.middle is not None:
        return replay_middle(records, new_tokens, shape.middle)
    rule = shape.adaptive or DraftLengthRule()
    return replay_chain(records, new_tokens, rule, shape.fixed or 1)


def predict(shape: RoundShape, costs: RoundCosts, records: list[AcceptanceRecord], new_tokens: int,
            prompt_lengths: Sequence[int] = ()) -> RoundPrediction:
    """The shape's predicted speed under ``costs``: its rounds replayed over ``records`` for
    ``new_tokens`` tokens each, and each record's prompt prefilled once, at the mean prefill of
    ``prompt_lengths`` (none: no prefill; they may be other prompts' than the records', e.g. the
    prompts a benchmark measures)."""
    stats = replay(shape, records, new_tokens)
    seconds = costs.round_seconds(stats.drafter_calls, stats.target_calls, stats.drafted, stats.lookups,
                                  stats.middle_calls, shape.middle.layer if shape.middle is not None else None)
    if shape.plain:
        seconds += stats.tokens * costs.sample_seconds
    if shape.tree is not None:
        seconds += stats.rounds * costs.tree(shape.tree)
    prefill = (sum(costs.prefill(n, shape.uses_drafter) for n in prompt_lengths) / len(prompt_lengths)
               if prompt_lengths else 0.0)
    seconds += len(records) * prefill
    return RoundPrediction(shape, costs, seconds / stats.tokens, stats.tokens_per_round,
                           stats.drafted / stats.rounds, prefill)


def rank_candidates(
    shapes: Sequence[RoundShape], costs: Sequence[RoundCosts], records: Mapping[str, list[AcceptanceRecord]],
    new_tokens: int, prompt_lengths: Sequence[int] = (),
) -> list[RoundPrediction]:
    """Every (shape, setting) pair, fastest first (``predict``); a setting's candidates replay the
    records of its drafter precision (``records``: precision -> one record per prompt)."""
    for cost in costs:
        if not records.get(cost.setting.drafter_precision):
            raise ValueError(f"records: none for drafter precision {cost.setting.drafter_precision!r}")
    # Plain decoding and copies the target verifies do not run the drafter: one candidate per
    # threads and kernel path (priced with the first setting that has them).
    first = {}
    for cost in costs:
        first.setdefault((cost.setting.threads, cost.setting.kernel_path), cost)
    out = [predict(shape, cost, records[cost.setting.drafter_precision], new_tokens, prompt_lengths) for cost in costs
           for shape in shapes
           if shape.uses_drafter or first[(cost.setting.threads, cost.setting.kernel_path)] is cost]
    return sorted(out, key=lambda p: p.seconds_per_token)


def best_plain(predictions: Sequence[RoundPrediction]) -> RoundPrediction:
    """The fastest plain-decoding candidate."""
    return min((p for p in predictions if p.shape.plain), key=lambda p: p.seconds_per_token)


@dataclass(frozen=True)
class RoundPlan:
    """A round planner run: what was measured and the candidates ranked.

    Fields:
        records: per drafter precision, one ``AcceptanceRecord`` per planning prompt.
        costs: ``RoundCosts`` per measured setting.
        ranked: every (shape, setting), fastest predicted first (``rank_candidates``).
    """

    records: Mapping[str, list[AcceptanceRecord]]
    costs: list[RoundCosts]
    ranked: list[RoundPrediction]

    @property
    def best(self) -> RoundPrediction:
        return self.ranked[0]

    @property
    def plain(self) -> RoundPrediction:
        return best_plain(self.ranked)

    def planned_hierarchy(self, drafter: LevelSpec) -> PlannedHierarchy:
        """The best candidate as a plan-file hierarchy with its knobs (``drafter``: the drafter
        level, its buffer replaced by the shape's); plain decoding: ``target`` alone; a lookup
        shape: the lookup, the drafter above it if it verifies the copies, the target. The
        predicted speed-up is against the best plain decoding setting."""
        best, shape, setting = self.best, self.best.shape, self.best.costs.setting
        knobs = RunKnobs(threads=setting.threads, kernel_path=setting.kernel_path)
        if not shape.plain:
            knobs = dataclasses.replace(knobs, draft_length=shape.draft_rule,
                                        tree=shape.tree if shape.tree is not None else CHAINS,
                                        drafter_precision=setting.drafter_precision if shape.uses_drafter else None)
        return PlannedHierarchy(
            shape.levels(drafter), predicted_speedup=self.plain.seconds_per_token / best.seconds_per_token,
            predicted_seconds_per_token=best.seconds_per_token, knobs=knobs)

    def as_dict(self) -> dict:
        """The measured costs and every candidate's prediction (JSON-ready)."""
        return {"costs": [c.as_dict() for c in self.costs],
                "candidates": [{"shape": p.shape.label, "threads": p.costs.setting.threads,
                                "kernel_path": p.costs.setting.kernel_path,
                                "drafter_precision": p.costs.setting.drafter_precision,
                                "predicted_ms_per_token": p.seconds_per_token * 1e3,
                                "predicted_tokens_per_round": p.tokens_per_round} for p in self.ranked]}


def plan_rounds(
    target: CausalLM,
    drafter: DrafterSpec,
    prompts: Sequence[list[int]],
    params: SamplingParams,
    new_tokens: int,
    shapes: Sequence[RoundShape],
    settings: Sequence[KernelSetting],
    progress: Callable[[str], None] | None = None,
    middle_heads: Mapping[int, torch.nn.Module] | None = None,
) -> RoundPlan:
    """Record acceptance on ``prompts``, time the calls under every setting, rank every candidate
    for generations of ``new_tokens`` tokens. ``middle_heads``: the exit heads of middle-exit
    shapes (``{layer: head}``; a layer without one runs the logit lens), as the runtime's
    ``exit_heads``."""
    if new_tokens < 1:
        raise ValueError(f"new_tokens must be >= 1, got {new_tokens}")
    say = progress or (lambda text: None)
    longest = max(shape.longest for shape in shapes)
    lookups = [shape.lookup for shape in shapes if shape.lookup is not None]
    lookup = (lookups[0].ngram, max(s.copies for s in lookups)) if lookups else None
    if lookups and drafter.model is None and any(s.uses_model for s in lookups):
        raise ValueError("shapes: a lookup verified by the drafter needs a separate drafter model (model:<name>)")
    middle_layers = sorted({shape.middle.layer for shape in shapes if shape.middle is not None})
    if middle_layers and drafter.model is None:
        raise ValueError("shapes: an exit between the drafter and the target needs a separate drafter model "
                         "(model:<name>)")
    say(f"recording {len(prompts)} continuations of {new_tokens + longest} tokens")
    precisions = tuple(dict.fromkeys(s.drafter_precision for s in settings))
    records = record_acceptance(target, drafter, prompts, params, new_tokens + longest, drafter_precisions=precisions,
                                lookup=lookup, middle_layers=middle_layers, middle_heads=middle_heads)
    lengths = [len(p) for p in prompts]
    mean = int(sum(lengths) / len(lengths))
    # Prefill timed at half the mean prompt and at the longest: two cold forwards per model and
    # kernels, a line between them.
    prefill_lengths = sorted({max(1, mean // 2), max(lengths)})
    costs = measure_round_costs(target, drafter, settings, params, context_len=mean + new_tokens // 2,
                                progress=lambda label: say(f"timing calls: {label}"),
                                lookup_ngram=lookup[0] if lookup else None, prefill_lengths=prefill_lengths,
                                middle_layers=middle_layers, middle_heads=middle_heads,
                                trees=[shape.tree for shape in shapes if shape.tree is not None])
    return RoundPlan(records, costs, rank_candidates(shapes, costs, records, new_tokens, lengths))
