"""Requests an HSD server cannot serve are refused before they are scheduled.

SGLang 0.5.23 checks a request's length against the context in ``TokenizerManager.
_validate_one_request`` but not its token ids against the vocabulary: ``{"input_ids": [1, 2,
10000000]}`` reached the target's embedding in the scheduler's prefill, raised ``IndexError`` there
and the scheduler, and with it the server, exited (the same without speculation). On an HSD server
``install_request_validation`` adds the check to that method, which runs in the HTTP process for
every request: an id outside [0, vocab_size) raises ``ValueError`` naming the position and the
id, which SGLang answers with HTTP 400, and the server goes on serving. Servers of other algorithms
keep SGLang's method unchanged.
"""

from __future__ import annotations

from sglang_hsd.sglang_plugin.config import ALGORITHM_NAME


def check_input_ids(input_ids, vocab_size: int) -> None:
    """Raise ValueError naming the first id of ``input_ids`` outside [0, ``vocab_size``)."""
    for position, token in enumerate(input_ids or ()):
        if not isinstance(token, int) or not 0 <= token < vocab_size:
            raise ValueError(f"input_ids[{position}] = {token!r} is not a token id of this model: "
                             f"expected an integer in [0, {vocab_size})")


def validated_one_request(original):
    """``TokenizerManager._validate_one_request(self, obj, input_ids)`` that also checks the ids
    of an HSD server's requests against the model's vocabulary."""

    def _validate_one_request(self, obj, input_ids):
        original(self, obj, input_ids)
        algorithm = getattr(self.server_args, "speculative_algorithm", None)
        if (algorithm or "").upper() == ALGORITHM_NAME:
            check_input_ids(input_ids, self.model_config.vocab_size)

    _validate_one_request.__sglang_hsd_original__ = original
    return _validate_one_request


def install_request_validation() -> None:
    """Wrap ``TokenizerManager._validate_one_request`` (idempotent)."""
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    current = TokenizerManager._validate_one_request
    if getattr(current, "__sglang_hsd_original__", None) is None:
        TokenizerManager._validate_one_request = validated_one_request(current)
