"""The runtime on the real SmolLM2-135M-Instruct (slow; needs the converted model in the cache)."""

import pytest
import torch

from sglang_hsd.assets.fetch import model_path

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2():
    path = model_path("smollm2-135m")
    if path is None:
        pytest.skip("SmolLM2-135M is not in the cache; run: sglang-hsd fetch smollm2-135m")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sglang_hsd.runtime.model import CausalLM

    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    return hf, CausalLM.from_hf(hf), AutoTokenizer.from_pretrained(path)


@pytest.mark.parametrize("levels,buffers", [("exit:12,target", [3]), ("exit:6,exit:18,target", [2, 3])])
def test_greedy_hierarchy_equals_transformers_greedy(smollm2, levels, buffers):
    from sglang_hsd.assets.chat import encode_prompts
    from sglang_hsd.runtime.config import parse_levels
    from sglang_hsd.runtime.engine import SpeculativeGenerator
    from sglang_hsd.sampling import SamplingParams

    hf, model, tok = smollm2
    prompts = encode_prompts(tok, ["What is the capital of France?", "List three prime numbers."])
    gen = SpeculativeGenerator(model, parse_levels(levels, buffers=buffers))
    result = gen.generate(prompts, SamplingParams(temperature=0.0), max_new_tokens=12, eos_token_id=tok.eos_token_id)
    for prompt, out in zip(prompts, result.tokens):
        with torch.inference_mode():
            ref = hf.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, pad_token_id=tok.eos_token_id)
        assert out == ref[0, len(prompt) :].tolist()


def test_mismatched_tokenizers_are_refused(smollm2):
    from sglang_hsd.runtime.loading import check_same_tokenizer

    _, _, tok = smollm2

    class Other:
        def get_vocab(self):
            return {"a": 0}

    with pytest.raises(ValueError, match="different tokenizer"):
        check_same_tokenizer(tok, Other(), "other")
