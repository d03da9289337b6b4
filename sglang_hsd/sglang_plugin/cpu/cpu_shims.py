"""Stand-ins that let SGLang 0.5.23 run its speculative path on a CPU-only machine.

Two things are missing on a CPU box without SGLang's CUDA dependencies:

* ``torchvision``: the wheel SGLang pins is CUDA-only and absent here, yet
  ``sglang.srt.multimodal.internvl_utils`` imports it at module level on the way to the scheduler.
  ``install_torchvision_stub`` puts an import-only package in ``sys.modules`` whose attributes are
  placeholders that raise when used (only multimodal models ever use them).
* ``sgl_kernel``: SGLang's CPU path calls a few of its CPU ops. ``install_sgl_kernel_shim`` adds a
  module whose ops are the plain-torch implementations of ``kernel_ops.py``. SGLang imports its CPU ops at
  module level long before calling them, so every other name imports too, as a function that
  raises ``NotImplementedError`` naming the op when called.

Nothing is installed when the real package imports. This module must not import SGLang: it runs
before SGLang is imported (see ``_bootstrap/sitecustomize.py``).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

import torch

from sglang_hsd.sglang_plugin.cpu.kernel_ops import SGL_KERNEL_CPU_OPS, SGL_KERNEL_TORCH_OPS

SHIM_MARKER = "__sglang_hsd_shim__"


class _Placeholder:
    """Any torchvision object: importable, fails loudly when used."""

    def __init__(self, name: str):
        self._name = name

    def __call__(self, *args, **kwargs):
        raise RuntimeError(
            f"{self._name} comes from sglang-hsd's torchvision import stub (torchvision is not "
            "installed); install a CPU torchvision to use multimodal models"
        )

    def __getattr__(self, item: str):
        if item.startswith("__"):
            raise AttributeError(item)
        return _Placeholder(f"{self._name}.{item}")


class _StubModule(types.ModuleType):
    def __getattr__(self, item: str):
        if item.startswith("__"):
            raise AttributeError(item)
        return _Placeholder(f"{self.__name__}.{item}")


class _TorchvisionStubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves ``torchvision`` and every ``torchvision.*`` submodule as a stub package."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        module.__version__ = "0.0.0+sglang-hsd-stub"
        setattr(module, SHIM_MARKER, True)
        return module

    def exec_module(self, module):
        return None


def torchvision_works() -> bool:
    """True when a real torchvision imports (a broken CUDA wheel counts as absent)."""
    if "torchvision" in sys.modules:
        return not getattr(sys.modules["torchvision"], SHIM_MARKER, False)
    if importlib.util.find_spec("torchvision") is None:
        return False
    try:
        import torchvision  # noqa: F401
    except Exception:
        sys.modules.pop("torchvision", None)
        return False
    return True


def install_torchvision_stub() -> bool:
    """Install the stub unless a working torchvision exists. Returns True if installed."""
    if torchvision_works():
        return False
    if not any(isinstance(f, _TorchvisionStubFinder) for f in sys.meta_path):
        for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
            del sys.modules[name]
        sys.meta_path.insert(0, _TorchvisionStubFinder())
    return True


def _missing_op(name: str):
    def op(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name} was called, but sgl_kernel is not installed and sglang-hsd's CPU "
            f"shim only implements {sorted(SGL_KERNEL_CPU_OPS)}; add a torch version to "
            "sglang_hsd/sglang_plugin/cpu/cpu_shims.py"
        )

    op.__name__ = name
    setattr(op, SHIM_MARKER, True)
    return op


def _sgl_kernel_getattr(name: str):
    # SGLang imports CPU ops at module level (``if _is_cpu: from sgl_kernel import x``) long
    # before it calls them, so every name must import; only calling an unimplemented one fails.
    if name.startswith("__"):
        raise AttributeError(name)
    return _missing_op(name)


def install_sgl_kernel_shim() -> bool:
    """Install the torch ``sgl_kernel`` shim unless the real package is present."""
    existing = sys.modules.get("sgl_kernel")
    if existing is not None:
        return bool(getattr(existing, SHIM_MARKER, False))
    if importlib.util.find_spec("sgl_kernel") is not None:
        return False
    module = types.ModuleType("sgl_kernel")
    module.__doc__ = "sglang-hsd CPU shim for sgl_kernel (torch implementations)."
    module.__version__ = "0.0.0+sglang-hsd-shim"
    setattr(module, SHIM_MARKER, True)
    module.__dict__.update(SGL_KERNEL_CPU_OPS)
    module.__getattr__ = _sgl_kernel_getattr
    sys.modules["sgl_kernel"] = module
    # torch.ops.sgl_kernel is a plain namespace object that caches looked-up ops as attributes;
    # setting ours there serves ``torch.ops.sgl_kernel.<name>`` without a compiled library.
    for name, fn in SGL_KERNEL_TORCH_OPS.items():
        setattr(torch.ops.sgl_kernel, name, fn)
    return True


def install_cpu_shims() -> dict:
    """Install both stand-ins where needed; returns which ones were installed."""
    return {
        "torchvision": install_torchvision_stub(),
        "sgl_kernel": install_sgl_kernel_shim(),
    }
