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


def _fake_batch(algorithm="HSD"):
    reqs = [types.SimpleNamespace(rid="x", sampling_params=types.SimpleNamespace(sampling_seed=None)),
            types.SimpleNamespace(rid="y", sampling_params=types.SimpleNamespace(sampling_seed=99))]
    return types.SimpleNamespace(reqs=reqs, device="cpu", spec_algorithm=types.SimpleNamespace(name=algorithm))


@pytest.mark.parametrize("flag, algorithm, seeded", [("on", "HSD", True), ("off", "HSD", False),
                                                     ("on", "EAGLE3", False)])
def test_hsd_batches_get_stream_seeds_when_the_flag_is_on(monkeypatch, flag, algorithm, seeded):
    monkeypatch.setenv(request_seeds.REQUEST_SEEDS_ENV, flag)
    build = request_seeds.seeded_from_schedule_batch(
        lambda cls, batch, vocab: types.SimpleNamespace(sampling_seed=None), lambda: 5)
    info = build(None, _fake_batch(algorithm), 32)
    if not seeded:
        assert info.sampling_seed is None
        return
    assert info.sampling_seed.tolist() == [request_seeds.request_stream_seed("x", None, 5), 99]


def test_seeds_sglang_already_set_are_kept(monkeypatch):
    monkeypatch.setenv(request_seeds.REQUEST_SEEDS_ENV, "on")
    mine = torch.tensor([1, 2])
    build = request_seeds.seeded_from_schedule_batch(
        lambda cls, batch, vocab: types.SimpleNamespace(sampling_seed=mine), lambda: 5)
    assert build(None, _fake_batch(), 32).sampling_seed is mine


@pytest.mark.parametrize("env, overrides, says", [
    ("on", dict(device="cuda"), "--sampling-backend pytorch"),
    ("on", dict(device="cuda", sampling_backend="flashinfer"), "flashinfer"),
    ("maybe", dict(), "must be on or off"),
])
def test_refusals_name_the_flag(plugin_loaded, monkeypatch, env, overrides, says):
    from sglang_hsd.sglang_plugin.server_args import request_seed_problems

    monkeypatch.setenv(request_seeds.REQUEST_SEEDS_ENV, env)
    problems = request_seed_problems(args_namespace(**overrides))
    assert len(problems) == 1 and says in problems[0]
    monkeypatch.setenv(request_seeds.REQUEST_SEEDS_ENV, "on")
    assert request_seed_problems(args_namespace(device="cuda", sampling_backend="pytorch")) == []
    assert request_seed_problems(args_namespace(device="cpu")) == []


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
