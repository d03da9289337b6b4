"""Every SGLang symbol the plugin replaces is pinned (``signatures.EXPECTED_SIGNATURES``).

After the plugin registers (``install_patches``) and a worker's verify hooks are installed, every
SGLang module and class loaded in this process is walked: a module attribute or a class
attribute whose code lives in ``sglang_hsd`` (a replacement or a wrapper) must be a pinned
symbol, so a drift of SGLang's original is refused at registration instead of surfacing inside a
scheduler process. The same walk finds no replacement before the plugin registers.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import pytest

from tests.sglang_plugin.plugin_fixtures import plugin_loaded  # noqa: F401 (fixture)

pytestmark = pytest.mark.sglang

PACKAGE = Path(__file__).parents[2] / "sglang_hsd"


def _is_ours(obj) -> bool:
    """Whether ``obj`` (a function, a class or a descriptor around one) is code of ``sglang_hsd``."""
    obj = inspect.getattr_static(obj, "__func__", obj)  # staticmethod / classmethod
    if inspect.isclass(obj):
        return str(inspect.getattr_static(obj, "__module__", "")).startswith("sglang_hsd")
    if not inspect.isfunction(obj):  # lazy module proxies and the like answer any attribute
        return False
    return Path(obj.__code__.co_filename).resolve().is_relative_to(PACKAGE.resolve())


def replaced_symbols() -> set[str]:
    """Dotted paths of the SGLang module and class attributes that hold ``sglang_hsd`` code."""
    found = set()
    for name, module in list(sys.modules.items()):
        if not name.startswith("sglang.") or module is None:
            continue
        for attr, value in list(vars(module).items()):
            if _is_ours(value):
                found.add(f"{name}.{attr}")
            if inspect.isclass(value) and value.__module__ == name:  # SGLang's own classes
                found |= {f"{name}.{value.__qualname__}.{key}" for key, member in vars(value).items()
                          if _is_ours(member)}
    return found


def test_every_replaced_sglang_symbol_is_pinned(plugin_loaded):  # noqa: F811
    from sglang_hsd.sglang_plugin.config import PluginConfig
    from sglang_hsd.sglang_plugin.cpu.kernel_ops import SGL_KERNEL_CPU_OPS
    from sglang_hsd.sglang_plugin.signatures import EXPECTED_SIGNATURES, STAND_INS
    from sglang_hsd.sglang_plugin.worker_setup import install_hsd_hooks

    install_hsd_hooks(PluginConfig())  # what each HSD worker installs when it is built
    replaced = replaced_symbols()
    print(f"\n{len(replaced)} SGLang symbols hold sglang_hsd code:\n  " + "\n  ".join(sorted(replaced)))
    assert replaced, "the walk found nothing: it no longer sees the plugin's patches"
    # sgl_kernel's CPU ops, imported by SGLang's modules from the shim (some under an ``sgl_`` alias)
    kernel_ops = {path for path in replaced if path.rsplit(".", 1)[-1].removeprefix("sgl_") in SGL_KERNEL_CPU_OPS}
    assert sorted(replaced - set(EXPECTED_SIGNATURES) - set(STAND_INS) - kernel_ops) == []


def test_the_walk_sees_an_unpinned_replacement(plugin_loaded, monkeypatch):  # noqa: F811
    """The wrong variant: a replacement outside the pins and stand-ins is found by the walk."""
    from sglang.srt.managers import schedule_batch

    monkeypatch.setattr(schedule_batch.ScheduleBatch, "batch_size", _ours_in_package())
    assert "sglang.srt.managers.schedule_batch.ScheduleBatch.batch_size" in replaced_symbols()


def _ours_in_package():
    """A function whose code lives in ``sglang_hsd`` (compiled with a package file name)."""
    namespace: dict = {}
    exec(compile("def batch_size(self):\n    return 0\n", str(PACKAGE / "stand_in.py"), "exec"), namespace)
    return namespace["batch_size"]
