"""End to end on CPU: ``--hsd-draft-lookup`` (prompt-lookup copies below the draft model, three
levels: lookup -> draft model -> target).

Two tiny pairs, each draft the target with noise on its weights (``tiny_models.build_perturbed_copy``),
so rounds end both ways:

* the tiny target itself, whose attention matters at every position: a lookup server and the
  same server without it serve a forced schedule of draft lengths (``--hsd-draft-lengths-cycle``,
  0..5: rounds of one draft, where no forward runs, plain rounds, where the draft cache catches up,
  and long chains) at T = 0, one request at a time. Both return the target's greedy tokens and
  accept the same drafts in every round (SGLang's per-request histogram of accepted drafts and
  verify count): the lookup's forwards over a draft and its copies write each entry into the
  slot and position the draft model's own steps would, and the entries after a rejected copy are
  written again before any row reads them. Its text rarely repeats, so most copies are rejected.
  The lookup server runs the lean draft forward ``checked`` (every forward, its multi-row extends
  included, compared with SGLang's);
* a looping copy of the target (``tiny_models.build_looping_copy``: attention outputs zeroed, so
  greedy text falls into a short cycle, as re-typed code repeats; logits sharpened so that T = 1
  samples mostly follow it), drafting L = 5 every round (``--hsd-adaptive off``, so SGLang's
  window extend follows each round where the first pair ran the tail extend): the lookup's copies are
  accepted, and a round hands up several drafts per forward (``/server_info``
  ``hsd.draft_lookup``: forwards < chain_forwards, copies accepted). Greedy tokens equal the
  target's, one request at a time and with requests arriving while others run (ragged sub-rounds
  of several requests); at T = 1 the law of the first generated tokens after a cycling prompt is
  the target's (PIT chi-square) with copies accepted while it ran; the KV pools of both models
  return to their start after a mixed load; greedy requests with penalties give plain penalised
  greedy decoding's text while rounds accept several copies, and T = 1 requests with penalties
  follow plain penalised decoding's law (SGLang's relaxed penalties fail both).

``test_draft_model_qwen.py`` serves the lookup on the real Qwen pair, where attention matters and
copies are accepted: greedy output equal to the target's.
"""

from __future__ import annotations

import pytest

from tests.sglang_plugin.draft_server_checks import (
    assert_kv_returns, assert_same_rounds, law_p_values, staggered_outputs)
from tests.sglang_plugin.server_law import ALPHA
from tests.sglang_plugin.test_draft_model_server import PROMPTS, _generate, _hsd_state

pytest.importorskip("sglang")
pytestmark = [pytest.mark.sglang, pytest.mark.slow]

NUM_STEPS = 5
CYCLE = "5,1,5,0,3,5,2,0,0,5,4"
REPEATING = [[1, 40, 41, 42, 43, 40, 41, 42, 43, 40], [1, 7, 8, 9, 7, 8, 9, 7]]
TEST_PROMPTS = PROMPTS + REPEATING
# A prompt already in the looping target's greedy cycle (453, 499, ...), for the law test.
CYCLING = [1, 5, 453, 499, 453, 499, 453]
MAX_NEW_TOKENS = 40
SHARPNESS = 6.0  # the looping target's logits x 6: T = 1 samples mostly stay on the cycle


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """(root, {"attending": (target, draft), "looping": (target, draft)})."""
    from sglang_hsd.sglang_plugin.cpu.tiny_models import (
        build_looping_copy, build_perturbed_copy, build_tiny_draft_pair)

    root = tmp_path_factory.mktemp("draft_lookup")
    target, _ = build_tiny_draft_pair(str(root))
    looping = build_looping_copy(target, str(root / "looping"), sharpness=SHARPNESS)
    return root, {"attending": (target, build_perturbed_copy(target, str(root / "attending_draft"))),
                  "looping": (looping, build_perturbed_copy(looping, str(root / "looping_draft")))}


def _references(target):
    from sglang_hsd.runtime.model import CausalLM
    from sglang_hsd.runtime.testing import greedy_reference

    model = CausalLM.from_pretrained(target)
    return [greedy_reference(model, ids, MAX_NEW_TOKENS) for ids in TEST_PROMPTS]


def _server(pairs, pair, name, extra):
    from sglang_hsd.sglang_plugin.cpu.cpu_server import (
        draft_model_server_command, free_port, running_server, server_env)

    root, models = pairs
    target, draft = models[pair]
    extra = ["--dtype", "float32", "--hsd-draft-precision", "fp32", "--disable-radix-cache", *extra]
    cmd = draft_model_server_command(target, free_port(), draft, num_steps=NUM_STEPS, extra=extra)
    return running_server(cmd, server_env(), str(root / f"{name}.log"))


def _no_traceback(pairs, name):
    with open(pairs[0] / f"{name}.log") as f:
        assert "Traceback" not in f.read()


LOOKUP = ("--hsd-draft-lookup", "2")


@pytest.fixture(scope="module")
def looping_url(pairs):
    # Every round drafts L = 5 (SGLang's window extend after it): each runs the lookup.
    with _server(pairs, "looping", "looping_lookup", (*LOOKUP, "--hsd-adaptive", "off")) as url:
        yield url
    _no_traceback(pairs, "looping_lookup")


def test_lookup_leaves_every_round_as_the_draft_models_steps_would(pairs):
    forced = ("--hsd-draft-lengths-cycle", CYCLE)
    reference = _references(pairs[1]["attending"][0])
    with _server(pairs, "attending", "lookup", (*LOOKUP, *forced, "--hsd-draft-forward", "checked")) as lookup_url, \
            _server(pairs, "attending", "chain", forced) as chain_url:
        assert _hsd_state(lookup_url)["draft_lookup"]["ngram"] == 2
        assert not _hsd_state(chain_url)["draft_lookup"]["enabled"]
        assert_same_rounds(lookup_url, chain_url, TEST_PROMPTS, reference, MAX_NEW_TOKENS)
        state = _hsd_state(lookup_url)["draft_lookup"]
        assert state["proposed"] >= 10 and state["forwards"] > 0, state  # copies were read (and rejected)
    for name in ("lookup", "chain"):
        _no_traceback(pairs, name)


def test_lookup_copies_are_accepted_with_fewer_forwards(pairs, looping_url):
    reference = _references(pairs[1]["looping"][0])
    start = _hsd_state(looping_url)["draft_lookup"]
    for ids, expected in zip(TEST_PROMPTS, reference):
        assert _generate(looping_url, ids, MAX_NEW_TOKENS)["output_ids"] == expected, ids
    state = _hsd_state(looping_url)["draft_lookup"]
    delta = {key: state[key] - start[key] for key in ("forwards", "chain_forwards", "accepted", "rows")}
    assert delta["accepted"] >= 20 and delta["forwards"] < delta["chain_forwards"], delta


def test_lookup_greedy_with_staggered_arrivals(pairs, looping_url):
    reference = _references(pairs[1]["looping"][0])
    before = _hsd_state(looping_url)["draft_lookup"]["accepted"]
    outputs = staggered_outputs(looping_url, TEST_PROMPTS * 2, MAX_NEW_TOKENS)
    for ids, expected, out in zip(TEST_PROMPTS * 2, reference * 2, outputs):
        assert out["output_ids"] == expected, ids
    assert _hsd_state(looping_url)["draft_lookup"]["accepted"] > before


@pytest.mark.statistical
def test_lookup_sampled_law_is_the_targets(pairs, looping_url):
    before = _hsd_state(looping_url)["draft_lookup"]["accepted"]
    p_server = law_p_values(looping_url, pairs[1]["looping"][0], "lookup PIT law test", prompt=CYCLING)
    assert p_server[-1] > ALPHA, p_server
    accepted = _hsd_state(looping_url)["draft_lookup"]["accepted"] - before
    assert accepted >= 100, accepted  # copies accepted by T = 1 draws (one per request or more)


def test_lookup_penalised_greedy_equals_plain_decoding(pairs, looping_url):
    """Greedy requests with penalties on the looping pair, whose rounds accept several copies:
    each verify row is penalised with the output so far including the drafts before it on its
    path, so the text is plain penalised greedy decoding's. SGLang's relaxed penalties (one
    state per request and round, counting the last token of each round) break the cycle later and
    give other text here."""
    from tests.sglang_plugin.test_draft_model_server import _penalised_greedy, request_penalties

    target = pairs[1]["looping"][0]
    cases = [dict(frequency_penalty=0.5), dict(repetition_penalty=1.5), dict(presence_penalty=2.0)]
    accepted = []
    for case in cases:
        for ids in (CYCLING, REPEATING[0]):
            out = _generate(looping_url, ids, MAX_NEW_TOKENS, **case)
            expected = _penalised_greedy(target, ids, MAX_NEW_TOKENS, **request_penalties(case))
            assert out["output_ids"] == expected, (case, ids)
            accepted.append(out["meta_info"]["spec_accept_length"])
    print(f"\npenalised greedy accept lengths {accepted}")
    assert max(accepted) > 2.0, accepted  # rounds accepted drafts, so rows sat at several depths


def _penalised_pit(target, sequences, prompt_len, penalties):
    """Sequential randomized PIT of the sampled tokens of ``sequences`` [N, P + T] under plain
    T = 1 decoding with ``penalties`` (``tests/penalty_reference.py``): each position's row is the
    target's softmax of its logits penalised by the tokens sampled before it."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from tests.penalty_reference import penalised_logits
    from tests.sglang_plugin.test_draft_model_server import _pit

    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    with torch.no_grad():
        logits = model(sequences).logits[:, prompt_len - 1:-1].double().numpy()
    rows = np.empty_like(logits)
    for n in range(logits.shape[0]):
        output = sequences[n, prompt_len:].tolist()
        for t in range(logits.shape[1]):
            row = penalised_logits(logits[n, t], output[:t], **penalties)
            rows[n, t] = np.exp(row - row.max()) / np.exp(row - row.max()).sum()
    return _pit(torch.from_numpy(rows), sequences, prompt_len=prompt_len)


@pytest.mark.statistical
def test_lookup_penalised_sampled_law_is_plain_decodings(pairs, looping_url):
    """T = 1 with a frequency and a repetition penalty (2.0 each) on the looping pair, whose
    rounds accept about 4 tokens: the first 12 tokens after a cycling prompt follow plain
    decoding's law with each position penalised by the tokens sampled before it (PIT chi-square
    on 720 samples: p = 0.19 when written); the same samples reject the law without penalties
    (p = 4e-5), and a server with SGLang's relaxed penalties failed this test (p = 5e-10)."""
    from concurrent.futures import ThreadPoolExecutor

    import torch

    from tests.sglang_plugin.server_law import confirmed_p_values
    from tests.sglang_plugin.test_draft_model_server import _pit_p_value, _target_pit

    target = pairs[1]["looping"][0]
    sampling, penalties = {"frequency_penalty": 2.0, "repetition_penalty": 2.0}, {"frequency": 2.0, "repetition": 2.0}
    tokens, last = 12, {}

    def server_p_value(count):
        with ThreadPoolExecutor(max_workers=8) as pool:
            outs = list(pool.map(lambda _: _generate(looping_url, CYCLING, tokens, temperature=1.0, **sampling),
                                 range(count)))
        sequences = last["sequences"] = torch.tensor([CYCLING + out["output_ids"] for out in outs])
        last["accept"] = sum(out["meta_info"]["spec_accept_length"] for out in outs) / count
        p_value = _pit_p_value(_penalised_pit(target, sequences, len(CYCLING), penalties))
        print(f"\npenalised T=1, {count} samples: PIT p={p_value:.3g}, mean accept length {last['accept']:.2f}")
        return p_value

    p_server = confirmed_p_values(server_p_value, 720, "lookup penalised law test")
    p_plain = _pit_p_value(_target_pit(target, last["sequences"], prompt_len=len(CYCLING)))
    print(f"the law without penalties on the same samples: p={p_plain:.3g}")
    assert p_server[-1] > ALPHA, p_server
    assert p_plain < ALPHA
    assert last["accept"] > 1.5  # rounds accepted drafts: rows sat at several depths


@pytest.fixture(scope="module")
def looping_plain_url(pairs):
    """The looping target without speculation (nor the overlap scheduler, as HSD runs on CPU)."""
    from sglang_hsd.sglang_plugin.cpu.cpu_server import cpu_server_command, free_port, running_server, server_env

    cmd = cpu_server_command(pairs[1]["looping"][0], free_port(),
                             extra=["--dtype", "float32", "--disable-radix-cache", "--disable-overlap-schedule"])
    with running_server(cmd, server_env(), str(pairs[0] / "looping_plain.log")) as url:
        yield url


@pytest.mark.parametrize("feature", ["logit_bias", "top_k_top_p", "penalties", "min_new_tokens", "regex",
                                     "json_schema", "ebnf", "n"])
def test_lookup_request_features_give_the_plain_servers_greedy_text(pairs, looping_url, looping_plain_url,
                                                                    feature):
    """``test_server_e2e.FEATURES`` on the lookup level (copies accepted): greedy requests get the
    token ids of the looping target without speculation, up to a float near-tie."""
    from tests.sglang_plugin.test_server_e2e import assert_features_give_the_plain_servers_greedy_text

    assert_features_give_the_plain_servers_greedy_text(pairs[1]["looping"][0], looping_plain_url, looping_url,
                                                       TEST_PROMPTS[:2], feature)


def test_lookup_stop_strings_and_ids_and_logprobs_equal_the_plain_servers(looping_plain_url, looping_url):
    from tests.sglang_plugin import test_server_e2e as e2e

    e2e.test_stop_strings_and_ids_and_logprobs_equal_the_plain_servers(looping_plain_url, looping_url)


def test_lookup_returns_kv(looping_url):
    assert_kv_returns(looping_url, seed=11)
