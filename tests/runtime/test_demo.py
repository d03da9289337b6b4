"""``sglang-hsd demo``'s generation part on tiny random models: runs end to end, reports identity."""

import dataclasses
from pathlib import Path

import pytest
import torch

from sglang_hsd import cli
from sglang_hsd.runtime import demo, loading
from sglang_hsd.runtime.demo import DEMOS, QWEN_PAIR, compare_on_prompts, compress_runs, format_comparison
from sglang_hsd.runtime.model import CausalLM
from sglang_hsd.runtime.testing import tiny_qwen2
from tests.runtime.helpers import sharpen_lm_head

pytest.importorskip("transformers")

VOCAB = 64


class _DigitTokenizer:
    """A stand-in tokenizer without a chat template: characters -> ids below ``VOCAB``."""

    eos_token_id = None
    chat_template = None

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [1 + ord(ch) % (VOCAB - 1) for ch in text[:12]]}

    def decode(self, tokens, skip_special_tokens=True):
        return " ".join(map(str, tokens))

    def get_vocab(self):
        return {str(i): i for i in range(VOCAB)}


def _tiny_pair():
    target = sharpen_lm_head(tiny_qwen2(vocab_size=VOCAB, num_layers=3, seed=0), 4.0)
    drafter = sharpen_lm_head(tiny_qwen2(vocab_size=VOCAB, num_layers=1, seed=0), 4.0)
    return target, drafter


def test_compress_runs():
    assert compress_runs([16, 16, 16, 4, 2, 2]) == "16x3 4 2x2"
    assert compress_runs([]) == ""


def test_compare_on_prompts_reports_identical_greedy_output():
    target_hf, drafter_hf = _tiny_pair()
    spec = dataclasses.replace(QWEN_PAIR, levels="model:tiny,target", max_new_tokens=12)
    results = compare_on_prompts(CausalLM.from_hf(target_hf), CausalLM.from_hf(drafter_hf), spec,
                                 [[1, 2, 3], [5, 6]], progress=False)
    for result in results:
        assert result.identical and len(result.plain_tokens) == 12
        # Every round emits its accepted drafts plus one token.
        assert sum(result.accepted) + len(result.accepted) >= 12 and result.speedup > 0
        text = format_comparison(result, "prompt", decode=lambda tokens: "x")
        assert "token for token: IDENTICAL (12 tokens)" in text and "accepted draft tokens per round" in text
        # The demo's "auto" drafter precision is resolved by measurement and reported.
        assert result.drafter_precision in ("fp32", "bf16", "fp16")
        assert f"drafter steps on {result.drafter_precision} weights" in text


def test_demo_command_runs_end_to_end_on_tiny_models(monkeypatch, capsys):
    target_hf, drafter_hf = _tiny_pair()
    models = {"qwen2.5-coder-1.5b": target_hf, "qwen2.5-coder-0.5b": drafter_hf}

    def fake_load(name):
        hf = models[name]
        return loading.LoadedModel(CausalLM.from_hf(hf), hf, _DigitTokenizer(), Path(name))

    monkeypatch.setattr(loading, "load_model", fake_load)
    monkeypatch.setattr(loading, "prompt_set_texts", lambda name, limit: ["def f(x):"] * limit)
    threads = torch.get_num_threads()
    try:
        assert cli.main(["demo", "--skip-check", "--max-new-tokens", "10", "--threads", "1"]) == 0
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert "token for token: IDENTICAL (10 tokens)" in out and "total time" in out
    assert "x over" not in out and "tok/s" in out and "process CPU time" in out
    # One comparison per prompt (a code and a chat prompt), then the range over both.
    assert "--- humaneval prompt 0" in out and "--- mtbench prompt 0" in out
    assert "range over 2 prompts: " in out and "every output identical to plain decoding" in out


def test_the_default_demo_shows_code_and_chat():
    assert [prompt.prompt_set for prompt in QWEN_PAIR.prompts] == ["humaneval", "mtbench"]
    with pytest.raises(ValueError, match="at least one prompt"):
        dataclasses.replace(QWEN_PAIR, prompts=())
    with pytest.raises(ValueError, match="exactly one of prompt_set and text"):
        demo.DemoPrompt("humaneval", 0, "text")


def test_range_names_the_slowest_and_fastest_prompt():
    def comparison(plain_seconds, accepted, identical=True):
        tokens = [1] * 10
        return demo.PromptComparison(tokens, tokens if identical else [2] * 10, plain_seconds, 1.0, 1.0, 1.0,
                                     (0.0, 0.0), accepted)

    line = demo.format_range(["code", "chat", "other"],
                             [comparison(3.0, [15, 15]), comparison(0.8, [1, 2]), comparison(1.5, [4])])
    assert line == ("range over 3 prompts: 0.80x (chat, 1.5 drafts accepted per round) to 3.00x (code, 15.0 "
                    "drafts accepted per round); every output identical to plain decoding")
    assert "AN OUTPUT DIFFERS" in demo.format_range(["a"], [comparison(1.0, [1], identical=False)])
    assert demo.format_range(["a"], [comparison(2.0, [3])]).startswith("range over 1 prompt: 2.00x (a, ")


def test_demo_help_names_every_demo_and_bad_lengths_fail_before_loading(capsys):
    with pytest.raises(SystemExit):
        cli.main(["demo", "--help"])
    out = capsys.readouterr().out
    assert all(name in out for name in DEMOS) and "smollm2-135m" in out
    with pytest.raises(ValueError, match="max_new_tokens"):
        cli.main(["demo", "--skip-check", "--max-new-tokens", "0"])
    assert demo.DEFAULT_DEMO == "qwen2.5-coder-1.5b"


def test_auto_threads_uses_every_core_only_on_an_idle_machine():
    assert demo.auto_threads(cores=2, load=0.1) == 2
    assert demo.auto_threads(cores=2, load=1.2) == 1
    with pytest.raises(ValueError, match="--threads"):
        cli.main(["demo", "--skip-check", "--threads", "-1"])


def test_demo_spec_refuses_an_unknown_drafter_precision():
    assert QWEN_PAIR.drafter_precision == "auto"  # measured on the machine it runs on
    with pytest.raises(ValueError, match="drafter_precision must be one of fp32, bf16, fp16, int8, int4, w8a8, "
                       "int4\\+w8a8, auto, got 'int3'"):
        dataclasses.replace(QWEN_PAIR, drafter_precision="int3")
