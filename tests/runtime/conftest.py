import pytest
import torch

pytest.importorskip("transformers")

from sglang_hsd.runtime.model import CausalLM  # noqa: E402
from sglang_hsd.runtime.testing import tiny_llama  # noqa: E402
from tests.runtime.helpers import sharpen_lm_head  # noqa: E402


@pytest.fixture(autouse=True)
def _inference_mode():
    """Every runtime test runs as the runtime does: under inference mode."""
    with torch.inference_mode():
        yield


@pytest.fixture(scope="module")
def target():
    """The engine tests' target: a tiny Llama (V = 48, 6 layers) with a sharpened LM head."""
    return CausalLM.from_hf(sharpen_lm_head(tiny_llama(vocab_size=48, num_layers=6, hidden_size=48, seed=1), 4.0))
