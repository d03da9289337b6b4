"""Tiny random models for the round planner's tests: a 6-layer target and a 2-layer drafter over one
48-token vocabulary, LM heads sharpened so the drafter agrees with the target often, not always."""

import pytest
import torch


@pytest.fixture(scope="module")
def target():
    pytest.importorskip("transformers")
    from sglang_hsd.runtime.model import CausalLM
    from sglang_hsd.runtime.testing import tiny_llama
    from tests.runtime.helpers import sharpen_lm_head

    with torch.inference_mode():
        return CausalLM.from_hf(sharpen_lm_head(tiny_llama(vocab_size=48, num_layers=6, hidden_size=48, seed=1), 4.0))


@pytest.fixture(scope="module")
def drafter():
    pytest.importorskip("transformers")
    from sglang_hsd.runtime.model import CausalLM
    from sglang_hsd.runtime.testing import tiny_llama
    from tests.runtime.helpers import sharpen_lm_head

    with torch.inference_mode():
        return CausalLM.from_hf(sharpen_lm_head(tiny_llama(vocab_size=48, num_layers=2, hidden_size=32, seed=2), 4.0))
