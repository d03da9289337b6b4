"""Temperature / top-k / top-p in one place, identical for every level."""

import pytest
import torch

from sglang_hsd.sampling import BatchSamplingParams, SamplingParams, logits_to_probs


def test_plain_softmax_with_temperature():
    logits = torch.randn(3, 10)
    probs = logits_to_probs(logits, SamplingParams(temperature=0.5))
    assert torch.allclose(probs, torch.softmax(logits / 0.5, -1), atol=1e-6)


def test_greedy_is_one_hot_on_argmax():
    logits = torch.randn(4, 2, 7)
    probs = logits_to_probs(logits, SamplingParams(temperature=0.0))
    assert torch.equal(probs.argmax(-1), logits.argmax(-1))
    assert torch.equal(probs.sum(-1), torch.ones(4, 2))
    assert ((probs == 0) | (probs == 1)).all()


def test_all_greedy_batch_equals_greedy_rows_of_a_mixed_batch():
    # All-greedy batches skip the masks and the softmax; rows must equal the general path's.
    logits = torch.randn(3, 4, 50, generator=torch.Generator().manual_seed(0))
    logits[0, 0, :2] = logits[0, 0].max() + 1.0  # a tie: the first index wins in both paths
    greedy = [SamplingParams(temperature=0.0, top_k=5, top_p=0.5)] * 3
    fast = logits_to_probs(logits, BatchSamplingParams.from_params(greedy))
    with_sampled_row = torch.cat([logits, logits[:1]])
    mixed = logits_to_probs(with_sampled_row, BatchSamplingParams.from_params(greedy + [SamplingParams()]))[:3]
    assert fast.dtype == torch.float32 and torch.equal(fast, mixed)
    assert fast[0, 0].argmax() == 0


def test_top_k_keeps_k_tokens_and_renormalises():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]])
    probs = logits_to_probs(logits, SamplingParams(top_k=2))
    assert (probs[0, 2:] == 0).all()
    assert torch.allclose(probs[0, :2], torch.softmax(logits[0, :2], -1))


def test_top_p_keeps_smallest_set_reaching_p():
    probs_in = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    probs = logits_to_probs(probs_in.log(), SamplingParams(top_p=0.8))
    assert torch.allclose(probs, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    probs = logits_to_probs(probs_in.log(), SamplingParams(top_p=0.81))
    assert (probs[0, :3] > 0).all() and probs[0, 3] == 0


def test_per_row_parameters_apply_to_their_row_only():
    logits = torch.randn(2, 3, 20)
    params = [SamplingParams(temperature=0.7, top_k=5), SamplingParams(temperature=1.3, top_p=0.9)]
    batch = logits_to_probs(logits, BatchSamplingParams.from_params(params))
    for row, p in enumerate(params):
        alone = logits_to_probs(logits[row : row + 1], p)
        assert torch.allclose(batch[row : row + 1], alone, atol=1e-6)


def test_mismatched_parameters_change_the_distribution():
    # The reason every level must share one SamplingParams: a level that drops top-p differs.
    logits = torch.randn(1, 50)
    with_top_p = logits_to_probs(logits, SamplingParams(temperature=0.8, top_p=0.7))
    without = logits_to_probs(logits, SamplingParams(temperature=0.8))
    assert (with_top_p - without).abs().sum() > 0.05


@pytest.mark.parametrize(
    "kwargs,match",
    [({"temperature": -1.0}, "temperature"), ({"top_p": 0.0}, "top_p"), ({"top_k": -3}, "top_k")],
)
def test_bad_parameters_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_batch_size_mismatch_is_named():
    params = BatchSamplingParams.from_params([SamplingParams()] * 3)
    with pytest.raises(ValueError, match="batch size"):
        logits_to_probs(torch.randn(2, 5), params)
