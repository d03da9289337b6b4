"""The compatibility table (``sglang_plugin/compatibility.py``) against the server's front door,
for every pair of features: a pair the table refuses is refused before models load with an error
naming a flag of each side; every other pair gets past the front door. Runs serve's launch
building and SGLang's argument resolution in this process on a tiny pair (no model loads)."""

from __future__ import annotations

import itertools

import pytest

from sglang_hsd.sglang_plugin.compatibility import (
    AXES, FEATURES, REFUSED, allowed_pairs, flags_of, front_door_refusal, pairwise_cover, refused,
    two_feature_combinations, with_defaults)
from tests.sglang_plugin.plugin_fixtures import plugin_loaded  # noqa: F401 (fixture)

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def pair(tmp_path_factory, plugin_loaded):  # noqa: F811
    from sglang_hsd.sglang_plugin.cpu.tiny_models import build_tiny_draft_pair

    target, draft = build_tiny_draft_pair(str(tmp_path_factory.mktemp("feature_combinations")))
    return target, draft


@pytest.fixture(autouse=True)
def eagle3_draft_kind():
    """Overrides ``plugin_fixtures``' fixture of that name: these tests serve a real draft model,
    whose kind the front door detects."""


def _flag_names(feature: str) -> list[str]:
    return [word for word in FEATURES[feature].flags if word.startswith("--")]


def _check(names: tuple[str, ...], pair) -> str | None:
    """None when the front door does what the table says for the combination ``names``, else
    what went wrong: a refusal the table does not declare, a declared one the server lets
    through, or a refusal that does not name a flag of each side of a refused pair."""
    refusal = front_door_refusal(flags_of(names), *pair)
    reasons = refused(names)
    if bool(reasons) != (refusal is not None):
        return f"table: {reasons or 'composes'}; server: {refusal or 'passes'}"
    for a, b in itertools.combinations(names, 2):
        if frozenset({a, b}) in REFUSED:
            for side in (a, b):
                if not any(flag in refusal for flag in _flag_names(side)):
                    return f"the refusal does not name {side!r} ({_flag_names(side)}): {refusal}"
    return None


def test_each_feature_with_the_defaults_is_served_or_refused_as_the_table_says(pair):
    wrong = {name: _check(with_defaults(name), pair) for name in FEATURES}
    assert {name: problem for name, problem in wrong.items() if problem} == {}


def test_every_pair_is_served_or_refused_naming_both_sides_as_the_table_says(pair):
    combinations = two_feature_combinations()
    wrong = {names: _check(names, pair) for names in combinations}
    wrong = {names: problem for names, problem in wrong.items() if problem}
    refused_count = sum(bool(refused(names)) for names in combinations)
    print(f"\n{len(combinations)} combinations (every pair of features, the other axes at their "
          f"defaults): {len(combinations) - refused_count} pass the front door, {refused_count} refused")
    assert wrong == {}


def test_every_declared_refusal_is_a_pair_of_features_of_different_axes():
    for pair in REFUSED:
        a, b = sorted(pair)
        assert a in FEATURES and b in FEATURES and FEATURES[a].axis != FEATURES[b].axis, pair


def test_the_pairwise_cover_covers_every_allowed_pair_and_no_refused_one():
    cover = pairwise_cover()
    covered = {frozenset(p) for names in cover for p in itertools.combinations(names, 2)}
    assert allowed_pairs() <= covered
    assert all(not refused(names) for names in cover)
    assert all(len(names) == len(AXES) for names in cover)
    print(f"\n{len(cover)} combinations cover {len(allowed_pairs())} allowed pairs")


def test_every_combination_of_the_cover_gets_past_the_front_door(pair):
    """The combinations the server test serves pass the front door whole (not only pairwise)."""
    cover = pairwise_cover(accepts=lambda names: front_door_refusal(flags_of(names), *pair) is None)
    assert cover == pairwise_cover()


def test_the_cover_rejects_a_combination_the_server_refuses():
    """The guard of ``pairwise_cover``: a combination its ``accepts`` refuses stops the cover."""
    with pytest.raises(ValueError, match="refused by the server but not by the table"):
        pairwise_cover(accepts=lambda names: "lookup" not in names)


def test_the_docs_show_the_table():
    from pathlib import Path

    from sglang_hsd.sglang_plugin.compatibility import markdown

    docs = (Path(__file__).parents[2] / "docs" / "sglang_plugin.md").read_text()
    block = docs.split("<!-- generated: compatibility.markdown() -->\n")[1].split("<!-- end generated -->")[0]
    assert block == markdown(), "regenerate the table in docs/sglang_plugin.md from compatibility.markdown()"
