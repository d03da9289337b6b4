"""The level grammar (``sglang_hsd.levels``): round trips, typed kinds, methods checked
against the verifier registry, and errors that name the bad level or argument."""

import pytest

from sglang_hsd.levels import (
    DEFAULT_CHAIN_METHOD,
    LevelKind,
    LevelSpec,
    format_buffers,
    format_level_names,
    parse_buffers,
    parse_level_specs,
)
from sglang_hsd.verify import CHAIN_METHODS


@pytest.mark.parametrize("spec", [
    "target", "exit:8,target", "exit:8,exit:16,target", "model:smollm2-135m,target",
    "eagle3:/tmp/head,exit:16,target", "lookup:3,model:smollm2-135m,target", "lookup:2,target",
])
def test_names_round_trip(spec):
    levels = parse_level_specs(spec)
    assert format_level_names(levels) == spec
    assert levels[-1].kind is LevelKind.TARGET
    assert all(isinstance(level.kind, LevelKind) for level in levels)


def test_buffers_and_methods_land_on_their_levels():
    levels = parse_level_specs(" eagle3:/h , exit:16 ,target", buffers=[3, 4], methods=["tokenwise", "hsd"])
    assert [level.kind for level in levels] == [LevelKind.EAGLE3, LevelKind.EXIT, LevelKind.TARGET]
    assert (levels[0].model_path, levels[1].layer) == ("/h", 16)
    assert [level.buffer for level in levels[:-1]] == [3, 4]
    # The drafter verifies nothing: level i >= 1 takes methods[i - 1].
    assert [level.method for level in levels] == [DEFAULT_CHAIN_METHOD, "tokenwise", "hsd"]
    assert format_buffers(levels) == "3,4"
    one_method = parse_level_specs("exit:2,exit:4,target", methods=["tokenwise"])
    assert [level.method for level in one_method[1:]] == ["tokenwise", "tokenwise"]


def test_kinds_are_typed_and_compare_as_their_names():
    spec = LevelSpec("exit", layer=3)
    assert spec.kind is LevelKind.EXIT and spec.kind == "exit" and spec.name == "exit:3"
    assert LevelKind.EAGLE3.drafter_only and LevelKind.LOOKUP.drafter_only
    assert not LevelKind.EXIT.drafter_only and not LevelKind.TARGET.drafter_only
    assert not LevelKind.MODEL.drafter_only  # it may verify a lookup drafter
    assert LevelKind.MODEL.needs_path and not LevelKind.LOOKUP.needs_path
    lookup = parse_level_specs("lookup,target")[0]
    assert lookup.ngram == 3 and lookup.name == "lookup:3"


def test_every_registered_chain_method_is_accepted():
    for method in CHAIN_METHODS:
        assert parse_level_specs("exit:2,target", methods=[method])[1].method == method


@pytest.mark.parametrize("kwargs,says", [
    (dict(spec="eagle:2,target"), r"unknown level 'eagle:2'"),
    (dict(spec="exit:x,target"), r"level 'exit:x': expected exit:<layer index>"),
    (dict(spec="exit:0,target"), r"'exit' level needs a layer index >= 1"),
    (dict(spec="model:,target"), r"'model' level needs model_path"),
    (dict(spec="target:x"), r"unknown level 'target:x'"),
    (dict(spec=" , "), r"levels must name at least the target"),
    (dict(spec="exit:1,exit:2,target", buffers=[3]), r"--buffers needs 2 values"),
    (dict(spec="exit:1,exit:2,target", buffers=[3, 0]), r"buffer must be >= 1, got 0"),
    (dict(spec="exit:1,exit:2,target", methods=["hsd", "hsd", "hsd"]), r"--methods needs 1 or 2 values"),
    (dict(spec="exit:1,target", methods=["fast"]), r"method must be one of .*hsd.*, got 'fast'"),
])
def test_bad_levels_name_what_is_wrong(kwargs, says):
    with pytest.raises(ValueError, match=says):
        parse_level_specs(**kwargs)


def test_bad_kind_names_the_kinds():
    with pytest.raises(ValueError, match=r"level kind must be one of \['exit', 'model', 'eagle3', 'lookup', 'target'\]"):
        LevelSpec("draft")


def test_buffers_text():
    assert parse_buffers("3,5") == [3, 5]
    assert parse_buffers("") == []
    with pytest.raises(ValueError, match=r"--buffers must be comma-separated integers, got '3,a'"):
        parse_buffers("3,a")
    with pytest.raises(ValueError, match=r"^N_i must be"):
        parse_buffers("3,,4", name="N_i")
