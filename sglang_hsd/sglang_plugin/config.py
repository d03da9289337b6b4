"""Plugin configuration: which chain verifier HSD runs and the exit level, read from the environment.

SGLang's ``ServerArgs`` is a closed dataclass that is pickled to every scheduler process, so a
plugin cannot add a field to it. ``register()`` does add ``--hsd-verify-method`` to the launcher's
argument parser (``ServerArgs.add_cli_args`` is wrapped); the flag's action stores the value in the
``SGLANG_HSD_VERIFY_METHOD`` environment variable, which every process SGLang spawns inherits.
Setting the variable directly works too (e.g. for ``sglang.Engine`` in Python).

The server runs only lossless verifiers: chain rules (``sglang_hsd.verify.LOSSLESS_CHAIN_METHODS``)
for topk = 1, tree rules paired with ``--hsd-tree-draft`` (``TREE_DRAFTS``) for topk > 1.
A ``--hsd-plan`` file is read by ``sglang_hsd.runtime.plan_file``; the server takes its one
intermediate exit level (layer and buffer) and nothing else. Its runtime knobs (``RunKnobs``:
draft length, tree, threads, kernel path, drafter precision) are the runtime's; the server has
its own flags for those jobs, so a plan carrying any knob is refused (``plan_knob_refusals``,
naming the flag to set) rather than half applied. The flags are described in
docs/sglang_plugin.md.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sglang_hsd.levels import DEFAULT_CHAIN_METHOD
from sglang_hsd.verify import LOSSLESS_CHAIN_METHODS
from sglang_hsd.tree_draft import DEFAULT_LEVEL_RULE, LOSSLESS_LEVEL_RULES

if TYPE_CHECKING:  # imported where a plan is read: the knobs' module imports the runtime's kernels
    from sglang_hsd.runtime.plan_file import RunKnobs

VERIFY_METHOD_ENV = "SGLANG_HSD_VERIFY_METHOD"
VALIDATE_ENV = "SGLANG_HSD_VALIDATE"
ALGORITHM_NAME = "HSD"
# The values of an on/off --hsd-* switch.
ON_OFF = ("on", "off")
# Defaults when the user gives none of steps / topk / draft tokens: a 4-token chain.
DEFAULT_NUM_STEPS = 4
DEFAULT_TOPK = 1


TREE_DRAFT_ENV = "SGLANG_HSD_TREE_DRAFT"
# --hsd-tree-draft -> (tree verify methods it may be paired with, default method). "sampled":
# children drawn without replacement from the drafter's real q (lossless with a verifier that
# reads q); "argmax-first": a node's first child is q's argmax (the stock tree's top-1 child), the
# later ones drawn without replacement from q without it, verified with each child's own proposal
# (one-hot for the first); "topk": SGLang's stock deterministic top-k drafting, whose lossless
# verifier treats the nodes as one-hot (SGLang's own tree sampler).
TREE_DRAFTS = {"sampled": (("hsd", "rrs"), "hsd"), "argmax-first": (("hsd", "rrs"), "hsd"),
               "topk": (("target-only",), "target-only")}
DEFAULT_TREE_DRAFT = "sampled"
# The tree drafts the level-synchronous drafter runs -> its child sampler (``tree_draft.CHILD_SAMPLERS``).
TREE_DRAFT_SAMPLERS = {"sampled": "inverse_cdf", "argmax-first": "argmax_first_cdf"}
DRAFT_TEMPERATURE_SCALE_ENV = "SGLANG_HSD_DRAFT_TEMPERATURE_SCALE"
TREE_RULE_ENV = "SGLANG_HSD_TREE_RULE"
# what --hsd-verify-method accepts at all: the chain rules and the tree rules above
VERIFY_METHOD_CHOICES = tuple(LOSSLESS_CHAIN_METHODS) + tuple(
    sorted({m for methods, _ in TREE_DRAFTS.values() for m in methods} - set(LOSSLESS_CHAIN_METHODS)))


@dataclass(frozen=True)
class PluginConfig:
    """Fields:
        verify_method: verifier for sampled requests: a chain rule (``LOSSLESS_CHAIN_METHODS``)
            when topk = 1, a tree rule (``TREE_METHODS`` key allowed for ``tree_draft``) otherwise.
        validate: check verifier inputs on every step (slow; for debugging).
        topk: --speculative-eagle-topk (1 = chains).
        tree_draft: how trees are drafted (a key of ``TREE_DRAFTS``); unused for chains.
        tree_rule: expansion rule of sampled trees, a lossless key of
            ``sglang_hsd.tree_draft.LEVEL_RULES`` (``--hsd-tree-rule``).
        draft_temperature_scale: S > 0; sampled trees draw children from (and verify with) the
            drafter's distribution at temperature T * S instead of the request's T. Any S keeps
            the output law (the verifier reads the q the children were drawn from); S < 1
            sharpens a drafter flatter than the target (docs/verification.md, "Draft
            temperature").
    """

    verify_method: str = DEFAULT_CHAIN_METHOD
    validate: bool = False
    topk: int = 1
    tree_draft: str = DEFAULT_TREE_DRAFT
    draft_temperature_scale: float = 1.0
    tree_rule: str = DEFAULT_LEVEL_RULE

    @property
    def is_tree(self) -> bool:
        return self.topk > 1

    @property
    def sampled_tree(self) -> bool:
        """Trees drafted by the level-synchronous drafter (``--hsd-tree-draft`` sampled or argmax-first)."""
        return self.is_tree and self.tree_draft in TREE_DRAFT_SAMPLERS

    @property
    def child_sampler(self) -> str:
        """The drafter's child sampler for ``tree_draft`` (a key of ``tree_draft.CHILD_SAMPLERS``)."""
        return TREE_DRAFT_SAMPLERS.get(self.tree_draft, TREE_DRAFT_SAMPLERS[DEFAULT_TREE_DRAFT])

    @classmethod
    def from_env(cls, topk: int = 1) -> "PluginConfig":
        """Read ``--hsd-verify-method`` / ``--hsd-tree-draft`` for a server with ``topk`` beams.

        Raises ValueError naming the flags for a method the shape cannot run (a chain rule that
        is not lossless; a tree method not paired with the tree draft)."""
        validate = os.environ.get(VALIDATE_ENV, "0") == "1"
        method = os.environ.get(VERIFY_METHOD_ENV, "").strip().lower()
        draft = os.environ.get(TREE_DRAFT_ENV, "").strip().lower()
        scale = _draft_temperature_scale(os.environ.get(DRAFT_TEMPERATURE_SCALE_ENV, ""))
        rule = os.environ.get(TREE_RULE_ENV, "").strip().lower()
        if rule and rule not in LOSSLESS_LEVEL_RULES:
            raise ValueError(f"--hsd-tree-rule ({TREE_RULE_ENV}) must be one of "
                             f"{LOSSLESS_LEVEL_RULES} (the lossless rules), got {rule!r}")
        sampled_tree = topk > 1 and (draft or DEFAULT_TREE_DRAFT) in TREE_DRAFT_SAMPLERS
        for flag, env, given in (("--hsd-tree-rule", TREE_RULE_ENV, rule or None),
                                 ("--hsd-draft-temperature-scale", DRAFT_TEMPERATURE_SCALE_ENV,
                                  f"{scale:g}" if scale != 1.0 else None)):
            if given is not None and not sampled_tree:
                raise ValueError(
                    f"{flag} ({env}) {given} applies to sampled trees only (--speculative-eagle-"
                    f"topk > 1, --hsd-tree-draft sampled or argmax-first); got --speculative-eagle-topk {topk}"
                    + (f", --hsd-tree-draft {draft}" if draft else ""))
        if topk <= 1:
            if draft:
                raise ValueError(f"--hsd-tree-draft ({TREE_DRAFT_ENV}) {draft!r} needs "
                                 "--speculative-eagle-topk > 1 (a tree); remove it for chains")
            method = method or DEFAULT_CHAIN_METHOD
            if method not in LOSSLESS_CHAIN_METHODS:
                raise ValueError(
                    f"--hsd-verify-method ({VERIFY_METHOD_ENV}) {method!r} with a chain "
                    f"(--speculative-eagle-topk {topk}): not a lossless chain verifier; use one "
                    f"of {tuple(LOSSLESS_CHAIN_METHODS)}, or a tree (--speculative-eagle-topk > 1)")
            return cls(verify_method=method, validate=validate)
        draft = draft or DEFAULT_TREE_DRAFT
        if draft not in TREE_DRAFTS:
            raise ValueError(f"--hsd-tree-draft ({TREE_DRAFT_ENV}) must be one of "
                             f"{tuple(TREE_DRAFTS)}, got {draft!r}")
        allowed, default = TREE_DRAFTS[draft]
        method = method or default
        if method not in allowed:
            raise ValueError(
                f"--hsd-verify-method {method!r} with --hsd-tree-draft {draft!r} "
                f"(--speculative-eagle-topk {topk}): this tree draft is verified losslessly by "
                f"{allowed} only")
        return cls(verify_method=method, validate=validate, topk=topk, tree_draft=draft,
                   draft_temperature_scale=scale, tree_rule=rule or DEFAULT_LEVEL_RULE)


def on_off_from_env(env: str, flag: str) -> str | None:
    """The value of the on/off switch ``flag`` stored in ``env``: "on", "off", or None when
    the user did not set it. Raises ValueError naming the flag for anything else."""
    text = os.environ.get(env, "").strip().lower()
    if not text:
        return None
    if text not in ON_OFF:
        raise ValueError(f"{flag} ({env}) must be one of {', '.join(ON_OFF)}, got {text!r}")
    return text


def _draft_temperature_scale(text: str) -> float:
    """``--hsd-draft-temperature-scale``: a positive finite float (empty: 1)."""
    if not text.strip():
        return 1.0
    try:
        scale = float(text)
    except ValueError:
        scale = float("nan")
    if not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"--hsd-draft-temperature-scale ({DRAFT_TEMPERATURE_SCALE_ENV}) must be "
                         f"a positive finite number, got {text!r}")
    return scale


EXIT_LAYER_ENV = "SGLANG_HSD_EXIT_LAYER"
EXIT_HEADS_ENV = "SGLANG_HSD_EXIT_HEADS"
EXIT_METHOD_ENV = "SGLANG_HSD_EXIT_METHOD"
EXIT_BUFFER_ENV = "SGLANG_HSD_EXIT_BUFFER"
PLAN_ENV = "SGLANG_HSD_PLAN"
CHECK_SPLIT_ENV = "SGLANG_HSD_CHECK_SPLIT"


class ExitLevelConfigError(ValueError):
    """A bad exit-level option; the message names the flag (and its environment variable)."""


@dataclass(frozen=True)
class ExitLevelConfig:
    """The intermediate early-exit verifier level (``--hsd-exit-layer`` and friends).

    Fields:
        layer: exit layer L (the target's first L layers plus an exit head verify the drafts);
            None = no exit level (two levels: EAGLE-3 drafts, full target).
        heads_dir: folder of trained exit heads (the format of ``sglang_hsd.runtime.exit_heads``) or
            None for the logit lens (the target's final norm and LM head applied at layer L).
        method: chain rule of the exit level (one of ``LOSSLESS_CHAIN_METHODS``); the target
            level uses ``PluginConfig.verify_method``.
        buffer: N_i, provisional tokens the exit level accumulates before the target verifies
            them: exit sub-rounds (draft, exit-verify) repeat inside one verify window while
            fewer than N_i tokens are provisional and the window has room for another draft
            (so N_i is capped by the window, --speculative-num-steps + 1). 1 = one exit
            sub-round per round.
        check_split: self-test: also run SGLang's full verify forward each round and log the
            largest target-logit difference of the split forward (doubles the target's cost).
    """

    layer: int | None = None
    heads_dir: str | None = None
    method: str = DEFAULT_CHAIN_METHOD
    check_split: bool = False
    buffer: int = 1

    @property
    def enabled(self) -> bool:
        return self.layer is not None

    @classmethod
    def from_env(cls, default_method: str = DEFAULT_CHAIN_METHOD) -> "ExitLevelConfig":
        layer_text = os.environ.get(EXIT_LAYER_ENV, "").strip()
        plan = os.environ.get(PLAN_ENV, "").strip()
        if plan:
            if layer_text:
                raise ExitLevelConfigError(
                    f"give either --hsd-plan ({PLAN_ENV}) or --hsd-exit-layer ({EXIT_LAYER_ENV}), "
                    "not both")
            plan_layer, plan_buffer = exit_level_from_plan(plan)
            layer_text = str(plan_layer or "")
        layer = None
        if layer_text:
            try:
                layer = int(layer_text)
            except ValueError:
                raise ExitLevelConfigError(
                    f"--hsd-exit-layer ({EXIT_LAYER_ENV}) must be an integer, got {layer_text!r}"
                ) from None
            if layer < 1:
                raise ExitLevelConfigError(f"--hsd-exit-layer must be >= 1, got {layer}")
        heads = os.environ.get(EXIT_HEADS_ENV, "none").strip()
        heads_dir = None if heads.lower() in ("", "none") else heads
        if heads_dir is not None and layer is None:
            raise ExitLevelConfigError(
                f"--hsd-exit-heads ({EXIT_HEADS_ENV}) needs --hsd-exit-layer (or --hsd-plan)")
        if heads_dir is not None and not os.path.isdir(heads_dir):
            raise ExitLevelConfigError(f"--hsd-exit-heads {heads_dir}: not a directory")
        method = os.environ.get(EXIT_METHOD_ENV, default_method).strip().lower()
        if method not in LOSSLESS_CHAIN_METHODS:
            raise ExitLevelConfigError(
                f"--hsd-exit-method ({EXIT_METHOD_ENV}) {method!r} is not a lossless chain "
                f"verifier; use one of {tuple(LOSSLESS_CHAIN_METHODS)}")
        buffer = _exit_buffer(plan_buffer if plan else None, layer)
        return cls(layer, heads_dir, method, os.environ.get(CHECK_SPLIT_ENV, "0") == "1", buffer)

    def check_depth(self, num_layers: int) -> None:
        """Raise unless the exit layer lies strictly inside a target of ``num_layers`` layers."""
        if self.layer is not None and not 1 <= self.layer < num_layers:
            raise ExitLevelConfigError(
                f"--hsd-exit-layer {self.layer}: the target has {num_layers} layers, so the exit "
                f"layer must be in [1, {num_layers - 1}]")

    def check_window(self, num_draft_tokens: int) -> None:
        """Raise unless N_i fits the verify window of ``num_draft_tokens`` (= K + 1) positions."""
        if self.enabled and self.buffer > num_draft_tokens:
            raise ExitLevelConfigError(
                f"--hsd-exit-buffer {self.buffer} (or the --hsd-plan buffer): one verify window "
                f"holds at most {num_draft_tokens} provisional tokens (--speculative-num-steps + "
                "1); lower it or raise --speculative-num-steps")


def _exit_buffer(from_plan: int | None, layer: int | None) -> int:
    """N_i from ``--hsd-exit-buffer`` (which wins) or the plan; 1 by default."""
    text = os.environ.get(EXIT_BUFFER_ENV, "").strip()
    if not text:
        return from_plan or 1
    try:
        buffer = int(text)
    except ValueError:
        raise ExitLevelConfigError(
            f"--hsd-exit-buffer ({EXIT_BUFFER_ENV}) must be an integer, got {text!r}") from None
    if buffer < 1:
        raise ExitLevelConfigError(f"--hsd-exit-buffer must be >= 1, got {buffer}")
    if layer is None:
        raise ExitLevelConfigError(
            f"--hsd-exit-buffer ({EXIT_BUFFER_ENV}) needs --hsd-exit-layer (or --hsd-plan)")
    return buffer


def _plan_hierarchy(path: str):
    """The chosen hierarchy (``PlannedHierarchy``) of a ``sglang-hsd plan`` file the server can
    run: no runtime knobs (``plan_knob_refusals``), and a lookup level only as the drafter of
    the server's draft model (``lookup:N,model:...,target``)."""
    from sglang_hsd.levels import LevelKind
    from sglang_hsd.runtime.plan_file import PlanFile

    if not os.path.isfile(path):
        raise ExitLevelConfigError(f"--hsd-plan {path}: no such file")
    try:
        best = PlanFile.read(path).best
    except ValueError as err:
        raise ExitLevelConfigError(f"--hsd-plan {err}") from None
    kinds = [level.kind for level in best.levels]
    if LevelKind.LOOKUP in kinds and kinds != [LevelKind.LOOKUP, LevelKind.MODEL, LevelKind.TARGET]:
        raise ExitLevelConfigError(
            f"--hsd-plan {path}: levels {best.level_names!r}: the server runs a lookup level only below "
            "its draft model (lookup:N,model:<draft>,target, with --hsd-draft-kind model); run this plan "
            "with `sglang-hsd generate --plan`")
    refusals = plan_knob_refusals(path, best.knobs)
    if refusals:
        raise ExitLevelConfigError("\n".join(refusals))
    return best


def lookup_from_plan(path: str) -> tuple[int, int, int] | None:
    """(longest n-gram, copies per lookup, the draft model's buffer) of a plan's lookup level
    (``lookup:N,model:...,target``, buffers ``copies,buffer``), or None without one."""
    from sglang_hsd.levels import LevelKind

    best = _plan_hierarchy(path)
    lookup = best.levels[0]
    if lookup.kind is not LevelKind.LOOKUP:
        return None
    return lookup.ngram, lookup.buffer, best.levels[1].buffer


def exit_level_from_plan(path: str) -> tuple[int | None, int | None]:
    """(exit layer, its buffer N_i) of a ``sglang-hsd plan`` file ((None, None): no exit level).

    The plan's cheapest level is the drafter; in the server the EAGLE-3 head or draft model drafts
    instead (below a lookup level, ``lookup_from_plan``), so only the levels between drafter and
    target matter. The server runs one intermediate level.
    """
    from sglang_hsd.levels import LevelKind

    best = _plan_hierarchy(path)
    middle = best.levels[1:-1]
    if not middle or best.levels[0].kind is LevelKind.LOOKUP:
        return None, None
    if len(middle) > 1 or middle[0].kind is not LevelKind.EXIT:
        raise ExitLevelConfigError(
            f"--hsd-plan {path}: levels {best.level_names!r} have intermediate levels "
            f"{[level.name for level in middle]}; the server supports one intermediate exit level "
            "(exit:L between the drafter and the target)")
    return middle[0].layer, middle[0].buffer


def plan_knob_refusals(path: str, knobs: RunKnobs) -> list[str]:
    """One message per runtime knob the plan sets (``knobs``: its ``RunKnobs``), each naming the
    server's own setting for that job; [] for a plan without knobs.

    The server reads only the plan's exit level, so a knob it kept quiet about would be dropped
    while the user believes it applies.
    """
    from sglang_hsd.sglang_plugin.cpu.draft_copies import DRAFT_PRECISION_FLAG
    from sglang_hsd.sglang_plugin.cpu.linear_path import CPU_LINEAR_FLAG

    server_setting = {
        # adaptive_setting.ADAPTIVE_FLAG, spelled out: adaptive_setting imports this module
        "draft_length": "flags (--speculative-num-steps, --hsd-adaptive)",
        "tree": "flags (--speculative-eagle-topk / --speculative-num-draft-tokens)",
        "threads": "threads (SGLang binds them to cores with SGLANG_CPU_OMP_THREADS_BIND)",
        "kernel_path": f"flag ({CPU_LINEAR_FLAG})",
        "drafter_precision": f"flag ({DRAFT_PRECISION_FLAG})",
    }
    return [f"--hsd-plan {path}: knob {key!r} ({value}) is not applied by the server; set the server's "
            f"own {server_setting[key]} and remove it from the plan"
            for key, value in knobs.to_json().items()]
