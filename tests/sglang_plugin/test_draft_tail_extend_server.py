"""End to end on CPU: ``--hsd-draft-extend tail`` (after a drafting chain round the draft model
runs only over the positions its draft steps did not write) against ``window`` (SGLang's extend
over the whole verify window), on servers that are otherwise the same.

The draft model is the tiny target with noise on its layers' weights
(``tiny_models.build_perturbed_copy``): it agrees with the target often but not always (here
less often than offline, since SGLang's draft never reads a sequence's first token), so rounds
end both ways, some with a rejected draft (the tail is one row,
the bonus token, overwriting the entry the step of the rejected draft wrote) and some with every
draft accepted (two rows: the last draft, which no draft step read, and the bonus token). A
forced schedule of draft lengths (``--hsd-draft-lengths-cycle``, lengths 0..3) covers rounds of
one draft (no draft step at all), runs of plain rounds (the catch-up) and full-length rounds.

* T = 0, requests one at a time: both servers return the target's greedy tokens and accept the
  same number of drafts in every round (SGLang's per-request histogram of accepted drafts and
  its verify count, and the server's accepted drafts per length): a draft cache that differed
  anywhere would draft differently. Run by hand with two wrong tails, one row always (the last
  draft of a fully accepted round left unwritten) and rows one position late (the rejected
  draft's entry left as its step wrote it), the same comparison failed on the first prompt;
* the same with requests arriving while others run (batches of requests at different window
  offsets);
* T = 1: the law of the first generated tokens is the target's (PIT chi-square);
* ``/server_info`` counts the tail extends and the rows they ran (fewer than the windows), and
  the KV pools of both models return to their start.
"""

from __future__ import annotations

import pytest

from tests.sglang_plugin.draft_server_checks import (
    assert_kv_returns, assert_same_rounds, law_p_values, staggered_outputs)
from tests.sglang_plugin.server_law import ALPHA
from tests.sglang_plugin.test_draft_model_server import PROMPTS, _hsd_state

pytest.importorskip("sglang")
pytestmark = [pytest.mark.sglang, pytest.mark.slow]

NUM_STEPS = 3
CYCLE = "1,3,1,2,0,1,3,1,0,0,2,1"
# Four of test_draft_model_server's prompts and four longer ones.
TEST_PROMPTS = PROMPTS + [[1, *range(30 + 7 * i, 30 + 7 * i + 9)] for i in range(4)]
MAX_NEW_TOKENS = 32


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(root, the tiny target, its perturbed copy as the draft model)."""
    from sglang_hsd.sglang_plugin.cpu.tiny_models import build_perturbed_copy, build_tiny_draft_pair

    root = tmp_path_factory.mktemp("draft_tail_extend")
    target, _ = build_tiny_draft_pair(str(root))
    return root, target, build_perturbed_copy(target, str(root / "perturbed"))


@pytest.fixture(scope="module")
def reference(pair):
    from sglang_hsd.runtime.model import CausalLM
    from sglang_hsd.runtime.testing import greedy_reference

    model = CausalLM.from_pretrained(pair[1])
    return [greedy_reference(model, ids, MAX_NEW_TOKENS) for ids in TEST_PROMPTS]


def _server(pair, extend: str):
    from sglang_hsd.sglang_plugin.cpu.cpu_server import (
        draft_model_server_command, free_port, running_server, server_env)

    root, target, draft = pair
    extra = ["--dtype", "float32", "--hsd-draft-precision", "fp32", "--disable-radix-cache",
             "--hsd-draft-lengths-cycle", CYCLE, "--hsd-draft-extend", extend]
    cmd = draft_model_server_command(target, free_port(), draft, num_steps=NUM_STEPS, extra=extra)
    return running_server(cmd, server_env(), str(root / f"draft_extend_{extend}.log"))


@pytest.fixture(scope="module")
def servers(pair):
    with _server(pair, "tail") as tail_url, _server(pair, "window") as window_url:
        yield tail_url, window_url
    for name in ("tail", "window"):
        with open(pair[0] / f"draft_extend_{name}.log") as f:
            assert "Traceback" not in f.read()


def test_tail_extend_leaves_the_draft_cache_the_window_extend_would_have(servers, reference):
    tail_url, window_url = servers
    start = _hsd_state(tail_url)["draft_catch_up"]
    assert start["tail_extend"] and not _hsd_state(window_url)["draft_catch_up"]["tail_extend"]
    by_length = assert_same_rounds(tail_url, window_url, TEST_PROMPTS, reference, MAX_NEW_TOKENS)
    # Both tails ran: rounds that kept every draft (the last draft's entry added, two rows)
    # and rounds that kept some but not all (a rejected draft's entry rewritten, one row).
    full = sum(counts[-1] for length, counts in by_length.items() if int(length) > 0)
    partial = sum(sum(counts[1:-1]) for counts in by_length.values())
    assert full >= 6 and partial >= 2, by_length
    state = _hsd_state(tail_url)["draft_catch_up"]
    assert state["tail_extends"] > start["tail_extends"]
    assert state["tail_rows"] - start["tail_rows"] < state["window_rows"] - start["window_rows"]
    assert _hsd_state(window_url)["draft_catch_up"]["tail_extends"] == 0


def test_tail_extend_greedy_with_staggered_arrivals(servers, reference):
    tail_url, _ = servers
    outputs = staggered_outputs(tail_url, TEST_PROMPTS * 2, MAX_NEW_TOKENS)
    for ids, expected, out in zip(TEST_PROMPTS * 2, reference * 2, outputs):
        assert out["output_ids"] == expected, ids


@pytest.mark.statistical
def test_tail_extend_sampled_law_is_the_targets(pair, servers):
    tail_url, _ = servers
    before = _hsd_state(tail_url)["draft_catch_up"]["tail_extends"]
    p_server = law_p_values(tail_url, pair[1], "tail-extend PIT law test")
    assert p_server[-1] > ALPHA, p_server
    assert _hsd_state(tail_url)["draft_catch_up"]["tail_extends"] > before


def test_tail_extend_returns_kv(servers):
    assert_kv_returns(servers[0], seed=7)
