"""The server's lookup level below the draft model (``draft_lookup.py``) drafts the chain's law.

Exact enumeration: ``DraftLookup.draft`` runs against a model with its own KV (entry p holds the
token it read; a row's q is a context-dependent law of every entry up to it, so a stale or
missing entry changes it) and a draw that enumerates every outcome of every row. The law of the
chains it hands up, and the q beside each draft, must be the draft model's sequential chain law
(TV < 1e-12), over several committed histories whose text makes the lookup copy, one and two
requests per batch, with and without a copy cap. The slip of keeping the draw after a mismatch
(its row read a copy the chain does not hold) fails the same check. The batched implementation
inside SGLang is checked end to end in ``test_draft_lookup_server.py``.
"""

from __future__ import annotations

import itertools
import random
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from sglang_hsd.sglang_plugin import draft_lookup
from sglang_hsd.sglang_plugin.draft_lookup import DraftLookup, matched_run
from sglang_hsd.sglang_plugin.draft_lookup_setting import LookupSetting

VOCAB = 3
# Committed tokens (prompt + output) of requests whose text repeats, so the lookup copies.
HISTORIES = ([0, 1, 2, 0, 1, 2, 0, 1], [2, 2, 1, 2, 0, 2], [1, 0, 0, 1, 0])


def _q(context: tuple, seed: int) -> list:
    """The draft model's law after ``context`` (the tokens its entries read), float64."""
    rng = random.Random(hash((seed, len(context)) + context))
    weights = [rng.random() ** 2 + 0.05 for _ in range(VOCAB)]
    return [w / sum(weights) for w in weights]


class _KVModel:
    """A draft model with a KV cache: entry p of request b holds the token it read; a row at entry
    e gives the law after the tokens of entries 0..e (all must be written)."""

    def __init__(self, histories, seed):
        # The draft cache of committed length n holds entries 0..n-1, reading tokens 1..n.
        self.kv = [dict(enumerate(h[1:])) for h in histories]
        self.seed = seed

    def law(self, b: int, entry: int) -> list:
        return _q(tuple(self.kv[b][p] for p in range(entry + 1)), self.seed)

    def forward(self, worker, template, requests, first_entry, lengths, input_ids):
        rows, start = [], 0
        for b, e0, n in zip(requests.tolist(), first_entry.tolist(), lengths.tolist()):
            for j in range(n):
                self.kv[b][e0 + j] = int(input_ids[start + j])
            rows += [self.law(b, e0 + j) for j in range(n)]
            start += n
        return torch.tensor(rows, dtype=torch.float64).log()


class _NeedDraws(Exception):
    def __init__(self, probs):
        self.probs = probs


class _ScriptedDraw:
    """Draws each row's token from a script; past its end, asks for the rows' laws."""

    def __init__(self, script):
        self.script, self.used = script, 0

    def __call__(self, logits, sampling, owner, positions, draft_index, with_q):
        probs = logits.softmax(-1)
        rows = logits.shape[0]
        if self.used + rows > len(self.script):
            raise _NeedDraws(probs.tolist())
        drawn = torch.tensor(self.script[self.used:self.used + rows], dtype=torch.int64)
        self.used += rows
        return drawn, probs


def _batch(histories):
    reqs = [SimpleNamespace(rid=i, origin_input_ids=h[:2], output_ids=h[2:]) for i, h in enumerate(histories)]
    return SimpleNamespace(reqs=reqs, seq_lens=torch.tensor([len(h) - 1 for h in histories]))


def _lookup_law(histories, steps, setting, seed):
    """({chains: probability} of ``DraftLookup.draft``, every draw enumerated; the largest
    difference between the q handed up beside a draft and the model's law at its position)."""
    law = defaultdict(float)
    q_error = [0.0]
    size = len(histories)
    worker = SimpleNamespace(speculative_num_steps=steps, _topk1_parents_prealloc=torch.zeros(8, 1),
                             _topk1_score_indices_prealloc=torch.zeros(8, 1))
    first_q = [_q(tuple(h[1:]), seed) for h in histories]

    def explore(firsts, script, weight):
        model = _KVModel(histories, seed)
        lookup = DraftLookup(setting, forward=model.forward, draw=_ScriptedDraw(script))
        lookup.begin(_batch(histories))
        spec_info = SimpleNamespace(topk_index=torch.tensor(firsts).unsqueeze(-1),
                                    draft_probs=torch.tensor(first_q, dtype=torch.float64))
        fb = SimpleNamespace(spec_info=spec_info, batch_size=size,
                             sampling_info=SimpleNamespace(is_all_greedy=False))
        try:
            _, _, tokens, probs = lookup.draft(worker, fb)
        except _NeedDraws as need:
            for outcome in itertools.product(range(VOCAB), repeat=len(need.probs)):
                p = 1.0
                for row, token in zip(need.probs, outcome):
                    p *= row[token]
                explore(firsts, script + list(outcome), weight * p)
            return
        for b, h in enumerate(histories):
            for k in range(steps):
                expected = _q(tuple(h[1:]) + tuple(tokens[b, :k].tolist()), seed)
                q_error[0] = max(q_error[0], (probs[b, k] - torch.tensor(expected, dtype=torch.float64)).abs().max().item())
        law[tuple(map(tuple, tokens.tolist()))] += weight

    for firsts in itertools.product(range(VOCAB), repeat=size):
        explore(list(firsts), [], _prod(first_q[b][t] for b, t in enumerate(firsts)))
    return law, q_error[0]


def _prod(values):
    out = 1.0
    for v in values:
        out *= v
    return out


def _chain_law(histories, steps, seed):
    """{chains: probability} of the draft model drawing each request's L drafts one by one."""
    per_request = []
    for h in histories:
        law = {}
        for chain in itertools.product(range(VOCAB), repeat=steps):
            law[chain] = _prod(_q(tuple(h[1:]) + chain[:k], seed)[chain[k]] for k in range(steps))
        per_request.append(law)
    return {tuple(c for c, _ in combo): _prod(p for _, p in combo)
            for combo in itertools.product(*(law.items() for law in per_request))}


def _tv(a, b):
    return 0.5 * sum(abs(a.get(key, 0.0) - b.get(key, 0.0)) for key in set(a) | set(b))


def test_matched_run_keeps_draws_up_to_the_first_mismatch():
    copies = torch.tensor([[5, 6, 7], [5, 9, 0], [3, 3, 3]])
    drawn = torch.tensor([[5, 6, 8, 1], [4, 9, 0, 0], [3, 3, 3, 3]])
    assert matched_run(copies, drawn, torch.tensor([2, 3, 0])).tolist() == [3, 1, 1]
    assert matched_run(copies, drawn, torch.tensor([3, 3, 3])).tolist() == [3, 1, 4]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("history", HISTORIES)
@pytest.mark.parametrize("ngram,copies", [(1, None), (2, None), (3, 1)])
def test_lookup_chain_has_the_draft_models_chain_law(seed, history, ngram, copies):
    steps = 4
    lookup, q_error = _lookup_law([history], steps, LookupSetting(ngram, copies), seed)
    assert _tv(lookup, _chain_law([history], steps, seed)) < 1e-12
    assert q_error < 1e-12
    assert sum(lookup.values()) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("seed", [0, 1])
def test_two_requests_in_one_batch_draw_independent_chains(seed):
    histories = [HISTORIES[0], HISTORIES[1]]
    lookup, q_error = _lookup_law(histories, 3, LookupSetting(2), seed)
    assert _tv(lookup, _chain_law(histories, 3, seed)) < 1e-12
    assert q_error < 1e-12


def test_the_lookup_copies_and_saves_forwards():
    """The enumeration is not vacuous: on the repeating history some rounds hand up several
    drafts from one forward."""
    history = HISTORIES[0]
    model = _KVModel([history], seed=0)
    # Draws that follow the text's period (0, 1, 2, ...) match every copy.
    lookup = DraftLookup(LookupSetting(2), forward=model.forward, draw=_ScriptedDraw([0, 1, 2, 0]))
    lookup.begin(_batch([history]))
    spec_info = SimpleNamespace(topk_index=torch.tensor([[2]]), draft_probs=torch.full((1, VOCAB), 1 / VOCAB))
    fb = SimpleNamespace(spec_info=spec_info, batch_size=1, sampling_info=SimpleNamespace(is_all_greedy=False))
    worker = SimpleNamespace(speculative_num_steps=5, _topk1_parents_prealloc=torch.zeros(8, 1),
                             _topk1_score_indices_prealloc=torch.zeros(8, 1))
    _, _, tokens, _ = lookup.draft(worker, fb)
    assert tokens.tolist() == [[2, 0, 1, 2, 0]]
    stats = lookup.stats
    assert (stats.forwards, stats.chain_forwards, stats.accepted) == (1, 4, 3)


@pytest.mark.parametrize("history", HISTORIES[:2])
def test_keeping_the_draw_after_a_mismatch_is_caught(history, monkeypatch):
    def one_too_many(copies, drawn, lengths):
        return torch.minimum(matched_run(copies, drawn, lengths) + 1, lengths + 1)

    monkeypatch.setattr(draft_lookup, "matched_run", one_too_many)
    lookup, q_error = _lookup_law([history], 4, LookupSetting(2), seed=0)
    assert _tv(lookup, _chain_law([history], 4, seed=0)) > 1e-3
    assert q_error > 1e-3  # and the q beside such a draft is not its position's law


def test_settings_are_validated(monkeypatch):
    from sglang_hsd.sglang_plugin.draft_lookup_setting import COPIES_ENV, LOOKUP_ENV

    monkeypatch.setenv(LOOKUP_ENV, "3")
    monkeypatch.setenv(COPIES_ENV, "4")
    assert LookupSetting.from_env() == LookupSetting(3, 4)
    monkeypatch.setenv(LOOKUP_ENV, "off")
    with pytest.raises(ValueError, match="--hsd-draft-lookup-copies 4 needs --hsd-draft-lookup"):
        LookupSetting.from_env()
    monkeypatch.delenv(COPIES_ENV)
    assert not LookupSetting.from_env().enabled
    for bad in ("0", "-1", "two"):
        monkeypatch.setenv(LOOKUP_ENV, bad)
        with pytest.raises(ValueError, match="--hsd-draft-lookup"):
            LookupSetting.from_env()


def _args(**overrides):
    fields = dict(speculative_draft_model_path="/draft", speculative_eagle_topk=1, device="cpu")
    fields.update(overrides)
    return SimpleNamespace(**fields)


def test_the_server_refuses_what_the_lookup_cannot_run_with(monkeypatch):
    from sglang_hsd.sglang_plugin.config import EXIT_LAYER_ENV
    from sglang_hsd.sglang_plugin.draft_kind import DRAFT_KIND_ENV
    from sglang_hsd.sglang_plugin.draft_lookup_setting import LOOKUP_ENV, lookup_problems

    monkeypatch.setenv(DRAFT_KIND_ENV, "model")
    monkeypatch.delenv(EXIT_LAYER_ENV, raising=False)
    assert lookup_problems(_args(), plan_exit_level=False) == []  # off by default
    monkeypatch.setenv(LOOKUP_ENV, "3")
    assert lookup_problems(_args(), plan_exit_level=False) == []
    refusals = {
        "--speculative-eagle-topk 2": lookup_problems(_args(speculative_eagle_topk=2), False),
        "--device cuda": lookup_problems(_args(device="cuda"), False),
        "exit level": lookup_problems(_args(), plan_exit_level=True),
    }
    for needle, problems in refusals.items():
        assert len(problems) == 1 and needle in problems[0] and "--hsd-draft-lookup 3" in problems[0]
    monkeypatch.setenv(DRAFT_KIND_ENV, "eagle3")
    (problem,) = lookup_problems(_args(), False)
    assert "--hsd-draft-kind model" in problem
    monkeypatch.setenv(LOOKUP_ENV, "x")
    assert "expected a positive integer or off" in lookup_problems(_args(), False)[0]
