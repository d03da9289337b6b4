"""What drafts for ``--speculative-algorithm HSD``: an EAGLE-3 head or a separate language model.

``--speculative-draft-model-path`` names either an EAGLE-3 head (a one-layer model reading the
target's hidden states; its config names an ``...Eagle3`` architecture and carries
``draft_vocab_size`` / ``eagle_config``) or an ordinary causal language model of the target's
family with its own KV cache (SGLang's STANDALONE shape). ``--hsd-draft-kind {auto,eagle3,model}``
overrides the detection.

SGLang asks the algorithm object (``HSDSpecAlgo``) whether it is EAGLE-like or STANDALONE-like in
every process, long after the server arguments were resolved, and the algorithm object is one
per name. So the kind is resolved once, with the server arguments, and published in
``RESOLVED_DRAFT_KIND_ENV``, which every process SGLang spawns afterwards inherits.
"""

from __future__ import annotations

import json
import os

DRAFT_KIND_ENV = "SGLANG_HSD_DRAFT_KIND"
RESOLVED_DRAFT_KIND_ENV = "SGLANG_HSD_RESOLVED_DRAFT_KIND"
EAGLE3 = "eagle3"
MODEL = "model"
DRAFT_KINDS = ("auto", EAGLE3, MODEL)


class DraftKindError(ValueError):
    """The draft model cannot serve as an HSD drafter; the message names the flag."""


def detect_draft_kind(config: dict) -> str:
    """``EAGLE3`` or ``MODEL`` from a draft's ``config.json`` contents.

    An EAGLE-3 head names an ``*Eagle3*`` (or ``*Eagle*``) architecture, as SGLang's model registry
    does for its draft heads, or carries the head-only fields ``eagle_config`` / ``draft_vocab_size``.
    """
    archs = config.get("architectures") or []
    if any("eagle" in str(arch).lower() for arch in archs):
        return EAGLE3
    if "eagle_config" in config or "draft_vocab_size" in config:
        return EAGLE3
    return MODEL


def read_model_config(path: str, flag: str) -> dict:
    """``config.json`` of the checkpoint ``path`` (a folder, else a hub name resolved by
    transformers from its cache); ``flag`` names it in errors."""
    config_file = os.path.join(path, "config.json")
    if not os.path.isdir(path):
        try:
            from transformers import AutoConfig

            return AutoConfig.from_pretrained(path).to_dict()
        except (OSError, ValueError):
            pass
    if not os.path.isfile(config_file):
        raise DraftKindError(
            f"{flag} {path}: no config.json there, so the draft kind cannot be detected; give a "
            f"local checkpoint folder or pass --hsd-draft-kind {EAGLE3}|{MODEL} ({DRAFT_KIND_ENV})")
    with open(config_file) as f:
        return json.load(f)


def requested_draft_kind() -> str:
    """The ``--hsd-draft-kind`` value (``auto`` when unset), validated."""
    kind = os.environ.get(DRAFT_KIND_ENV, "auto").strip().lower() or "auto"
    if kind not in DRAFT_KINDS:
        raise DraftKindError(f"--hsd-draft-kind ({DRAFT_KIND_ENV}) {kind!r}: use one of "
                             f"{DRAFT_KINDS}")
    return kind


def resolve_draft_kind(draft_path: str | None) -> str:
    """The draft kind for ``draft_path`` (override first, else detected), published in
    ``RESOLVED_DRAFT_KIND_ENV`` for the processes SGLang spawns. Idempotent."""
    kind = requested_draft_kind()
    if kind == "auto":
        if draft_path is None:
            return current_draft_kind()  # the missing path is refused by the validation
        kind = detect_draft_kind(read_model_config(draft_path, "--speculative-draft-model-path"))
    os.environ[RESOLVED_DRAFT_KIND_ENV] = kind
    return kind


def current_draft_kind() -> str:
    """The kind resolved with the server arguments (``EAGLE3`` before any resolution)."""
    return os.environ.get(RESOLVED_DRAFT_KIND_ENV, EAGLE3)


def _vocab_size(config: dict) -> int | None:
    if "vocab_size" in config:
        return int(config["vocab_size"])
    text = config.get("text_config") or {}
    return int(text["vocab_size"]) if "vocab_size" in text else None


def _tokenizer_vocab(path: str) -> dict | None:
    """Token -> id of the tokenizer saved in ``path`` (None when it has no ``tokenizer.json``)."""
    tokenizer_file = os.path.join(path, "tokenizer.json")
    if not os.path.isfile(tokenizer_file):
        return None
    with open(tokenizer_file) as f:
        data = json.load(f)
    vocab = dict(data.get("model", {}).get("vocab") or {})
    vocab.update({tok["content"]: tok["id"] for tok in data.get("added_tokens", [])})
    return vocab


def check_same_vocabulary(target_path: str, draft_path: str) -> None:
    """Refuse a draft language model whose vocabulary differs from the target's.

    The verifier compares the draft's q with the target's p id by id, so both must index the same
    tokens: equal ``vocab_size`` in both configs and, when both folders hold a ``tokenizer.json``,
    the same token -> id map. Raises ``DraftKindError`` naming the flag and both sizes.
    """
    target = _vocab_size(read_model_config(target_path, "--model-path"))
    draft = _vocab_size(read_model_config(draft_path, "--speculative-draft-model-path"))
    if target != draft:
        raise DraftKindError(
            f"--speculative-draft-model-path {draft_path}: the draft model's vocab_size is "
            f"{draft}, the target's (--model-path {target_path}) is {target}; a draft language "
            "model must share the target's vocabulary")
    target_tokens, draft_tokens = _tokenizer_vocab(target_path), _tokenizer_vocab(draft_path)
    if target_tokens is not None and draft_tokens is not None and target_tokens != draft_tokens:
        differing = len(set(target_tokens.items()) ^ set(draft_tokens.items()))
        raise DraftKindError(
            f"--speculative-draft-model-path {draft_path}: same vocab_size ({target}) but another "
            f"tokenizer than --model-path {target_path} ({differing} token -> id entries differ "
            f"among {len(target_tokens)} and {len(draft_tokens)} tokens); use a draft of the "
            "target's family")
