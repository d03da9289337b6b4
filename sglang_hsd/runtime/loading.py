"""Loading what the runtime runs: models (fetched on first use), exit heads, prompts, generators.

The command lines (``sglang-hsd generate``, ``sglang-hsd plan``) and the benchmarks build on these;
heavy imports (transformers, the engine) happen inside the functions, so importing this module is
cheap.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sglang_hsd.draft_length import DraftLengthRule


@dataclass
class LoadedModel:
    """A target (or drafter): our ``CausalLM``, the transformers model it shares weights with, the
    tokenizer, its folder and the name it was loaded by (a registry name or a path)."""

    model: object
    hf: object
    tokenizer: object
    path: Path
    name: str = ""


def load_model(name_or_path: str) -> LoadedModel:
    """Load a registry model (fetching it on first use) or a local folder, in float32."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sglang_hsd.runtime.model import CausalLM

    path = Path(name_or_path)
    if not path.is_dir():
        from sglang_hsd.assets.fetch import fetch_model

        path = fetch_model(name_or_path)  # raises ValueError listing known names
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, attn_implementation="eager").eval()
    return LoadedModel(CausalLM.from_hf(hf), hf, AutoTokenizer.from_pretrained(str(path)), path,
                       name_or_path)


def check_same_tokenizer(target_tok, drafter_tok, drafter_name: str) -> None:
    """Raise ``ValueError`` naming ``drafter_name`` unless both tokenizers have one vocabulary."""
    if target_tok.get_vocab() != drafter_tok.get_vocab():
        raise ValueError(
            f"drafter {drafter_name!r} has a different tokenizer from the target: speculative "
            "decoding needs one shared vocabulary"
        )


def prompt_set_texts(set_name: str, limit: int) -> list[str]:
    """The first ``limit`` user messages of prompt set ``set_name`` (``load_prompts``), untemplated."""
    from sglang_hsd.assets.prompts import load_prompts

    return [prompt.user_text for prompt in load_prompts(set_name, limit=limit)]


def load_exit_heads_option(target: LoadedModel, exit_heads: str) -> dict:
    """``--exit-heads``: ``none`` (logit lens), ``auto`` (the trained heads of ``sglang-hsd
    train-heads`` for this model, if present) or a folder of saved exit heads.

    Returns {exit layer: ``sglang_hsd.runtime.exit_heads.ExitHead``}, empty for the logit lens.
    """
    if exit_heads == "none":
        return {}
    from sglang_hsd.assets.heads import heads_dir
    from sglang_hsd.runtime.exit_heads import MANIFEST, load_exit_heads

    folder = heads_dir(target.path.name) / "exit" if exit_heads == "auto" else Path(exit_heads)
    if not (folder / MANIFEST).is_file():
        if exit_heads != "auto":
            raise ValueError(f"--exit-heads folder {exit_heads} holds no saved exit heads ({MANIFEST})")
        return {}
    return load_exit_heads(str(folder), target.model)


def build_generator(target: LoadedModel, levels: str, buffers, methods, exit_heads: str, reuse_kv: bool = True,
                    draft_length: DraftLengthRule | None = None, tree=None, pack_linears: bool = False,
                    drafter_precision: str = "fp32", drafter: LoadedModel | None = None):
    """A ``SpeculativeGenerator`` for a ``--levels`` spec (loads a separate drafter if named).

    Args:
        levels, buffers, methods: as ``parse_level_specs``.
        exit_heads: the ``--exit-heads`` option (``load_exit_heads_option``).
        reuse_kv: ``HierarchyConfig.reuse_kv``.
        draft_length: ``HierarchyConfig.draft_length`` (default ``fixed``: the drafter's buffer).
        tree: ``HierarchyConfig.tree`` (a ``TreeShape``, e.g. from ``TreeShape.parse``), None: chains.
        pack_linears: ``SpeculativeGenerator(pack_linears=...)`` (the ``onednn-packed`` kernel path).
        drafter_precision: ``SpeculativeGenerator(drafter_precision=...)`` (a separate drafter's
            single-row weight copy).
        drafter: the ``model`` level's model if already loaded (checked against its name or path, so a
            benchmark can share one copy with a Hugging Face peer); None: loaded here.
    """
    from sglang_hsd.levels import parse_level_specs, separate_model
    from sglang_hsd.runtime.config import HierarchyConfig
    from sglang_hsd.runtime.engine import SpeculativeGenerator

    config = HierarchyConfig(parse_level_specs(levels, buffers, methods), reuse_kv=reuse_kv,
                             draft_length=draft_length or DraftLengthRule(), tree=tree)
    drafter_model = None
    model_level = separate_model(config.levels)
    if model_level is not None:
        name = model_level.model_path
        if drafter is not None and name not in (drafter.name, str(drafter.path)):
            raise ValueError(f"drafter: the loaded {drafter.name!r} is not the model level's {name!r}")
        loaded = drafter or load_model(name)
        check_same_tokenizer(target.tokenizer, loaded.tokenizer, name)
        drafter_model = loaded.model
    heads = load_exit_heads_option(target, exit_heads)
    return SpeculativeGenerator(target.model, config, drafter=drafter_model, exit_heads=heads, pack_linears=pack_linears,
                                drafter_precision=drafter_precision)
