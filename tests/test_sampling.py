"""Temperature / top-k / top-p / min-p in one place, identical for every level, with the
semantics of SGLang's non-speculative sampler (top-p on the ORIGINAL row, not the one renormalised
after top-k). ``tests/sglang_plugin/test_sampling_law.py`` compares with SGLang's own function."""

import numpy as np
import pytest
import torch

from sglang_hsd.sampling import (
    BatchSamplingParams,
    SamplingFilters,
    SamplingParams,
    apply_min_p,
    filter_probs,
    logits_to_probs,
)


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


def test_top_p_keeps_tokens_whose_mass_before_is_at_most_p():
    probs_in = torch.tensor([[0.5, 0.3, 0.15, 0.05]], dtype=torch.float64)
    probs = filter_probs(probs_in, SamplingParams(top_p=0.79))
    torch.testing.assert_close(probs, torch.tensor([[0.625, 0.375, 0.0, 0.0]], dtype=torch.float64))
    probs = filter_probs(probs_in, SamplingParams(top_p=0.81))
    assert (probs[0, :3] > 0).all() and probs[0, 3] == 0


def test_top_p_reads_the_original_row_not_the_one_renormalised_after_top_k():
    # top_k 2 keeps [0.4, 0.3]; top-p 0.5 on the ORIGINAL row keeps both (mass before 0.3 is 0.4),
    # while top-p on the renormalised [4/7, 3/7] would drop the second (mass before 4/7 > 0.5).
    probs_in = torch.tensor([[0.4, 0.3, 0.2, 0.1]], dtype=torch.float64)
    probs = filter_probs(probs_in, SamplingParams(top_k=2, top_p=0.5))
    torch.testing.assert_close(probs, torch.tensor([[4.0, 3.0, 0.0, 0.0]], dtype=torch.float64) / 7)


def _sequential_law(probs: np.ndarray, top_k: int, top_p: float, min_p: float) -> np.ndarray:
    """The non-speculative sampler's law of one row, written out token by token (float64)."""
    order = sorted(range(len(probs)), key=lambda v: -probs[v])
    kept, before = np.zeros_like(probs), 0.0
    for rank, v in enumerate(order):
        if (top_k <= 0 or rank < top_k) and (top_p >= 1 or before <= top_p) \
                and probs[v] >= min_p * probs[order[0]]:
            kept[v] = probs[v]
        before += probs[v]
    return kept / kept.sum()


@pytest.mark.parametrize("seed", range(4))
def test_filter_probs_is_the_sequential_law_for_every_parameter_class(seed):
    gen = torch.Generator().manual_seed(seed)
    classes = [(0, 1.0, 0.0), (5, 1.0, 0.0), (0, 0.7, 0.0), (0, 1.0, 0.1), (8, 0.6, 0.0),
               (20, 0.8, 0.05), (3, 0.95, 0.3), (1, 0.5, 0.0), (40, 0.95, 0.0)]
    probs = torch.softmax(torch.randn(len(classes), 60, generator=gen, dtype=torch.float64) * 2.5, -1)
    params = BatchSamplingParams(torch.ones(len(classes)), torch.tensor([c[0] for c in classes]),
                                 torch.tensor([c[1] for c in classes], dtype=torch.float64),
                                 torch.tensor([c[2] for c in classes], dtype=torch.float64))
    got = filter_probs(probs, params)
    for row, (top_k, top_p, min_p) in enumerate(classes):
        expected = _sequential_law(probs[row].numpy(), top_k, top_p, min_p)
        np.testing.assert_allclose(got[row].numpy(), expected, rtol=0, atol=1e-15)


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
    [({"temperature": -1.0}, "temperature"), ({"top_p": 0.0}, "top_p"), ({"top_k": -3}, "top_k"),
     ({"min_p": -0.1}, "min_p"), ({"min_p": 1.5}, "min_p"), ({"min_p": float("nan")}, "min_p")],
)
def test_bad_parameters_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_batch_size_mismatch_is_named():
    params = BatchSamplingParams.from_params([SamplingParams()] * 3)
    with pytest.raises(ValueError, match="batch size"):
        logits_to_probs(torch.randn(2, 5), params)


def test_min_p_drops_tokens_below_a_fraction_of_the_top_one():
    probs_in = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    probs = logits_to_probs(probs_in.log(), SamplingParams(min_p=0.29))  # threshold 0.145
    torch.testing.assert_close(probs, torch.tensor([[0.5, 0.3, 0.15, 0.0]]) / 0.95)
    probs = logits_to_probs(probs_in.log(), SamplingParams(min_p=0.31))
    torch.testing.assert_close(probs, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    assert torch.equal(logits_to_probs(probs_in.log(), SamplingParams(min_p=1.0)), torch.tensor([[1.0, 0, 0, 0]]))


def test_min_p_applies_after_top_p():
    # The order changes the set: min-p first would drop 0.1 and then top-p 0.75 would keep two
    # tokens of the renormalised [4, 3, 2] / 9; top-p first keeps three and min-p 0.3 keeps them.
    probs_in = torch.tensor([[0.4, 0.3, 0.2, 0.1]], dtype=torch.float64)
    probs = logits_to_probs(probs_in.log(), SamplingParams(top_p=0.75, min_p=0.3))
    torch.testing.assert_close(probs, torch.tensor([[4.0, 3.0, 2.0, 0.0]]) / 9)


def test_min_p_zero_rows_are_untouched_in_a_min_p_batch():
    logits = torch.randn(2, 3, 40, generator=torch.Generator().manual_seed(1))
    params = BatchSamplingParams.from_params([SamplingParams(temperature=0.9), SamplingParams(min_p=0.2)])
    probs = logits_to_probs(logits, params)
    assert torch.equal(probs[0], torch.softmax(logits[0] / 0.9, -1))
    assert (probs[1] == 0).any() and torch.allclose(probs[1].sum(-1), torch.ones(3))
    assert torch.equal(apply_min_p(probs, torch.zeros(2)), probs)


MIXED = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.7, top_k=5),
         SamplingParams(temperature=1.2, top_p=0.8), SamplingParams(min_p=0.1),
         SamplingParams(temperature=0.9, top_k=20, top_p=0.9, min_p=0.05), SamplingParams()]


@pytest.fixture
def no_host_sync(monkeypatch):
    """Reading a tensor back to the host raises inside the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("host synchronisation")

    for name in ("__bool__", "item", "tolist", "__int__", "__float__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, refuse)


@pytest.mark.parametrize("shape", [(6, 64), (6, 3, 64)])
def test_flagged_path_reads_nothing_back_and_equals_the_unflagged_one(shape, request):
    logits = torch.randn(*shape, generator=torch.Generator().manual_seed(2)) * 3
    params = BatchSamplingParams.from_params(MIXED)
    unflagged = logits_to_probs(logits, params)
    filters = SamplingFilters.of(params, shape[-1])
    assert filters == SamplingFilters(top_k=True, top_p=True, min_p=True, all_greedy=False, any_greedy=True)
    request.getfixturevalue("no_host_sync")
    with pytest.raises(AssertionError, match="host synchronisation"):  # the fixture bites
        bool(params.top_k.any())
    assert torch.equal(logits_to_probs(logits, params, filters), unflagged)


def test_flags_may_over_ask_but_an_unset_flag_skips_its_step():
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(3))
    plain = BatchSamplingParams.from_params([SamplingParams(temperature=0.8)] * 4)
    everything = SamplingFilters(top_k=True, top_p=True, min_p=True, all_greedy=False, any_greedy=True)
    assert torch.equal(logits_to_probs(logits, plain, everything), logits_to_probs(logits, plain))
    with_min_p = BatchSamplingParams.from_params([SamplingParams(min_p=0.5)] * 4)
    skipped = SamplingFilters(top_k=False, top_p=False, min_p=False, all_greedy=False, any_greedy=False)
    assert torch.equal(logits_to_probs(logits, with_min_p, skipped), torch.softmax(logits, -1))
    assert not torch.equal(logits_to_probs(logits, with_min_p), torch.softmax(logits, -1))


def test_all_greedy_flag_returns_one_hot_rows(no_host_sync):
    logits = torch.randn(3, 2, 9, generator=torch.Generator().manual_seed(4))
    params = BatchSamplingParams.from_params([SamplingParams(temperature=0.0)] * 3)
    filters = SamplingFilters(top_k=False, top_p=False, min_p=False, all_greedy=True, any_greedy=True)
    probs = logits_to_probs(logits, params, filters)
    assert torch.equal(probs, torch.zeros(3, 2, 9).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0))


def test_a_top_k_bound_sorts_only_the_leading_entries_with_the_same_rows():
    """``SamplingFilters.max_top_k`` (SGLang's bound on every row's top_k): ``torch.topk`` of that
    many entries instead of a sort of the whole row, the same kept tokens and probabilities."""
    probs = torch.softmax(torch.randn(4, 3, 500, generator=torch.Generator().manual_seed(6)) * 2, -1)
    params = BatchSamplingParams(torch.ones(4), torch.tensor([20, 40, 1, 7]), torch.tensor([0.8, 0.95, 1.0, 0.5]),
                                 torch.tensor([0.0, 0.05, 0.0, 0.0]))
    full = filter_probs(probs, params, SamplingFilters(True, True, True, False, False))
    bounded = filter_probs(probs, params, SamplingFilters(True, True, True, False, False, max_top_k=40))
    assert torch.equal(bounded, full)
    assert ((full > 0).sum(-1) <= params.top_k.view(-1, 1)).all()
