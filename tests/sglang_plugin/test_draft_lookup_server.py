"""End to end on CPU: ``--hsd-draft-lookup`` (prompt-lookup copies below the draft model, three
levels: lookup -> draft model -> target) against the same server without it.

The draft model is the tiny target with noise on its weights (``tiny_models.build_perturbed_copy``),
so rounds end both ways; the prompts repeat short spans, and the tiny models' greedy continuations
loop, so the lookup finds copies and the draft model's draws match many of them. A forced schedule
of draft lengths (``--hsd-draft-lengths-cycle``, 0..5) makes both servers run the same rounds and
covers rounds of one draft (no forward, the lookup does not run), plain rounds (the draft cache
catches up) and long chains. The lookup server runs the lean draft forward ``checked`` (every
forward, its multi-row extends included, compared with SGLang's).

* T = 0, requests one at a time: both servers return the target's greedy tokens and accept the
  same drafts in every round (SGLang's per-request histogram of accepted drafts and verify count):
  the lookup hands up the draft model's own chain, with fewer forwards (``/server_info``
  ``hsd.draft_lookup``: forwards < chain_forwards, copies accepted);
* the same with requests arriving while others run (ragged sub-rounds of several requests);
* T = 1: the law of the first generated tokens after a repeating prompt is the target's (PIT
  chi-square), with copies accepted while it ran;
* the KV pools of both models return to their start after a mixed load.
"""

from __future__ import annotations

import pytest

from tests.sglang_plugin.draft_server_checks import assert_kv_returns, law_p_values, staggered_outputs
from tests.sglang_plugin.server_law import ALPHA
from tests.sglang_plugin.test_draft_model_server import PROMPTS, _generate, _hsd_state

pytest.importorskip("sglang")
pytestmark = [pytest.mark.sglang, pytest.mark.slow]

NUM_STEPS = 5
CYCLE = "5,1,5,0,3,5,2,0,0,5,4"
REPEATING = [[1, 40, 41, 42, 43, 40, 41, 42, 43, 40], [1, 7, 8, 9, 7, 8, 9, 7], [1, 300, 5, 300, 5, 300]]
TEST_PROMPTS = PROMPTS + REPEATING
MAX_NEW_TOKENS = 40


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(root, the tiny target, its perturbed copy as the draft model)."""
    from sglang_hsd.sglang_plugin.cpu.tiny_models import build_perturbed_copy, build_tiny_draft_pair

    root = tmp_path_factory.mktemp("draft_lookup")
    target, _ = build_tiny_draft_pair(str(root))
    return root, target, build_perturbed_copy(target, str(root / "perturbed"))


@pytest.fixture(scope="module")
def reference(pair):
    from sglang_hsd.runtime.model import CausalLM
    from sglang_hsd.runtime.testing import greedy_reference

    model = CausalLM.from_pretrained(pair[1])
    return [greedy_reference(model, ids, MAX_NEW_TOKENS) for ids in TEST_PROMPTS]


def _server(pair, name, extra):
    from sglang_hsd.sglang_plugin.cpu.cpu_server import (
        draft_model_server_command, free_port, running_server, server_env)

    root, target, draft = pair
    extra = ["--dtype", "float32", "--hsd-draft-precision", "fp32", "--disable-radix-cache",
             "--hsd-draft-lengths-cycle", CYCLE, *extra]
    cmd = draft_model_server_command(target, free_port(), draft, num_steps=NUM_STEPS, extra=extra)
    return running_server(cmd, server_env(), str(root / f"{name}.log"))


@pytest.fixture(scope="module")
def servers(pair):
    lookup = ["--hsd-draft-lookup", "2", "--hsd-draft-forward", "checked"]
    with _server(pair, "lookup", lookup) as lookup_url, _server(pair, "chain", []) as chain_url:
        yield lookup_url, chain_url
    for name in ("lookup", "chain"):
        with open(pair[0] / f"{name}.log") as f:
            assert "Traceback" not in f.read()


def test_lookup_hands_up_the_draft_models_chain_with_fewer_forwards(servers, reference):
    lookup_url, chain_url = servers
    start = _hsd_state(lookup_url)["draft_lookup"]
    assert start["enabled"] and start["ngram"] == 2
    assert not _hsd_state(chain_url)["draft_lookup"]["enabled"]
    lookup = [_generate(lookup_url, ids, MAX_NEW_TOKENS) for ids in TEST_PROMPTS]
    chain = [_generate(chain_url, ids, MAX_NEW_TOKENS) for ids in TEST_PROMPTS]
    for ids, expected, a, b in zip(TEST_PROMPTS, reference, lookup, chain):
        assert a["output_ids"] == expected and b["output_ids"] == expected, ids
        ma, mb = a["meta_info"], b["meta_info"]
        assert ma["hsd_draft_budget"] == mb["hsd_draft_budget"], ids
        assert ma["spec_correct_drafts_histogram"] == mb["spec_correct_drafts_histogram"], ids
        assert ma["spec_verify_ct"] == mb["spec_verify_ct"], ids
    by_length = _hsd_state(lookup_url)["adaptive"]["accepted_drafts_by_length"]
    assert by_length == _hsd_state(chain_url)["adaptive"]["accepted_drafts_by_length"]
    state = _hsd_state(lookup_url)["draft_lookup"]
    forwards = state["forwards"] - start["forwards"]
    chain_forwards = state["chain_forwards"] - start["chain_forwards"]
    accepted = state["accepted"] - start["accepted"]
    assert accepted >= 10 and forwards < chain_forwards, state
    assert state["drafted"] - start["drafted"] > 0


def test_lookup_greedy_with_staggered_arrivals(servers, reference):
    lookup_url, _ = servers
    before = _hsd_state(lookup_url)["draft_lookup"]["accepted"]
    outputs = staggered_outputs(lookup_url, TEST_PROMPTS * 2, MAX_NEW_TOKENS)
    for ids, expected, out in zip(TEST_PROMPTS * 2, reference * 2, outputs):
        assert out["output_ids"] == expected, ids
    assert _hsd_state(lookup_url)["draft_lookup"]["accepted"] > before


@pytest.mark.statistical
def test_lookup_sampled_law_is_the_targets(pair, servers):
    lookup_url, _ = servers
    before = _hsd_state(lookup_url)["draft_lookup"]["accepted"]
    p_server = law_p_values(lookup_url, pair[1], "lookup PIT law test", prompt=REPEATING[0])
    assert p_server[-1] > ALPHA, p_server
    assert _hsd_state(lookup_url)["draft_lookup"]["accepted"] > before


def test_lookup_returns_kv(servers):
    assert_kv_returns(servers[0], seed=11)
