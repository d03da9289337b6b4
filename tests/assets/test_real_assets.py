"""Slow tests on the real cached models and prompt sets; they skip when the cache is empty.

Fill the cache with ``sglang-hsd fetch smollm2-135m`` (and ``--prompts``, or the Qwen names).
Nothing here downloads: the prompt sets are read with ``offline=True``.
"""

from __future__ import annotations

import os

import pytest

from sglang_hsd.assets.archives import AssetUnavailableError
from sglang_hsd.assets.fetch import model_path
from sglang_hsd.assets.prompts import load_prompts

pytestmark = pytest.mark.slow

# Counts of the pinned files (ShareGPT: complete records with a non-empty first human turn).
EXPECTED_COUNTS = {"humaneval": 164, "mtbench": 80, "alpacaeval": 805, "gsm8k-fewshot": 8}
SHAREGPT_MIN = 17_000


def _load(name: str):
    path = model_path(name)
    if path is None:
        pytest.skip(f"{name} is not in the cache; run: sglang-hsd fetch {name}")
    transformers = pytest.importorskip("transformers")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    model.eval()
    return tokenizer, model


def _greedy_reply(tokenizer, model, question: str, max_new_tokens: int) -> str:
    import torch

    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    return tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


def test_smollm2_answers_a_factual_question_greedily():
    tokenizer, model = _load("smollm2-135m")
    assert (
        model.dtype.is_floating_point and getattr(model.config, "quantization_config", None) is None
    )
    assert model.config.vocab_size == 49_152 and model.config.num_hidden_layers == 30
    reply = _greedy_reply(
        tokenizer, model, "What is the capital of France? Answer in one sentence.", 12
    )
    assert "Paris" in reply, reply
    # Greedy decoding is deterministic: a second run must give the same text.
    assert (
        _greedy_reply(
            tokenizer, model, "What is the capital of France? Answer in one sentence.", 12
        )
        == reply
    )


def test_qwen_pair_shares_a_tokenizer_and_writes_code():
    if model_path("qwen2.5-coder-1.5b") is None:
        pytest.skip(
            "qwen2.5-coder-1.5b is not in the cache; run: sglang-hsd fetch qwen2.5-coder-1.5b"
        )
    draft_tokenizer, draft = _load("qwen2.5-coder-0.5b")
    target_tokenizer = pytest.importorskip("transformers").AutoTokenizer.from_pretrained(
        model_path("qwen2.5-coder-1.5b")
    )
    assert draft_tokenizer.get_vocab() == target_tokenizer.get_vocab()
    reply = _greedy_reply(
        draft_tokenizer, draft, "Write a Python function that adds two numbers.", 24
    )
    assert "def " in reply, reply


def test_gemma_tokenizer_prepends_bos_and_continues_text():
    import torch

    tokenizer, model = _load("gemma3-270m")
    inputs = tokenizer("The capital of France is", return_tensors="pt")
    # The GGUF asks for BOS; without it this base model degenerates into "The The The ...".
    assert inputs["input_ids"][0, 0].item() == tokenizer.bos_token_id
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    text = tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "France" in text and "The The" not in text, text


@pytest.mark.parametrize("set_name", sorted(EXPECTED_COUNTS) + ["sharegpt"])
def test_real_prompt_sets_parse(set_name):
    try:
        prompts = load_prompts(set_name, offline=True)
    except AssetUnavailableError:
        pytest.skip(f"{set_name} is not in the cache; run: sglang-hsd fetch --prompts")
    if set_name == "sharegpt":
        assert len(prompts) >= SHAREGPT_MIN
    else:
        assert len(prompts) == EXPECTED_COUNTS[set_name]
    assert len({p.id for p in prompts}) == len(prompts) or set_name == "sharegpt"
    assert all(p.text.strip() for p in prompts)
    if set_name == "mtbench":
        assert len({p.category for p in prompts}) == 8
    assert [p.id for p in load_prompts(set_name, limit=3, offline=True)] == [
        p.id for p in prompts[:3]
    ]
