"""Which server features compose: one declared table, and the front door's verdict on any mix.

A *feature* is one value of an *axis* (the draft shape, how draft lengths are chosen, the draft
cache's catch-up, ...), switched on by the SGLang flags ``sglang-hsd serve`` passes through
(after ``--``). The first feature of each axis is the default: no flags. Features of different
axes compose, except the pairs ``REFUSED`` lists, each with the reason the server gives; a
refused pair is refused before models load with an error naming a flag of each side.

``front_door_refusal`` runs what the server runs before it loads anything (serve's launch
command, SGLang's argument parsing and resolution with the HSD validation) in this process and
returns the refusal, or None. ``tests/sglang_plugin/test_feature_combinations.py`` checks the
table against it for every pair of features, and
``tests/sglang_plugin/test_feature_combinations_server.py`` serves a set of combinations that
covers every allowed pair (``pairwise_cover``).

Not on the table yet: an EAGLE-3 head as the drafter (another pair of models), trained exit
heads, ``--hsd-plan``, ``--hsd-tree-rule`` and the GPU-only paths (CUDA graphs, FlashInfer).
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Feature:
    """One value of an axis.

    Fields:
        axis: the axis it belongs to (a key of ``AXES``).
        name: unique over all axes, e.g. ``"stock tree"``.
        flags: the SGLang flags that switch it on (empty for the axis's default).
    """

    axis: str
    name: str
    flags: tuple[str, ...] = ()


def _axis(axis: str, *features: tuple[str, tuple[str, ...]]) -> tuple[Feature, ...]:
    return tuple(Feature(axis, name, flags) for name, flags in features)


_TREE = ("--speculative-num-steps", "3", "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "6")

# Axis -> its features, the default first. Shapes carry their steps so every feature of the
# other axes (a lengths cycle of depths <= 3, the exit layer 2 of the tiny target's 4) fits all.
AXES: dict[str, tuple[Feature, ...]] = {
    axis[0].axis: axis for axis in (
        _axis("shape", ("chain", ("--speculative-num-steps", "3", "--speculative-eagle-topk", "1")), ("sampled tree", _TREE),
              ("argmax-first tree", (*_TREE, "--hsd-tree-draft", "argmax-first")),
              ("stock tree", (*_TREE, "--hsd-tree-draft", "topk"))),
        _axis("verify", ("default verifier", ()), ("tokenwise", ("--hsd-verify-method", "tokenwise")),
              ("rrs", ("--hsd-verify-method", "rrs"))),
        _axis("lengths", ("adaptive", ()), ("fixed lengths", ("--hsd-adaptive", "off")),
              ("lengths cycle", ("--hsd-draft-lengths-cycle", "3,0,1,2"))),
        _axis("catch-up", ("catch-up default", ()), ("catch-up off", ("--hsd-draft-catch-up", "off")),
              ("window extend", ("--hsd-draft-extend", "window"))),
        _axis("lookup", ("no lookup", ()), ("lookup", ("--hsd-draft-lookup", "3"))),
        _axis("exit", ("no exit", ()), ("exit level", ("--hsd-exit-layer", "2", "--hsd-exit-heads", "none"))),
        _axis("seeds", ("seeds auto", ()), ("seeds on", ("--hsd-request-seeds", "on")),
              ("seeds off", ("--hsd-request-seeds", "off"))),
        _axis("precision", ("precision auto", ()), ("int8 draft", ("--hsd-draft-precision", "int8"))),
        _axis("forward", ("forward auto", ()), ("sglang forward", ("--hsd-draft-forward", "sglang"))),
        _axis("linear", ("linear default", ()), ("mkl linear", ("--hsd-cpu-linear", "mkl"))),
    )
}
FEATURES: dict[str, Feature] = {f.name: f for axis in AXES.values() for f in axis}
TREES = ("sampled tree", "argmax-first tree", "stock tree")

# Pairs the server refuses before models load, and why (the server's error says it in full).
REFUSED: dict[frozenset[str], str] = {
    **{frozenset({tree, "lookup"}): "the lookup level drafts chains" for tree in TREES},
    **{frozenset({tree, "exit level"}): "the exit level verifies chains only" for tree in TREES},
    **{frozenset({tree, "tokenwise"}): "tokenwise is a chain verifier" for tree in TREES},
    frozenset({"chain", "rrs"}): "rrs is a tree verifier",
    frozenset({"stock tree", "rrs"}): "the stock tree is verified by SGLang's target-only sampler",
    frozenset({"lookup", "exit level"}): "the server runs one intermediate level",
    frozenset({"lengths cycle", "exit level"}): "the exit level's verify window is fixed",
}


def refused(features) -> list[str]:
    """The reasons ``REFUSED`` gives for the pairs within ``features`` (names); [] when they compose."""
    return [REFUSED[frozenset(pair)] for pair in itertools.combinations(features, 2) if frozenset(pair) in REFUSED]


def flags_of(features) -> tuple[str, ...]:
    """The SGLang flags that switch on ``features`` (names), in the order given."""
    return tuple(word for name in features for word in FEATURES[name].flags)


def valid_combinations() -> list[tuple[str, ...]]:
    """Every combination of one feature per axis (names in ``AXES`` order) with no refused pair."""
    names = [[feature.name for feature in features] for features in AXES.values()]
    return [combination for combination in itertools.product(*names) if not refused(combination)]


def _pairs(combination) -> set[frozenset[str]]:
    return {frozenset(pair) for pair in itertools.combinations(combination, 2)}


def allowed_pairs() -> set[frozenset[str]]:
    """Every pair of features (of different axes) that some valid combination holds."""
    return set().union(*(_pairs(combination) for combination in valid_combinations()))


def pairwise_cover(accepts=lambda names: not refused(names)) -> list[tuple[str, ...]]:
    """Valid combinations that together hold every pair of ``allowed_pairs``, each accepted by
    ``accepts`` (default: no refused pair). Greedy: each next combination is the valid one that
    holds most pairs not yet covered (the first such in ``itertools.product`` order, so ties keep
    the defaults); deterministic (20 combinations for this table)."""
    candidates = [(combination, _pairs(combination)) for combination in valid_combinations()]
    uncovered = set().union(*(pairs for _, pairs in candidates))
    cover = []
    while uncovered:
        names, pairs = max(candidates, key=lambda candidate: len(candidate[1] & uncovered))
        if not accepts(names):
            raise ValueError(f"the combination {names} is refused by the server but not by the table")
        uncovered -= pairs
        cover.append(names)
    return cover


def markdown() -> str:
    """The table as ``docs/sglang_plugin.md`` shows it ("Which features compose"): the axes with
    their features and flags, then the refused pairs with their reasons."""
    lines = ["| axis | features (the first is the default) |", "|---|---|"]
    for axis, features in AXES.items():
        shown = [f"{f.name}" + (f" (`{' '.join(f.flags)}`)" if f.flags else "") for f in features]
        lines.append(f"| {axis} | {'; '.join(shown)} |")
    lines += ["", "| refused pair | why |", "|---|---|"]
    for pair, reason in REFUSED.items():
        a, b = sorted(pair, key=lambda name: list(FEATURES).index(name))
        lines.append(f"| {a} + {b} | {reason} |")
    pairs = two_feature_combinations()
    refused_count = sum(bool(refused(names)) for names in pairs)
    lines += ["", f"{len(pairs)} combinations of two features (the other axes at their defaults): "
              f"{len(pairs) - refused_count} compose, {refused_count} are refused. "
              f"{len(pairwise_cover())} combinations hold all {len(allowed_pairs())} pairs that some "
              "valid combination holds."]
    return "\n".join(lines) + "\n"


def with_defaults(*names: str) -> tuple[str, ...]:
    """``names`` (features of different axes) plus the default of every other axis, in ``AXES`` order."""
    chosen = {FEATURES[name].axis: name for name in names}
    return tuple(chosen.get(axis, features[0].name) for axis, features in AXES.items())


def two_feature_combinations() -> list[tuple[str, ...]]:
    """Every pair of features of different axes with the other axes at their defaults (a
    feature with the defaults alone included, as its pair with another axis's default)."""
    return sorted({with_defaults(x.name, y.name)
                   for (_, a), (_, b) in itertools.combinations(AXES.items(), 2)
                   for x, y in itertools.product(a, b)})


def front_door_refusal(flags: tuple[str, ...], target: str, draft: str) -> str | None:
    """What the server started by ``sglang-hsd serve --target target --draft draft -- flags``
    on CPU says before it loads a model: its refusal (the error's message), or None when it
    would go on to load. Runs serve's launch building and SGLang's argument parsing and
    resolution (which runs HSD's validation) in this process; the environment the HSD flags
    write is restored. Needs the plugin registered (``sglang.srt.plugins.load_plugins``)."""
    from sglang.srt.server_args import prepare_server_args

    from sglang_hsd.sglang_plugin.serve_launch import ServeConfig, ServeError, build_launch, resolve_models

    saved = dict(os.environ)
    try:
        config = ServeConfig(target=target, draft=draft, device="cpu", sglang_args=tuple(flags))
        launch = build_launch(config, resolve_models(config, fetch=None), "cpu")
        os.environ.update(launch.env)
        prepare_server_args(launch.command[3:]).resolve_once()
        return None
    except (ValueError, ServeError) as err:
        return str(err)
    finally:
        os.environ.clear()
        os.environ.update(saved)
