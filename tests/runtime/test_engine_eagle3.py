"""The engine with an EAGLE-3 drafter (level kind ``eagle3``): exact greedy equality, sampled
distribution, drafter state and rollback, loading from an exported folder."""

import pytest
import torch

pytest.importorskip("transformers")

from eagle_heads.eagle3 import save_eagle3_head  # noqa: E402
from sglang_hsd.runtime.config import parse_levels  # noqa: E402
from sglang_hsd.runtime.engine import SpeculativeGenerator  # noqa: E402
from sglang_hsd.runtime.model import CausalLM  # noqa: E402
from sglang_hsd.runtime.testing import greedy_reference, tiny_llama  # noqa: E402
from sglang_hsd.sampling import SamplingParams  # noqa: E402
from sglang_hsd.verify.oracles.stats import chi_square_p_value  # noqa: E402
from tests.runtime.helpers import PROMPTS, eagle3_head_for, exact_target_prefix_probs, sharpen_lm_head  # noqa: E402


@pytest.mark.parametrize("spec,buffers", [
    ("eagle3:x,target", [3]),
    ("eagle3:x,exit:4,target", [2, 3]),
    ("eagle3:x,exit:2,exit:4,target", [2, 2, 3]),
])
@pytest.mark.parametrize("draft_vocab", [48, 24])
@pytest.mark.parametrize("method", ["hsd", "greedy"])
def test_greedy_output_equals_target_greedy(target, spec, buffers, draft_vocab, method):
    head, _ = eagle3_head_for(target, draft_vocab, [2, 3, 5])
    gen = SpeculativeGenerator(target, parse_levels(spec, buffers=buffers, methods=[method]), eagle3_head=head, validate=True)
    result = gen.generate(PROMPTS, SamplingParams(temperature=0.0), max_new_tokens=14)
    for prompt, out in zip(PROMPTS, result.tokens):
        assert out == greedy_reference(target, prompt, 14)
    assert result.levels[0].proposed > 0 and result.levels[1].accepted > 0


def test_drafter_sees_target_features_and_rolls_back(target):
    head, _ = eagle3_head_for(target, 48, [2, 3, 5])
    gen = SpeculativeGenerator(target, parse_levels("eagle3:x,target", buffers=[4]), eagle3_head=head)
    from sglang_hsd.runtime.engine import _Run

    run = _Run(gen, [[1, 2, 3, 4, 5]], SamplingParams(temperature=0.0), 10, None, 0)
    run._draft(torch.tensor([True]))
    # The prompt's 5 tokens went through the capture layers; 4 drafts need entries 0..7, of which
    # entries 0..4 read target features and 5..7 the head's own output.
    assert int(run.eagle.length()[0]) == 7
    assert int(run.eagle.self_fed_from[0]) == 5
    assert all(int(g.length()[0]) == 5 for g in run.eagle.captures)
    run.eagle.truncate(torch.tensor([7]))
    assert int(run.eagle.length()[0]) == 6 and int(run.eagle.self_fed_from[0]) == 5
    run.eagle.truncate(torch.tensor([5]))
    assert int(run.eagle.length()[0]) == 4 and int(run.eagle.self_fed_from[0]) == run.max_len


@pytest.mark.statistical
@pytest.mark.parametrize("spec,params", [
    ("eagle3:x,target", SamplingParams(temperature=1.0)),
    ("eagle3:x,exit:2,target", SamplingParams(temperature=0.8, top_p=0.9)),
])
def test_sampled_output_matches_target_distribution(spec, params):
    vocab, length, runs = 6, 3, 6000
    model = CausalLM.from_hf(sharpen_lm_head(tiny_llama(vocab_size=vocab, num_layers=4, hidden_size=32, seed=5), 3.0))
    head, _ = eagle3_head_for(model, 4, [1, 2, 3])  # reduced draft vocabulary: 2 target ids can never be drafted
    below = len(spec.split(",")) - 1
    gen = SpeculativeGenerator(model, parse_levels(spec, buffers=[2] * below), eagle3_head=head, validate=True)
    prompt = [1, 4, 2]
    result = gen.generate([prompt] * runs, params, max_new_tokens=length, seed=0)
    codes = torch.tensor([t[0] * vocab * vocab + t[1] * vocab + t[2] for t in result.tokens])
    counts = torch.bincount(codes, minlength=vocab**length)
    assert chi_square_p_value(counts, exact_target_prefix_probs(model, prompt, length, params)) > 1e-4
    assert result.levels[1].accepted > 0


def test_loads_an_exported_head_from_the_level_path(target, tmp_path):
    head, config = eagle3_head_for(target, 32, [2, 3, 5])
    save_eagle3_head(str(tmp_path), config, head.state_dict())
    spec = parse_levels(f"eagle3:{tmp_path},target", buffers=[3])
    a = SpeculativeGenerator(target, spec).generate(PROMPTS, SamplingParams(temperature=1.0), 8, seed=3)
    b = SpeculativeGenerator(target, spec, eagle3_head=head).generate(PROMPTS, SamplingParams(temperature=1.0), 8, seed=3)
    assert a.tokens == b.tokens and a.levels[1].accepted == b.levels[1].accepted


def test_eagle3_only_as_drafter():
    with pytest.raises(ValueError, match="drafter"):
        parse_levels("exit:1,eagle3:x,target")
