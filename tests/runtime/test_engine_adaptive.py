"""The engine with an adaptive draft length (``sglang_hsd/draft_length.py``): greedy output equals
the target's for every drafter kind and depth, greedy drafts stop on the drafter's raw confidence, the sampled 3-token law equals the target's, the
statistics record the draft lengths, windowed rounds refuse it."""

import pytest
import torch

pytest.importorskip("transformers")

from sglang_hsd.draft_length import DraftLengthRule  # noqa: E402
from sglang_hsd.runtime.config import HierarchyConfig, parse_levels  # noqa: E402
from sglang_hsd.runtime.engine import SpeculativeGenerator  # noqa: E402
from sglang_hsd.runtime.model import CausalLM  # noqa: E402
from sglang_hsd.runtime.testing import greedy_reference, tiny_llama  # noqa: E402
from sglang_hsd.sampling import SamplingParams  # noqa: E402
from sglang_hsd.verify.oracles.stats import chi_square_p_value  # noqa: E402
from tests.runtime.helpers import PROMPTS, eagle3_head_for, exact_target_prefix_probs, sharpen_lm_head  # noqa: E402

ADAPTIVE = DraftLengthRule("adaptive", threshold=0.5, min_length=1, max_length=6, grow=2)


def _generator(target, spec, buffers, method="hsd", rule=ADAPTIVE):
    kwargs = {}
    if spec.startswith("model"):
        small = tiny_llama(vocab_size=target.vocab_size, num_layers=2, hidden_size=32, seed=2)
        kwargs["drafter"] = CausalLM.from_hf(sharpen_lm_head(small, 4.0))
    if spec.startswith("eagle3"):
        kwargs["eagle3_head"] = eagle3_head_for(target, target.vocab_size, [2, 3, 5])[0]
    config = parse_levels(spec, buffers=buffers, methods=[method], draft_length=rule)
    return SpeculativeGenerator(target, config, validate=True, **kwargs)


@pytest.mark.parametrize("spec,buffers", [
    ("exit:2,target", [3]),
    ("exit:1,exit:3,target", [3, 4]),
    ("model:tiny,target", [3]),
    ("eagle3:x,target", [3]),
    ("eagle3:x,exit:4,target", [2, 3]),
])
@pytest.mark.parametrize("method", ["hsd", "tokenwise", "greedy"])
def test_greedy_output_equals_target_greedy(target, spec, buffers, method):
    gen = _generator(target, spec, buffers, method)
    result = gen.generate(PROMPTS, SamplingParams(temperature=0.0), max_new_tokens=14)
    for prompt, out in zip(PROMPTS, result.tokens):
        assert out == greedy_reference(target, prompt, 14), spec
    drafter = result.levels[0]
    assert drafter.drafts > 0 and 1 <= drafter.mean_draft_length <= ADAPTIVE.max_length


@pytest.mark.parametrize("spec", ["exit:2,target", "model:tiny,target", "eagle3:x,target"])
def test_greedy_drafts_stop_on_the_drafters_raw_confidence(target, spec):
    # At T = 0 q is one-hot (q(x_t) = 1): only the raw softmax can stop a draft. Against the same
    # rule with threshold 0 (cap adaptation only), drafts must get shorter, output stay the target's.
    params, runs = SamplingParams(temperature=0.0), {}
    for threshold in (0.0, ADAPTIVE.threshold):
        rule = DraftLengthRule("adaptive", threshold=threshold, min_length=1, max_length=6, grow=2)
        result = _generator(target, spec, [3], rule=rule).generate(PROMPTS, params, max_new_tokens=14)
        for prompt, out in zip(PROMPTS, result.tokens):
            assert out == greedy_reference(target, prompt, 14), (spec, threshold)
        runs[threshold] = result.levels[0].mean_draft_length
    assert 1 < runs[ADAPTIVE.threshold] < ADAPTIVE.max_length
    assert runs[ADAPTIVE.threshold] < runs[0.0]


def test_sampled_drafts_stop_early_and_stats_record_it(target):
    gen = _generator(target, "exit:2,target", [3])
    result = gen.generate(PROMPTS, SamplingParams(temperature=1.0), max_new_tokens=16, seed=1)
    drafter, top = result.levels
    assert drafter.proposed == top.proposed and drafter.drafts == top.rounds  # one target round per draft
    assert 1 < drafter.mean_draft_length < ADAPTIVE.max_length
    assert result.as_dict()["levels"][0]["mean_draft_length"] == drafter.mean_draft_length
    assert "draft length" in result.summary()
    fixed = _generator(target, "exit:2,target", [3], rule=DraftLengthRule()).generate(
        PROMPTS, SamplingParams(temperature=1.0), max_new_tokens=16, seed=1)
    assert fixed.levels[0].mean_draft_length == 3


@pytest.mark.statistical
@pytest.mark.parametrize("spec,params", [
    ("exit:2,target", SamplingParams(temperature=1.0)),
    ("exit:1,exit:3,target", SamplingParams(temperature=0.8, top_p=0.9)),
    ("eagle3:x,target", SamplingParams(temperature=1.0)),
])
@pytest.mark.parametrize("method", ["hsd", "tokenwise"])
def test_sampled_output_matches_target_distribution(spec, params, method):
    vocab, length, runs = 6, 3, 6000
    model = CausalLM.from_hf(sharpen_lm_head(tiny_llama(vocab_size=vocab, num_layers=4, hidden_size=32, seed=5), 3.0))
    rule = DraftLengthRule("adaptive", threshold=0.5, min_length=1, max_length=3, grow=1)
    below = len(spec.split(",")) - 1
    head = eagle3_head_for(model, 4, [1, 2, 3])[0] if spec.startswith("eagle3") else None
    gen = SpeculativeGenerator(model, parse_levels(spec, [2] * below, [method], draft_length=rule), validate=True,
                               eagle3_head=head)
    prompt = [1, 4, 2]
    result = gen.generate([prompt] * runs, params, max_new_tokens=length, seed=0)
    codes = torch.tensor([t[0] * vocab * vocab + t[1] * vocab + t[2] for t in result.tokens])
    counts = torch.bincount(codes, minlength=vocab**length)
    assert chi_square_p_value(counts, exact_target_prefix_probs(model, prompt, length, params)) > 1e-4
    drafter = result.levels[0]
    assert 1 < drafter.mean_draft_length < rule.max_length  # stops early, and not always
    assert result.levels[-1].accepted > 0


def test_windowed_rounds_refuse_adaptive_draft_length():
    with pytest.raises(ValueError, match="window=True needs draft_length 'fixed'"):
        parse_levels("exit:1,exit:3,target", [3, 3], window=True, draft_length=ADAPTIVE)
    with pytest.raises(ValueError, match="draft_length"):
        HierarchyConfig(parse_levels("exit:1,target").levels, draft_length="adaptive")


@pytest.mark.statistical
def test_sampled_test_catches_dropping_the_low_probability_token(monkeypatch):
    # Teeth: drop each draft's last token when its draft probability is below the threshold
    # (deciding on a token, then discarding it): the same chi-square test must fail.
    from sglang_hsd.runtime.engine import _Run

    vocab, length, runs = 6, 3, 6000
    model = CausalLM.from_hf(sharpen_lm_head(tiny_llama(vocab_size=vocab, num_layers=4, hidden_size=32, seed=5), 3.0))
    rule = DraftLengthRule("adaptive", threshold=0.5, min_length=1, max_length=3, grow=1)
    original = _Run.draft_tokens

    def dropping(run, rows, base, features_upto):
        original(run, rows, base, features_upto)
        last = run.seq_len - 1
        slot = (last - run.buf_start[0]).clamp(0, run.caps[0] - 1)  # rows that drafted: their last draft
        q_last = run.buf_probs[0][torch.arange(len(last)), slot]
        low = q_last.gather(1, run.tokens.gather(1, last.unsqueeze(-1))).squeeze(-1) < rule.threshold
        drop = rows & low & (run.seq_len - base >= 2)
        run.seq_len -= drop.long()
        run.rollback(run.seq_len.clone())

    monkeypatch.setattr(_Run, "draft_tokens", dropping)
    gen = SpeculativeGenerator(model, parse_levels("exit:2,target", [2], draft_length=rule))
    params = SamplingParams(temperature=1.0)
    result = gen.generate([[1, 4, 2]] * runs, params, max_new_tokens=length, seed=0)
    codes = torch.tensor([t[0] * vocab * vocab + t[1] * vocab + t[2] for t in result.tokens])
    counts = torch.bincount(codes, minlength=vocab**length)
    assert chi_square_p_value(counts, exact_target_prefix_probs(model, [1, 4, 2], length, params)) < 1e-6
