"""Chat templating: where a user message becomes the text (and token ids) a model is prompted with.

A tokenizer with a chat template gets the template applied with the assistant turn opened; the
templated text already holds the template's special tokens, so it is tokenized with
``add_special_tokens=False``. A tokenizer without one sees the raw user text.
"""

from __future__ import annotations

from typing import Any


def has_chat_template(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` (a transformers tokenizer, or None) carries a chat template."""
    return tokenizer is not None and bool(getattr(tokenizer, "chat_template", None))


def chat_prompt_text(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    """``messages`` (``[{"role": "user", "content": ...}]``) through ``tokenizer``'s chat template,
    ending in the opening of the assistant turn."""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def encode_prompts(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """Token ids of each user message in ``texts``: templated (and tokenized without added
    special tokens) when ``tokenizer`` has a chat template, else the raw text with the
    tokenizer's own special tokens. Returns one int list per text."""
    ids = []
    for text in texts:
        if has_chat_template(tokenizer):
            templated = chat_prompt_text(tokenizer, [{"role": "user", "content": text}])
            ids.append(tokenizer(templated, add_special_tokens=False)["input_ids"])
        else:
            ids.append(tokenizer(text)["input_ids"])
    return ids
