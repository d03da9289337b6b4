"""Windowed rounds (``HierarchyConfig.window``): the SGLang exit level's round in the runtime
(``runtime/window.py`` running the rule of ``verify/window_round.py``).

Exact greedy equality, the round rule read off the per-round trace, the sampled distribution
(the window cap and the dropped bonus are lossless), that the rounds come from the shared rule,
and that the flag really changes the rounds.
"""

import pytest
import torch

pytest.importorskip("transformers")

from sglang_hsd.runtime.config import parse_levels  # noqa: E402
from sglang_hsd.runtime.engine import SpeculativeGenerator  # noqa: E402
from sglang_hsd.runtime.model import CausalLM  # noqa: E402
from sglang_hsd.runtime.testing import greedy_reference, tiny_llama  # noqa: E402
from sglang_hsd.sampling import SamplingParams  # noqa: E402
from sglang_hsd.verify.oracles.stats import chi_square_p_value  # noqa: E402
from tests.runtime.helpers import PROMPTS, eagle3_head_for, exact_target_prefix_probs, sharpen_lm_head  # noqa: E402

SPECS = ["exit:2,exit:4,target", "eagle3:x,exit:4,target"]
# (K = N_d, N_i): N_i = 1 is the server's default (one exit verification per round), N_i = K + 1
# fills the window.
WINDOWS = [(3, 1), (3, 2), (3, 4), (1, 1), (1, 2), (4, 5)]


def _generator(model, spec, buffers, methods=("hsd",), window=True, draft_vocab=None, captures=(2, 3, 5)):
    head = eagle3_head_for(model, draft_vocab or model.vocab_size, list(captures))[0] if spec.startswith("eagle3") else None
    config = parse_levels(spec, buffers=list(buffers), methods=list(methods), window=window)
    return SpeculativeGenerator(model, config, eagle3_head=head, validate=True)


def _check_window_trace(rounds, K, N_i, max_new):
    """Assert every round of one request (no EOS) follows the windowed rule; return the drafts it
    implies. ``max_new``: the request's token budget (the exit also stops once its buffer holds
    every token the request may still emit)."""
    drafted, emitted = 0, 0
    for entry in rounds:
        n = 0  # tokens in the exit's buffer
        limit = min(N_i, K, max_new - emitted)
        assert entry["exit_accepted"], entry
        for a in entry["exit_accepted"]:
            assert n < limit, entry  # a sub-round starts only below N_i, K and the budget
            room = K - n  # the drafter drafts up to position s + K
            assert 0 <= a <= room, entry
            drafted += room
            n += a + 1
        assert n >= limit, entry  # ... and the exit stops as soon as one is reached
        emitted += entry["emitted"]
        assert n <= K + 1, entry
        tau = entry["target_accepted"]
        assert 0 <= tau <= n, entry
        assert entry["emitted"] == (n if tau == n else tau + 1), entry  # no bonus on full acceptance
    return drafted


def _check_emitted(rounds, out):
    # Without EOS only the max-length cut shortens the output, and only in the last round.
    emitted = [entry["emitted"] for entry in rounds]
    assert sum(emitted[:-1]) < len(out) <= sum(emitted)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("K,N_i", WINDOWS)
def test_greedy_output_equals_target_greedy(target, spec, K, N_i):
    gen = _generator(target, spec, [K, N_i])
    result = gen.generate(PROMPTS, SamplingParams(temperature=0.0), max_new_tokens=14, trace_rounds=True)
    drafted = 0
    for prompt, out, rounds in zip(PROMPTS, result.tokens, result.round_trace):
        assert out == greedy_reference(target, prompt, 14)
        drafted += _check_window_trace(rounds, K, N_i, 14)
        _check_emitted(rounds, out)
    # The trace's implied draft counts are what the drafter drafted and the exit verified.
    assert result.levels[0].proposed == result.levels[1].proposed == drafted
    assert result.levels[2].rounds == sum(len(rounds) for rounds in result.round_trace)


@pytest.mark.parametrize(
    "spec,buffers,methods,params",
    [
        ("exit:1,exit:3,target", [2, 3], ["hsd"], SamplingParams(temperature=1.0)),
        ("exit:1,exit:3,target", [1, 1], ["tokenwise"], SamplingParams(temperature=1.0)),
        ("exit:1,exit:3,target", [3, 2], ["tokenwise", "hsd"], SamplingParams(temperature=0.8, top_p=0.9)),
        ("eagle3:x,exit:2,target", [2, 1], ["hsd", "tokenwise"], SamplingParams(temperature=1.2, top_k=5)),
    ],
)
def test_sampled_output_matches_target_distribution(spec, buffers, methods, params):
    vocab, length, runs = 6, 3, 6000
    model = CausalLM.from_hf(sharpen_lm_head(tiny_llama(vocab_size=vocab, num_layers=4, hidden_size=32, seed=5), 3.0))
    gen = _generator(model, spec, buffers, methods, draft_vocab=4, captures=(1, 2, 3))
    prompt = [1, 4, 2]
    result = gen.generate([prompt] * runs, params, max_new_tokens=length, seed=0, trace_rounds=True)
    codes = torch.tensor([t[0] * vocab * vocab + t[1] * vocab + t[2] for t in result.tokens])
    counts = torch.bincount(codes, minlength=vocab**length)
    assert chi_square_p_value(counts, exact_target_prefix_probs(model, prompt, length, params)) > 1e-4
    rounds = [entry for request in result.round_trace for entry in request]
    for request in result.round_trace:
        _check_window_trace(request, *buffers, length)
    # The dropped bonus was exercised, and so was the window cap (a later sub-round drafts < K).
    assert any(entry["target_accepted"] == entry["emitted"] > 0 for entry in rounds)
    assert buffers[1] == 1 or any(len(entry["exit_accepted"]) > 1 for entry in rounds)


def test_rounds_come_from_the_shared_rule(target, monkeypatch):
    """Every traced round is one row of an ``exit_sub_rounds`` + ``target_round`` call."""
    from sglang_hsd.runtime import window

    seen = []

    def recording(function, slot):
        def wrapper(*args, **kwargs):
            out = function(*args, **kwargs)
            seen.append((slot, out))
            return out
        return wrapper

    monkeypatch.setattr(window, "exit_sub_rounds", recording(window.exit_sub_rounds, "exit"))
    monkeypatch.setattr(window, "target_round", recording(window.target_round, "target"))
    gen = _generator(target, "eagle3:x,exit:4,target", [3, 4])
    result = gen.generate(PROMPTS, SamplingParams(temperature=1.0), max_new_tokens=10, seed=4,
                          trace_rounds=True)
    exits = [out for slot, out in seen if slot == "exit"]
    targets = [out[1] for slot, out in seen if slot == "target"]
    assert len(exits) == len(targets) == max(len(rounds) for rounds in result.round_trace)
    from_rule = sorted((tuple(a for a in subs if a >= 0), taken)
                       for proposal, accepted in zip(exits, targets)
                       for subs, taken in zip(proposal.sub_accepted.tolist(), accepted.tolist()))
    traced = sorted((tuple(r["exit_accepted"]), r["target_accepted"])
                    for rounds in result.round_trace for r in rounds)
    assert from_rule == traced and any(len(subs) > 1 for subs, _ in traced)


def test_window_flag_changes_the_rounds(target):
    # N_i = 1: both modes run one exit verification of K drafts per round, so the rounds agree
    # until the target first accepts a whole buffer: then only the unwindowed one keeps the bonus.
    traces = {}
    for window in (False, True):
        gen = _generator(target, "exit:2,exit:4,target", [3, 1], window=window)
        result = gen.generate(PROMPTS, SamplingParams(temperature=0.0), max_new_tokens=14, trace_rounds=True)
        assert all(out == greedy_reference(target, p, 14) for p, out in zip(PROMPTS, result.tokens))
        traces[window] = [entry for request in result.round_trace for entry in request]
    full = {window: [e for e in trace if e["target_accepted"] == sum(a + 1 for a in e["exit_accepted"])]
            for window, trace in traces.items()}
    assert full[False] and all(e["emitted"] == e["target_accepted"] + 1 for e in full[False])
    assert full[True] and all(e["emitted"] == e["target_accepted"] for e in full[True])
    assert len(traces[True]) > len(traces[False])  # fewer tokens per round cost extra rounds

    # N_i > 1: without the window the exit's buffer outgrows the N_d + 1 positions of one window.
    sizes = {}
    for window in (False, True):
        gen = _generator(target, "exit:2,exit:4,target", [2, 3], window=window)
        result = gen.generate(PROMPTS, SamplingParams(temperature=1.0), max_new_tokens=14, seed=1, trace_rounds=True)
        sizes[window] = max(sum(a + 1 for a in e["exit_accepted"]) for r in result.round_trace for e in r)
    assert sizes[False] > 3 >= sizes[True]


def test_trace_is_opt_in_and_off_by_default(target):
    gen = _generator(target, "exit:2,exit:4,target", [3, 1])
    a = gen.generate(PROMPTS, SamplingParams(temperature=1.0), max_new_tokens=8, seed=2)
    b = gen.generate(PROMPTS, SamplingParams(temperature=1.0), max_new_tokens=8, seed=2, trace_rounds=True)
    assert a.round_trace == [] and "round_trace" not in a.as_dict()
    assert a.tokens == b.tokens and len(b.round_trace) == len(PROMPTS)
    assert b.as_dict()["round_trace"] == b.round_trace


def test_bad_window_configurations_raise_clear_errors(target):
    with pytest.raises(ValueError, match="window=True needs exactly three levels"):
        parse_levels("exit:2,target", buffers=[3], window=True)
    with pytest.raises(ValueError, match="window=True needs exactly three levels"):
        parse_levels("exit:1,exit:2,exit:4,target", buffers=[2, 2, 2], window=True)
    with pytest.raises(ValueError, match=r"window=True needs the exit level's buffer N_i <= drafter buffer"):
        parse_levels("exit:2,exit:4,target", buffers=[2, 4], window=True)
    parse_levels("exit:2,exit:4,target", buffers=[2, 3], window=True)  # N_i = N_d + 1 fills the window
    with pytest.raises(ValueError, match="trace_rounds needs two or three levels"):
        four = parse_levels("exit:1,exit:2,exit:4,target", buffers=[2, 2, 2])
        SpeculativeGenerator(target, four).generate(PROMPTS, trace_rounds=True)
