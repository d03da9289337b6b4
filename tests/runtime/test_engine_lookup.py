"""The runtime with a ``lookup`` drafter: greedy output equal to the target's, the sampled law
(chi-square on 3-token prefixes), and the configurations it refuses. The round's exact law is
enumerated in ``tests/verify/oracles/test_lookup_exact.py``."""

import pytest
import torch

from sglang_hsd.draft_length import DraftLengthRule
from sglang_hsd.runtime.config import parse_levels
from sglang_hsd.runtime.engine import SpeculativeGenerator
from sglang_hsd.runtime.model import CausalLM
from sglang_hsd.runtime.testing import greedy_reference, tiny_llama
from sglang_hsd.sampling import SamplingParams
from sglang_hsd.verify.oracles.stats import chi_square_p_value
from tests.runtime.helpers import exact_target_prefix_probs, sharpen_lm_head

pytest.importorskip("transformers")

# Prompts that repeat themselves, so the lookup has something to copy.
REPEATING = [[3, 9, 4, 3, 9, 4, 3, 9], [7, 1, 7, 1, 7], [5, 6, 2, 8, 5, 6, 2], [11]]


@pytest.fixture(scope="module")
def small_drafter():
    return CausalLM.from_hf(sharpen_lm_head(tiny_llama(vocab_size=48, num_layers=2, hidden_size=32, seed=2), 4.0))


@pytest.mark.parametrize("spec,buffers", [
    ("lookup:3,model:small,target", [3, 4]),
    ("lookup:2,model:small,target", [4, 2]),
    ("lookup:2,target", [4]),
])
@pytest.mark.parametrize("method", ["hsd", "tokenwise", "greedy"])
def test_greedy_output_equals_target_greedy(target, small_drafter, spec, buffers, method):
    gen = SpeculativeGenerator(target, parse_levels(spec, buffers=buffers, methods=[method]),
                               drafter=small_drafter if "model" in spec else None, validate=True)
    result = gen.generate(REPEATING, SamplingParams(temperature=0.0), max_new_tokens=14)
    for prompt, out in zip(REPEATING, result.tokens):
        assert out == greedy_reference(target, prompt, 14), spec
    lookup = result.levels[0]
    assert lookup.name == spec.split(",")[0] and lookup.drafts > 0 and lookup.proposed > 0


def test_accepted_copies_save_forwards_of_the_middle_model(target):
    """Each middle forward hands up its accepted copies plus its own token: with the target as the
    middle model on a looping prompt, some tokens come without a forward of their own (the
    middle's forwards are fewer than the tokens it hands up; a drafter needs one per token)."""
    gen = SpeculativeGenerator(target, parse_levels("lookup:3,model:self,target", buffers=[4, 6]), drafter=target)
    result = gen.generate([[3, 9, 4] * 6], SamplingParams(temperature=0.0), max_new_tokens=24)
    lookup, middle = result.levels[0], result.levels[1]
    assert lookup.proposed > 0 and middle.accepted > 0  # tokens handed up: accepted + rounds > rounds


@pytest.mark.statistical
@pytest.mark.parametrize("spec,params", [
    ("lookup:2,model:d,target", SamplingParams(temperature=1.0)),
    ("lookup:3,model:d,target", SamplingParams(temperature=0.8, top_p=0.9)),
    ("lookup:2,target", SamplingParams(temperature=1.0)),
])
def test_sampled_output_matches_target_distribution(spec, params):
    vocab, length, runs = 6, 3, 6000
    model = CausalLM.from_hf(sharpen_lm_head(tiny_llama(vocab_size=vocab, num_layers=4, hidden_size=32, seed=5), 3.0))
    drafter = CausalLM.from_hf(sharpen_lm_head(tiny_llama(vocab_size=vocab, num_layers=1, hidden_size=32, seed=6), 3.0))
    below = len(spec.split(",")) - 1
    gen = SpeculativeGenerator(model, parse_levels(spec, buffers=[2] * below), drafter=drafter, validate=True)
    prompt = [1, 4, 2, 1, 4]
    result = gen.generate([prompt] * runs, params, max_new_tokens=length, seed=0)
    codes = torch.tensor([t[0] * vocab * vocab + t[1] * vocab + t[2] for t in result.tokens])
    counts = torch.bincount(codes, minlength=vocab**length)
    expected = exact_target_prefix_probs(model, prompt, length, params)
    assert chi_square_p_value(counts, expected) > 1e-4
    assert result.levels[0].proposed > 0 and result.levels[1].accepted > 0  # copies were verified


def test_lookup_configurations_that_cannot_run_are_refused():
    with pytest.raises(ValueError, match="'lookup' level can only be the drafter"):
        parse_levels("exit:1,lookup,target")
    with pytest.raises(ValueError, match="verifies a 'lookup' drafter right below it"):
        parse_levels("exit:1,model:x,target")
    with pytest.raises(ValueError, match="verifies a 'lookup' drafter right below it"):
        parse_levels("lookup,exit:1,model:x,target")
    with pytest.raises(ValueError, match="draft_length 'fixed'"):
        parse_levels("lookup,target", draft_length=DraftLengthRule("adaptive"))
    with pytest.raises(ValueError, match="one 'exit' level"):
        parse_levels("lookup,model:x,target", window=True)
    with pytest.raises(ValueError, match="lookup:<longest n-gram>"):
        parse_levels("lookup:x,target")
    with pytest.raises(ValueError, match="ngram >= 1"):
        parse_levels("lookup:0,target")
    with pytest.raises(ValueError, match="tree needs two levels"):
        from sglang_hsd.tree_draft import TreeShape
        parse_levels("lookup,target", tree=TreeShape(2, 2, 4))
