"""Where trained heads live in the cache: ``<cache>/heads/<model>/``.

``sglang-hsd train-heads`` writes there (``exit/``: exit heads in the format of
``sglang_hsd.heads.exit_head``; ``eagle3/``: an EAGLE-3 head in SGLang's format); ``sglang-hsd
generate --exit-heads auto``, the planner and the benchmarks read from there.
"""

from __future__ import annotations

import os
from pathlib import Path

from .archives import resolve_cache_dir


def heads_dir(model: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """``<cache>/heads/<model>``: the trained heads of registry model (or folder name) ``model``.

    ``cache_dir`` as in ``resolve_cache_dir`` (default ``$SGLANG_HSD_CACHE`` or
    ``~/.cache/sglang-hsd``)."""
    return resolve_cache_dir(cache_dir) / "heads" / model
