"""SGLang plugin tests: install the CPU shims before anything imports SGLang."""

import os

import pytest

# SGLang decides "this is a CPU host" at import time from this variable (utils.is_cpu()).
os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")

pytest.importorskip("sglang", reason="needs sglang 0.5.23 (scripts/setup_env.sh --with-sglang)")

from sglang_hsd.sglang_plugin.cpu.cpu_shims import install_cpu_shims  # noqa: E402

install_cpu_shims()
