"""The draft sampler's draw on CPU (``cpu/cpu_sampling.make_draft_fast_sample``): one draw per row
by inverse transform sampling, installed as ``spec_utils.fast_sample`` by ``register()``.

Law: a batch of rows from four context-dependent q (different supports, zero entries, a row whose
mass is not 1) drawn many times; each q's draws pass a chi-square test against q / sum(q), while a
plausible wrong race (``argmax(q / u)`` with uniforms instead of exponentials, which favours the
likely tokens) fails the same test. The exact map from a uniform to a token is the tree drafter's
``sequential_draws`` (``tests/tree_draft``); here the wiring is tested: q's own rows, the probability
returned beside each draw, SGLang's draft proposal (greedy rows still take the argmax), and seeded
or multi-draw calls left to SGLang.
"""

from __future__ import annotations

import pytest
import torch

from sglang_hsd.sglang_plugin.cpu import cpu_sampling
from sglang_hsd.verify.oracles.stats import chi_square_p_value
from tests.sglang_plugin.plugin_fixtures import plugin_loaded  # noqa: F401 (fixture)

# Four q rows over 8 tokens, as a drafter's rows in different contexts; the third sums to 0.8.
Q = torch.tensor([
    [0.40, 0.20, 0.15, 0.10, 0.06, 0.05, 0.03, 0.01],
    [0.00, 0.50, 0.00, 0.25, 0.00, 0.125, 0.0625, 0.0625],
    [0.02, 0.02, 0.02, 0.02, 0.02, 0.10, 0.20, 0.40],
    [0.90, 0.00, 0.00, 0.00, 0.00, 0.00, 0.00, 0.10],
])
DRAWS = 40_000  # per q


def _never_called(*args, **kwargs):
    raise AssertionError("the unseeded single draw must not reach SGLang's sampler")


def _wrong_race(probs, num_samples=1, **kwargs):
    """A plausible mistake: the race with uniforms where exponentials belong."""
    index = (probs / torch.rand_like(probs)).argmax(-1, keepdim=True)
    return probs.gather(1, index), index


def _p_values(fast_sample) -> list[float]:
    torch.manual_seed(0)
    probs = Q.repeat_interleave(DRAWS, dim=0)
    drawn_p, index = fast_sample(probs, 1)
    assert index.shape == (len(probs), 1) and index.dtype == torch.int64
    torch.testing.assert_close(drawn_p, probs.gather(1, index))
    tokens = index.view(len(Q), DRAWS)
    p_values = []
    for row, q in enumerate(Q):
        counts = torch.bincount(tokens[row], minlength=q.numel()).double()
        assert counts[q == 0].sum() == 0, "a zero-probability token was drawn"
        p_values.append(chi_square_p_value(counts, q.double() / q.sum()))
    return p_values


def test_inverse_transform_draws_follow_q_and_a_uniform_race_does_not():
    ours = _p_values(cpu_sampling.make_draft_fast_sample(_never_called))
    assert min(ours) > 1e-3, ours
    wrong = _p_values(_wrong_race)
    assert min(wrong) < 1e-12, wrong


def test_seeded_and_multi_draw_calls_keep_sglangs_sampler():
    calls = []

    def original(probs, num_samples=1, *, sampling_seed=None, positions=None, draft_step=0):
        calls.append((num_samples, sampling_seed is not None))
        return probs[:, :num_samples], torch.zeros(len(probs), num_samples, dtype=torch.int64)

    fast_sample = cpu_sampling.make_draft_fast_sample(original)
    fast_sample(Q, 2)
    fast_sample(Q, 1, sampling_seed=torch.arange(4), positions=torch.arange(4))
    assert calls == [(2, False), (1, True)]
    assert fast_sample.__sglang_hsd_original__ is original


def test_sglangs_draft_proposal_draws_through_it_and_greedy_rows_take_the_argmax(plugin_loaded):  # noqa: F811
    from sglang.srt.speculative import spec_utils

    assert spec_utils.fast_sample.__sglang_hsd_original__ is not None
    torch.manual_seed(1)
    logits = torch.log(Q.repeat_interleave(2000, dim=0).clamp_min(1e-30))
    top_ks = torch.tensor([1, 1 << 30]).repeat(len(logits) // 2)  # greedy, sampled (SGLang: no top-k), ...
    probs, drawn_p, index = spec_utils.sample_draft_proposal(logits, torch.ones(len(logits), 1), top_ks)
    torch.testing.assert_close(drawn_p, probs.gather(1, index))
    greedy = top_ks == 1
    assert torch.equal(index[greedy, 0], probs[greedy].argmax(-1))
    sampled = index[~greedy, 0].view(len(Q), 1000)
    for row, q in enumerate(Q):
        counts = torch.bincount(sampled[row], minlength=q.numel())
        assert chi_square_p_value(counts, q.double() / q.sum()) > 1e-3
