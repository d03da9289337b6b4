"""Every Triton kernel compiles for a Hopper GPU (sm_90), ahead of time, on this CPU machine.

``TRITON_INTERPRET=1`` runs kernels as Python and never type-checks them: a global read that is
not a ``tl.constexpr``, or a loop variable whose type changes between branches, only fails when
Triton compiles for a GPU. ``triton.compile`` with a ``GPUTarget`` runs that whole compiler (and
the ptxas the Triton wheel ships) without a device, so such errors surface here first. The
compiler runs in a child process without ``TRITON_INTERPRET`` (``kernel_compile_check.py``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

REPO = Path(__file__).resolve().parents[2]


def test_every_kernel_compiles_for_hopper():
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-m", "tests.verify.kernel_compile_check"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(lines) == 6 and all(line.startswith("ok ") for line in lines), lines
