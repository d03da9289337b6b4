"""Token ids outside the vocabulary are refused before scheduling on an HSD server
(``sglang_plugin/request_validation.py``); other servers keep SGLang's validation. The server
test (a 400, then a normal request served) is in ``test_draft_model_server.py``."""

from __future__ import annotations

import types

import pytest

from sglang_hsd.sglang_plugin.request_validation import check_input_ids, validated_one_request
from tests.sglang_plugin.plugin_fixtures import plugin_loaded  # noqa: F401

pytestmark = pytest.mark.sglang


@pytest.mark.parametrize("ids, match", [([1, 2, 10_000_000], r"input_ids\[2\] = 10000000"),
                                        ([-1], r"input_ids\[0\] = -1"), ([0, 1.5], r"input_ids\[1\] = 1.5")])
def test_ids_outside_the_vocabulary_are_named(ids, match):
    with pytest.raises(ValueError, match=match + r".*\[0, 512\)"):
        check_input_ids(ids, 512)
    check_input_ids([0, 511], 512)
    check_input_ids(None, 512)  # a text request: tokenized ids are the tokenizer's


@pytest.mark.parametrize("algorithm, refused", [("HSD", True), ("EAGLE3", False), (None, False)])
def test_only_hsd_servers_check_ids(algorithm, refused):
    calls = []
    validate = validated_one_request(lambda self, obj, ids: calls.append(ids))
    manager = types.SimpleNamespace(server_args=types.SimpleNamespace(speculative_algorithm=algorithm),
                                    model_config=types.SimpleNamespace(vocab_size=512))
    if refused:
        with pytest.raises(ValueError, match="input_ids"):
            validate(manager, object(), [1, 512])
    else:
        validate(manager, object(), [1, 512])
    assert calls == [[1, 512]]  # SGLang's own checks ran first


def test_the_plugin_wraps_sglangs_validation(plugin_loaded):
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    assert TokenizerManager._validate_one_request.__sglang_hsd_original__ is not None
