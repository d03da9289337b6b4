"""Prompt files for SGLang's serving client: the project's prompt sets or a user's JSONL file.

SGLang's client reads its ``sharegpt`` dataset from a JSON array of records with a human and a
gpt turn; it keeps the human turn as the prompt (text, tokenized by the client) and ignores the
gpt turn when ``--sharegpt-output-len`` fixes the output length. :func:`write_sharegpt_file`
writes texts in that form; :func:`write_prompt_file` does it for a registered prompt set
(``sglang_hsd/assets/prompts.py``: fetched from a pinned archive on first use) or the tiny
models' corpus; :func:`read_prompt_jsonl` reads and checks a user's file of prompts.
"""

from __future__ import annotations

import json
from pathlib import Path

# The registered prompt sets ``sglang-hsd bench --prompt-sets`` names (``assets.registry``).
PROMPT_SETS = ("humaneval", "mtbench", "sharegpt")


class PromptFileError(ValueError):
    """A user's prompt file that cannot be read; the message names the file, the line and the option."""


def write_sharegpt_file(path: Path, texts: list[str]) -> int:
    """Write ``texts`` (blank ones dropped) as ShareGPT-format JSON to ``path``; returns how many."""
    records = [{"id": str(i), "conversations": [{"from": "human", "value": t},
                                                {"from": "gpt", "value": "ok"}]}
               for i, t in enumerate(t for t in texts if t.strip())]
    Path(path).write_text(json.dumps(records))
    return len(records)


def tiny_corpus_texts() -> list[str]:
    """The tiny random models' built-in corpus, one sentence per prompt (any text will do for
    random models, and it needs no download)."""
    from sglang_hsd.sglang_plugin.cpu.tiny_models import _CORPUS

    return [s.strip() for s in _CORPUS.split(".") if s.strip()]


def write_prompt_file(path: Path, prompt_set: str, count: int, tiny: bool = False,
                      fallback: bool = False, offset: int = 0) -> str:
    """Write ``count`` prompts of ``prompt_set`` (``runtime.loading.prompt_set_texts``), after
    skipping its first ``offset``, as ShareGPT-format JSON (a human and a gpt turn per record), the
    format of SGLang's client's ``sharegpt`` dataset and the text source of its ``random`` one.
    Returns the prompts' source.

    ``tiny``: the tiny models' built-in corpus instead (random models: any text will do, no
    download). ``fallback``: use that corpus when the prompt set cannot be loaded (offline and not
    cached), for clients that only need token ids."""
    if offset < 0:
        raise ValueError(f"offset must be >= 0, got {offset}")
    texts, source = None, "tiny corpus"
    if not tiny:
        from sglang_hsd.runtime.loading import prompt_set_texts

        try:
            texts = prompt_set_texts(prompt_set, offset + count)[offset:]
            source = prompt_set if offset == 0 else f"{prompt_set} from prompt {offset}"
        except Exception as err:
            if not fallback:
                raise
            source = f"tiny corpus ({prompt_set} unavailable: {type(err).__name__})"
    if texts is None:
        texts = tiny_corpus_texts()
    written = write_sharegpt_file(path, texts[:count])
    return f"{source} ({written} prompts)"


def prompt_file_texts(path: Path) -> list[str]:
    """The prompts of a file of :func:`write_prompt_file`."""
    return [r["conversations"][0]["value"] for r in json.loads(Path(path).read_text())]


def read_prompt_jsonl(path: Path, option: str = "--prompt-sets") -> list[str]:
    """The prompts of a JSONL file: one JSON object per line with a non-blank ``"prompt"`` string
    (other keys ignored; blank lines skipped). Raises ``PromptFileError`` naming ``option``, the
    file and the first bad line: a missing file, a line that is not a JSON object, a missing or
    non-string or blank ``prompt``, or no prompt at all."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise PromptFileError(f"{option}: no such prompt file {path}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise PromptFileError(f"{option}: cannot read the prompt file {path} ({err})") from None
    prompts = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{option} {path}, line {number}"
        try:
            record = json.loads(line)
        except ValueError as err:
            raise PromptFileError(f"{where}: not JSON ({err}); expected one object per line, "
                                  'e.g. {"prompt": "Write a haiku."}') from None
        if not isinstance(record, dict):
            raise PromptFileError(f'{where}: expected a JSON object with a "prompt" string, got '
                                  f"{type(record).__name__}")
        prompt = record.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            got = "no prompt key" if "prompt" not in record else f"prompt {prompt!r}"
            raise PromptFileError(f'{where}: expected a non-blank "prompt" string, got {got}')
        prompts.append(prompt)
    if not prompts:
        raise PromptFileError(f'{option} {path}: the file holds no prompt (one JSON object per line '
                              'with a "prompt" string)')
    return prompts
