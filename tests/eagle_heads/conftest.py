"""Fixtures shared by the head tests."""

import pytest
import torch


@pytest.fixture(scope="module")
def target():
    """A tiny 6-layer target (V = 48, D = 48) with peaked LM-head rows, so exits disagree with the
    target in a learnable way."""
    pytest.importorskip("transformers")
    from sglang_hsd.runtime.model import CausalLM
    from sglang_hsd.runtime.testing import tiny_llama

    hf = tiny_llama(vocab_size=48, num_layers=6, hidden_size=48, seed=1)
    with torch.no_grad():
        hf.lm_head.weight.mul_(4.0)
    return CausalLM.from_hf(hf).requires_grad_(False)
