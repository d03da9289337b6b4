"""Every test in this folder (and any file added to it later) is marked ``gpu`` and, without a
CUDA device, skipped with the reason, unless ``SGLANG_HSD_GPU_SMOKE=1`` asks for the tiny CPU
versions (``tests/gpu/_support.py``). Nothing here imports SGLang: the check runs on a machine
with only torch, triton, numpy and pytest."""

from pathlib import Path

import pytest

from tests.gpu._support import RUNS, SKIP_REASON

HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # before ``-m gpu`` deselects unmarked items
def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE not in Path(item.path).resolve().parents:
            continue
        item.add_marker(pytest.mark.gpu)
        if not RUNS:
            item.add_marker(pytest.mark.skip(reason=SKIP_REASON))
