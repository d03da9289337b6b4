"""``--hsd-request-seeds`` (``sglang_plugin/request_seeds.py``): stream seeds per request, the
batches that get them, the refusal of a sampler without seeds, and SGLang's torch sampler taking
min-p with a seed (its law is the unseeded sampler's). The server test is in
``test_request_seeds_server.py``."""

from __future__ import annotations

import types

import pytest
import torch

from sglang_hsd.sglang_plugin import request_seeds
from sglang_hsd.verify.oracles.stats import chi_square_p_value
from tests.sglang_plugin.plugin_fixtures import args_namespace, plugin_loaded  # noqa: F401

pytestmark = pytest.mark.sglang
P_VALUE_FLOOR = 1e-4


def test_stream_seeds_are_the_requests_own_or_a_stable_hash_of_server_seed_and_id():
    seed = request_seeds.request_stream_seed
    assert seed("a", 1234, 0) == 1234
    derived = {seed(f"rid{i}", None, 7) for i in range(100)}
    assert len(derived) == 100 and all(0 <= s < 2**62 for s in derived)
    assert seed("rid1", None, 7) == seed("rid1", None, 7) != seed("rid1", None, 8)


def _fake_batch(algorithm="HSD", own_seed=99):
    reqs = [types.SimpleNamespace(rid="x", sampling_params=types.SimpleNamespace(sampling_seed=None)),
            types.SimpleNamespace(rid="y", sampling_params=types.SimpleNamespace(sampling_seed=own_seed))]
    return types.SimpleNamespace(reqs=reqs, device="cpu", spec_algorithm=types.SimpleNamespace(name=algorithm))


@pytest.mark.parametrize("enabled, algorithm, own_seed, seeded", [
    (True, "HSD", 99, True), (False, "HSD", 99, False), (True, "EAGLE3", 99, False),
    (True, "HSD", None, False),  # no request carries a seed: the batch is left alone
])
def test_hsd_batches_with_a_seeded_request_get_stream_seeds(enabled, algorithm, own_seed, seeded):
    build = request_seeds.seeded_from_schedule_batch(
        lambda cls, batch, vocab: types.SimpleNamespace(sampling_seed=None), lambda: 5, lambda: enabled)
    info = build(None, _fake_batch(algorithm, own_seed), 32)
    if not seeded:
        assert info.sampling_seed is None
        return
    assert info.sampling_seed.tolist() == [request_seeds.request_stream_seed("x", None, 5), 99]


def test_seeds_sglang_already_set_are_kept():
    mine = torch.tensor([1, 2])
    build = request_seeds.seeded_from_schedule_batch(
        lambda cls, batch, vocab: types.SimpleNamespace(sampling_seed=mine), lambda: 5, lambda: True)
    assert build(None, _fake_batch(), 32).sampling_seed is mine


def _schedule_batch(own_seeds, seeds=None):
    reqs = [types.SimpleNamespace(rid=f"r{i}", sampling_params=types.SimpleNamespace(sampling_seed=seed))
            for i, seed in enumerate(own_seeds)]
    info = types.SimpleNamespace(sampling_seed=seeds)
    return types.SimpleNamespace(reqs=reqs, device="cpu", sampling_info=info,
                                 spec_algorithm=types.SimpleNamespace(name="HSD"))


def test_a_seeded_batch_merged_with_an_unseeded_one_seeds_both_sides():
    """SGLang's merge keeps seeds only when both sides have them; the wrapper seeds the other."""
    merged = []
    merge = request_seeds.seeded_merge_batch(lambda a, b: merged.append((a, b)), lambda: 5, lambda: True)
    running, joining = _schedule_batch([None, None]), _schedule_batch([3], torch.tensor([3]))
    merge(running, joining)
    assert merged == [(running, joining)]
    assert running.sampling_info.sampling_seed.tolist() == [
        request_seeds.request_stream_seed(f"r{i}", None, 5) for i in range(2)]
    plain_a, plain_b = _schedule_batch([None]), _schedule_batch([None])
    merge(plain_a, plain_b)  # nothing seeded: nothing changes
    assert plain_a.sampling_info.sampling_seed is None and plain_b.sampling_info.sampling_seed is None


@pytest.mark.parametrize("left, kept", [([None, 4], True), ([None, None], False)])
def test_filtering_drops_seeds_when_no_seeded_request_is_left(left, kept):
    batch = _schedule_batch([None, 4, None], torch.tensor([1, 4, 2]))

    def keep(self, keep_indices=None):
        self.reqs = [self.reqs[i] for i in keep_indices]
        self.sampling_info.sampling_seed = self.sampling_info.sampling_seed[keep_indices]

    filter_batch = request_seeds.seeded_filter_batch(keep, lambda: True)
    filter_batch(batch, keep_indices=[0, 1] if left[1] else [0, 2])
    assert (batch.sampling_info.sampling_seed is not None) is kept


@pytest.mark.parametrize("env, device, backend, enabled", [
    ("auto", "cpu", None, True), ("auto", "cuda", None, False), ("auto", "cuda", "pytorch", True),
    ("auto", "cpu", "flashinfer", False), ("on", "cpu", None, True), ("off", "cpu", None, False),
])
def test_auto_is_on_where_the_sampler_takes_seeds(monkeypatch, env, device, backend, enabled):
    monkeypatch.setenv(request_seeds.REQUEST_SEEDS_ENV, env)
    assert request_seeds.request_seeds_enabled(device, backend) is enabled


def test_seeded_drafts_take_the_targets_keys(monkeypatch):
    """A seeded draft is the keyed draw at the position SGLang's draft path passes (its input
    token's, the key of the target's row that draws the same token); unseeded and multi-draw
    calls go to SGLang's."""
    from sglang_hsd.sglang_plugin import verify_hook
    from sglang_hsd.verify.coupled import keyed_draw

    calls = []
    monkeypatch.setattr(verify_hook, "hsd_is_active", lambda: True)
    sample = request_seeds.coupled_draft_sample(lambda *a, **k: calls.append(a) or "sglang")
    probs = torch.rand(3, 50, dtype=torch.float64)
    seed, positions = torch.tensor([1, 2, 3]), torch.tensor([10, 11, 12])
    p, index = sample(probs, 1, sampling_seed=seed, positions=positions, draft_step=2)
    assert torch.equal(index.view(-1), keyed_draw(probs, seed, positions))
    assert torch.equal(p, probs.gather(1, index))
    assert sample(probs, 1) == "sglang" and sample(probs, 2, sampling_seed=seed, positions=positions) == "sglang"
    monkeypatch.setattr(verify_hook, "hsd_is_active", lambda: False)
    assert sample(probs, 1, sampling_seed=seed, positions=positions) == "sglang"


@pytest.mark.parametrize("env, overrides, says", [
    ("on", dict(device="cuda"), "--sampling-backend pytorch"),
    ("on", dict(device="cuda", sampling_backend="flashinfer"), "flashinfer"),
    ("maybe", dict(), "must be one of auto, on, off"),
])
def test_refusals_name_the_flag(plugin_loaded, monkeypatch, env, overrides, says):
    from sglang_hsd.sglang_plugin.server_args import request_seed_problems

    monkeypatch.setenv(request_seeds.REQUEST_SEEDS_ENV, env)
    problems = request_seed_problems(args_namespace(**overrides))
    assert len(problems) == 1 and says in problems[0]
    monkeypatch.setenv(request_seeds.REQUEST_SEEDS_ENV, "on")
    assert request_seed_problems(args_namespace(device="cuda", sampling_backend="pytorch")) == []
    assert request_seed_problems(args_namespace(device="cpu")) == []
    monkeypatch.setenv(request_seeds.REQUEST_SEEDS_ENV, "auto")  # the default: off there, not refused
    assert request_seed_problems(args_namespace(device="cuda")) == []


def test_keyed_draws_are_sglangs_seeded_draws(plugin_loaded):
    """``verify/coupled.keyed_draw`` draws what SGLang's ``multinomial_with_seed`` draws for the
    same rows, seeds and positions (the unfiltered sampler's keys): a seeded request's first token
    (SGLang's sampler) and the rest (the coupled rule) come from one stream."""
    from sglang.srt.layers.sampler import multinomial_with_seed

    from sglang_hsd.verify.coupled import keyed_draw

    gen = torch.Generator().manual_seed(1)
    probs = torch.softmax(torch.randn(64, 300, generator=gen), -1)
    probs[:, 100:] *= (torch.rand(64, 200, generator=gen) > 0.5)  # zeros, as filters leave them
    seeds = torch.randint(0, 2**40, (64,), generator=gen)
    positions = torch.randint(0, 5000, (64,), generator=gen)
    sglang = multinomial_with_seed(probs.to(torch.float64).log(), seeds, positions).view(-1)
    assert torch.equal(keyed_draw(probs, seeds, positions), sglang.to(torch.int64))


def test_seeded_min_p_sampling_has_the_unseeded_law(plugin_loaded):
    """SGLang's torch sampler refuses min-p with a seed; wrapped, it applies min-p first and the
    seeded draws follow the law its unseeded path filters to (top-k, top-p and min-p)."""
    from sglang.srt.layers import sampler

    wrapped = sampler.top_k_top_p_min_p_sampling_from_probs_torch
    original = wrapped.__sglang_hsd_original__
    rows, vocab = 20_000, 12
    gen = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(1, vocab, generator=gen) * 1.5, -1).expand(rows, -1).contiguous()
    top_ks, top_ps = torch.full((rows,), 8), torch.full((rows,), 0.95)
    min_ps = torch.full((rows,), 0.2)
    with pytest.raises(AssertionError):  # SGLang's own seeded path with min-p
        original(probs[:2], top_ks[:2], top_ps[:2], min_ps[:2], True, torch.tensor([1, 2]), torch.zeros(2, dtype=torch.long))
    # The law: the unseeded path's filtered weights, normalised.
    weights, order, _ = original(probs[:1], top_ks[:1], top_ps[:1], min_ps[:1], True, None, None,
                                 return_filtered_probs=True)[1:]
    law = torch.zeros(vocab, dtype=torch.float64).scatter_(0, order[0], weights[0].double())
    law /= law.sum()
    tokens = wrapped(probs, top_ks, top_ps, min_ps, True, torch.arange(rows), torch.zeros(rows, dtype=torch.long))
    counts = torch.bincount(tokens.view(-1), minlength=vocab)
    assert int(counts[law == 0].sum()) == 0
    assert chi_square_p_value(counts, law) > P_VALUE_FLOOR


@pytest.mark.parametrize("random_seed, expected", [(None, 0), (42, 42)])
def test_server_seed_without_random_seed_is_zero_not_a_crash(plugin_loaded, monkeypatch, random_seed, expected):
    """A server started without ``--random-seed`` (as ``sglang-hsd serve`` starts it) has no seed
    in the scheduler's context; ``int(None)`` there killed the scheduler at the first request."""
    from sglang.srt import runtime_context

    monkeypatch.setattr(runtime_context, "get_server_args",
                        lambda: types.SimpleNamespace(random_seed=random_seed))
    assert request_seeds.server_seed() == expected
    seeds = request_seeds.batch_stream_seeds(_fake_batch().reqs, request_seeds.server_seed(), "cpu")
    assert seeds[1] == 99 and 0 <= seeds[0] < 2**62
