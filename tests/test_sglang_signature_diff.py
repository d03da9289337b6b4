"""``scripts/sglang_signature_diff.py``: finds pinned SGLang symbols by parsing source, renders
their parameters the way ``inspect.signature`` does and reports OK / CHANGED / MISSING.

A tiny fake ``sglang`` tree in ``tmp_path`` covers the cases; the installed SGLang (when there is
one) must match every pin in ``EXPECTED_SIGNATURES``, which proves the rendering matches the pins'
format. Nothing of SGLang is imported.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "sglang_signature_diff.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("sglang_signature_diff", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


diff = _load_script()

FUNCTIONS = '''
def plain(a, b=1, *, c=None, **kwargs):
    pass

def every_kind(a, b=-1.5, /, c='x', *args, d, e=(1, 2), **kw):
    pass

def only_positional(a, /):
    pass
'''

FAKE_TREE = {
    "sglang/__init__.py": "",  # sglang/srt/ has no __init__.py: a namespace package, as on main
    "sglang/srt/ops.py": FUNCTIONS + '''
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from sglang.srt.nowhere import ghost

def _impl(x: int, *, y: "Tensor" = None) -> None:
    pass

alias = _impl
computed = make_function()
''',
    "sglang/srt/reexport.py":
        "from sglang.srt.ops import plain as plain2\nfrom .ops import only_positional\n",
    "sglang/srt/worker/__init__.py": '''
import functools

class Base:
    def shared(self, batch, *, flag=False):
        pass

class Worker(Base):
    def __init__(self, server_args, gpu_id):
        pass

    @classmethod
    def build(cls, config):
        pass

    @staticmethod
    def helper(x):
        pass

    class Inner:
        def method(self, item=None):
            pass

def wrapped(a):
    pass

wrapped = functools.lru_cache(wrapped)
''',
}

PINS = {
    "sglang.srt.ops.plain": "(a, b=1, *, c=None, **kwargs)",
    "sglang.srt.ops.every_kind": "(a, b=-1.5, /, c='x', *args, d, e=(1, 2), **kw)",
    "sglang.srt.ops.only_positional": "(a, /)",
    "sglang.srt.ops.alias": "(x, *, y=None)",
    "sglang.srt.reexport.plain2": "(a, b=1, *, c=None, **kwargs)",
    "sglang.srt.reexport.only_positional": "(a, /)",
    "sglang.srt.worker.Worker.__init__": "(self, server_args, gpu_id)",
    "sglang.srt.worker.Worker.build": "(config)",
    "sglang.srt.worker.Worker.helper": "(x)",
    "sglang.srt.worker.Worker.shared": "(self, batch, *, flag=False)",
    "sglang.srt.worker.Worker.Inner.method": "(self, item=None)",
    "sglang.srt.worker.Worker": "(server_args, gpu_id)",
    "sglang.srt.worker.wrapped": "(a)",
}


@pytest.fixture()
def fake_tree(tmp_path: Path):
    for relpath, text in FAKE_TREE.items():
        (tmp_path / relpath).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relpath).write_text(text)
    return diff.open_tree(tmp_path)


def _statuses(pins: dict[str, str], tree) -> dict[str, str]:
    return {r.path: r.status for r in diff.compare(pins, tree)}


def test_rendering_matches_inspect():
    namespace: dict = {}
    exec(FUNCTIONS, namespace)  # noqa: S102 - constant text above
    for node in ast.parse(FUNCTIONS).body:
        rendered = diff.format_signature(diff.parameters(node.args))
        assert rendered == str(inspect.signature(namespace[node.name]))


def test_matching_pins_are_ok(fake_tree):
    assert _statuses(PINS, fake_tree) == {path: "OK" for path in PINS}


def test_notes_say_how_a_symbol_was_reached(fake_tree):
    notes = {r.path: r.notes for r in diff.compare(PINS, fake_tree)}
    assert notes["sglang.srt.reexport.plain2"] == ["re-exported from sglang.srt.ops"]
    assert notes["sglang.srt.reexport.only_positional"] == ["re-exported from sglang.srt.ops"]
    assert notes["sglang.srt.ops.alias"] == ["assigned from _impl in sglang.srt.ops"]
    assert notes["sglang.srt.worker.Worker.shared"] == ["inherited from sglang.srt.worker.Base"]


@pytest.mark.parametrize("path, pin, expected", [
    ("sglang.srt.ops.plain", "(a, bee=1, *, c=None, **kwargs)", "- removed bee"),  # renamed
    ("sglang.srt.ops.plain", "(a, b=1, c=None, **kwargs)",
     "~ c: POSITIONAL_OR_KEYWORD -> KEYWORD_ONLY"),
    ("sglang.srt.ops.plain", "(a, b=2, *, c=None, **kwargs)", "~ b: default 2 -> 1"),
    ("sglang.srt.worker.Worker.build", "(cls, config)", "- removed cls"),
    ("sglang.srt.worker.Worker.Inner.method", "(self)", "+ added item=None"),
])
def test_changed_pins(fake_tree, path, pin, expected):
    (result,) = diff.compare({path: pin}, fake_tree)
    assert result.status == "CHANGED"
    assert any(line.startswith(expected) for line in result.details), result.details


@pytest.mark.parametrize("path, reason", [
    ("sglang.srt.gone.f", "no module sglang.srt.gone and no name gone in sglang.srt"),
    ("sglang.srt.gone.deeper.f", "no module sglang.srt.gone and no name gone in sglang.srt"),
    ("other.f", "no module file for any prefix of other.f"),
    ("sglang.srt.ops.nothing", "nothing is not defined in sglang.srt.ops"),
    ("sglang.srt.ops.ghost", "ghost is not defined"),  # only imported under TYPE_CHECKING
    ("sglang.srt.ops.computed", "bound by `computed = make_function()`"),
    ("sglang.srt.worker.Worker.absent", "absent is not defined in class Worker"),
    ("sglang.srt.ops.plain.attr", "not a class"),
])
def test_missing_pins(fake_tree, path, reason):
    (result,) = diff.compare({path: "(x)"}, fake_tree)
    assert result.status == "MISSING"
    assert reason in result.details[0]


def test_command_line_exit_status_and_summary(fake_tree, tmp_path):
    run = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True,
                         text=True, timeout=30)
    # The fake tree has none of the plugin's real pins: all reported, all missing.
    assert run.returncode == 1
    assert run.stdout.splitlines()[-1].endswith(f"0 OK, 0 CHANGED, {len(diff.load_pins())} MISSING")


def _installed_sglang_root() -> Path | None:
    spec = importlib.util.find_spec("sglang")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]).parent


@pytest.fixture()
def installed_tree():
    root = _installed_sglang_root()
    if root is None:
        pytest.skip("sglang is not installed")
    return diff.open_tree(root)


def test_installed_sglang_matches_every_pin(installed_tree):
    results = diff.compare(diff.load_pins(), installed_tree)
    assert len(results) > 50
    assert [line for r in results if r.status != "OK" for line in diff.format_result(r)] == []


def test_installed_sglang_reports_a_renamed_parameter(installed_tree):
    path = "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.__init__"
    pin = diff.load_pins()[path].replace("gpu_id", "gpu_index")
    (result,) = diff.compare({path: pin}, installed_tree)
    assert result.status == "CHANGED"
    assert "- removed gpu_index (POSITIONAL_OR_KEYWORD)" in result.details
    assert "+ added gpu_id (POSITIONAL_OR_KEYWORD)" in result.details
