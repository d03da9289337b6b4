"""The speculative runtime: exactness (greedy), distribution (sampling), KV reuse, bad input."""

import pytest
import torch

from sglang_hsd.levels import LevelSpec
from sglang_hsd.runtime.config import HierarchyConfig, parse_levels
from sglang_hsd.runtime.engine import SpeculativeGenerator
from sglang_hsd.runtime.model import CausalLM
from sglang_hsd.runtime.testing import greedy_reference, tiny_llama
from sglang_hsd.sampling import SamplingParams
from sglang_hsd.verify.oracles.stats import chi_square_p_value
from tests.runtime.helpers import PROMPTS, exact_target_prefix_probs, sharpen_lm_head

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def small_drafter():
    return CausalLM.from_hf(sharpen_lm_head(tiny_llama(vocab_size=48, num_layers=2, hidden_size=32, seed=2), 4.0))


GREEDY_CONFIGS = {
    "autoregressive": "target",
    "exit drafter": "exit:2,target",
    "three levels": "exit:1,exit:3,target",
    "four levels": "exit:1,exit:2,exit:4,target",
}


@pytest.mark.parametrize("name", list(GREEDY_CONFIGS))
@pytest.mark.parametrize("method", ["hsd", "tokenwise", "greedy"])
def test_greedy_output_equals_target_greedy(target, name, method):
    spec = GREEDY_CONFIGS[name]
    below = len(spec.split(",")) - 1
    config = parse_levels(spec, buffers=[3] * below, methods=[method])
    gen = SpeculativeGenerator(target, config, validate=True)
    result = gen.generate(PROMPTS, SamplingParams(temperature=0.0), max_new_tokens=12)
    for prompt, out in zip(PROMPTS, result.tokens):
        assert out == greedy_reference(target, prompt, 12), name


def test_greedy_with_separate_drafter(target, small_drafter):
    config = parse_levels("model:tiny,target", buffers=[4])
    gen = SpeculativeGenerator(target, config, drafter=small_drafter, validate=True)
    result = gen.generate(PROMPTS[:2], SamplingParams(temperature=0.0), max_new_tokens=10)
    assert result.drafter_layer_forwards > 0
    for prompt, out in zip(PROMPTS[:2], result.tokens):
        assert out == greedy_reference(target, prompt, 10)


def test_reference_decoder_matches_transformers_generate():
    # Guards greedy_reference itself: the target's own HF generate gives the same tokens.
    hf = sharpen_lm_head(tiny_llama(vocab_size=48, num_layers=6, hidden_size=48, seed=1), 4.0)
    model = CausalLM.from_hf(hf)
    prompt = PROMPTS[2]
    out = hf.generate(torch.tensor([prompt]), max_new_tokens=10, do_sample=False, pad_token_id=0)
    assert out[0, len(prompt) :].tolist() == greedy_reference(model, prompt, 10)


def test_eos_and_per_request_max_new_tokens(target):
    reference = greedy_reference(target, PROMPTS[0], 12)
    eos = reference[4]
    config = parse_levels("exit:2,target", buffers=[3])
    gen = SpeculativeGenerator(target, config)
    result = gen.generate(
        [PROMPTS[0], PROMPTS[0]], SamplingParams(temperature=0.0), max_new_tokens=[12, 3], eos_token_id=eos
    )
    first_eos = reference.index(eos)
    assert result.tokens[0] == reference[: first_eos + 1]
    assert result.tokens[1] == reference[: min(3, first_eos + 1)]


def test_kv_reuse_saves_layer_forwards_and_changes_nothing(target):
    outputs, forwards = {}, {}
    for reuse in (True, False):
        levels = parse_levels("exit:1,exit:3,target", buffers=[3, 4]).levels
        gen = SpeculativeGenerator(target, HierarchyConfig(levels, reuse_kv=reuse))
        result = gen.generate(PROMPTS, SamplingParams(temperature=0.0), max_new_tokens=16)
        outputs[reuse], forwards[reuse] = result.tokens, result.layer_forwards_per_token
    assert outputs[True] == outputs[False]
    assert forwards[True] < forwards[False]
    # With reuse, each position runs through each of the 6 layers about once (plus rejected drafts).
    assert forwards[True] < 0.8 * forwards[False]


def test_per_level_statistics_are_consistent(target):
    gen = SpeculativeGenerator(target, parse_levels("exit:1,exit:3,target", buffers=[2, 3]))
    result = gen.generate(PROMPTS, SamplingParams(temperature=1.0), max_new_tokens=10, seed=3)
    drafter, middle, top = result.levels
    assert [lv.name for lv in result.levels] == ["exit:1", "exit:3", "target"]
    assert middle.proposed == drafter.proposed  # every drafted token is verified by level 1
    assert 0 <= middle.accepted <= middle.proposed and 0 <= top.accepted <= top.proposed
    assert all(len(t) == 10 for t in result.tokens)
    assert "accepted/round" in result.summary()


def test_seeds_are_honoured(target):
    gen = SpeculativeGenerator(target, parse_levels("exit:2,target", buffers=[3]))
    params = SamplingParams(temperature=1.0)
    a = gen.generate(PROMPTS, params, max_new_tokens=8, seed=11).tokens
    b = gen.generate(PROMPTS, params, max_new_tokens=8, seed=11).tokens
    c = gen.generate(PROMPTS, params, max_new_tokens=8, seed=12).tokens
    assert a == b and a != c


# ---- distribution -----------------------------------------------------------------------------


@pytest.mark.statistical
@pytest.mark.parametrize(
    "spec,params",
    [
        ("exit:2,target", SamplingParams(temperature=1.0)),
        ("exit:1,exit:3,target", SamplingParams(temperature=0.8, top_p=0.9)),
        ("exit:1,exit:3,target", SamplingParams(temperature=1.2, top_k=5)),
    ],
)
def test_sampled_output_matches_target_distribution(spec, params):
    vocab, length, runs = 6, 3, 6000
    model = CausalLM.from_hf(sharpen_lm_head(tiny_llama(vocab_size=vocab, num_layers=4, hidden_size=32, seed=5), 3.0))
    below = len(spec.split(",")) - 1
    gen = SpeculativeGenerator(model, parse_levels(spec, buffers=[2] * below), validate=True)
    prompt = [1, 4, 2]
    result = gen.generate([prompt] * runs, params, max_new_tokens=length, seed=0)
    codes = torch.tensor([t[0] * vocab * vocab + t[1] * vocab + t[2] for t in result.tokens])
    counts = torch.bincount(codes, minlength=vocab**length)
    expected = exact_target_prefix_probs(model, prompt, length, params)
    assert chi_square_p_value(counts, expected) > 1e-4
    assert result.levels[-1].accepted > 0  # speculation really happened


@pytest.mark.statistical
def test_sampled_test_catches_mismatched_sampling_parameters():
    # Teeth: decoding at T = 1 but comparing against the target at T = 0.5 must fail.
    vocab, length, runs = 6, 3, 6000
    model = CausalLM.from_hf(sharpen_lm_head(tiny_llama(vocab_size=vocab, num_layers=4, hidden_size=32, seed=5), 3.0))
    gen = SpeculativeGenerator(model, parse_levels("exit:2,target", buffers=[2]))
    result = gen.generate([[1, 4, 2]] * runs, SamplingParams(temperature=1.0), max_new_tokens=length, seed=0)
    codes = torch.tensor([t[0] * vocab * vocab + t[1] * vocab + t[2] for t in result.tokens])
    counts = torch.bincount(codes, minlength=vocab**length)
    expected = exact_target_prefix_probs(model, [1, 4, 2], length, SamplingParams(temperature=0.5))
    assert chi_square_p_value(counts, expected) < 1e-6


# ---- bad input --------------------------------------------------------------------------------


def test_bad_configurations_raise_clear_errors(target, small_drafter):
    with pytest.raises(ValueError, match="strictly increase"):
        parse_levels("exit:3,exit:2,target")
    with pytest.raises(ValueError, match="exit layer 9 out of range"):
        SpeculativeGenerator(target, parse_levels("exit:9,target"))
    with pytest.raises(ValueError, match="last level must be the target"):
        HierarchyConfig((LevelSpec("exit", layer=2),))
    with pytest.raises(ValueError, match="unknown level"):
        parse_levels("eagle:2,target")
    with pytest.raises(ValueError, match="--buffers needs 2"):
        parse_levels("exit:1,exit:2,target", buffers=[3])
    with pytest.raises(ValueError, match="pass drafter"):
        SpeculativeGenerator(target, parse_levels("model:x,target"))
    other_vocab = CausalLM.from_hf(tiny_llama(vocab_size=50, num_layers=1))
    with pytest.raises(ValueError, match="tokenizer"):
        SpeculativeGenerator(target, parse_levels("model:x,target"), drafter=other_vocab)
    with pytest.raises(ValueError, match="non-empty"):
        SpeculativeGenerator(target, parse_levels("target")).generate([[]])
