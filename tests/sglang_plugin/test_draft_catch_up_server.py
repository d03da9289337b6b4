"""End to end on CPU: ``--hsd-draft-catch-up`` (a round that drafts nothing skips the draft
model's extend; the next drafting round catches the draft cache up in one batched extend).

Two servers of the tiny pair share a forced schedule of draft lengths
(``--hsd-draft-lengths-cycle``, runs of 0 between drafting rounds of 1..3), one with the catch-up
and one without (every round extends the draft cache, SGLang's way). The draft model is the
target itself on float32 weights, so that many drafts are accepted and a draft cache that differs
anywhere shows as different drafts:

* T = 0, requests one at a time: both servers return the target's greedy tokens, take the same
  lengths in the same rounds, and accept the same number of drafts in each round (SGLang's
  per-request histogram of accepted drafts per round and its verify count): the catch-up leaves
  the draft cache exactly as the skipped extends would have;
* T = 0, requests arriving while others are in a run of skipped rounds (batches mixing requests
  whose draft cache is current with ones that must catch up): greedy tokens equal the target's;
* T = 1: the law of the first generated tokens is the target's (the PIT chi-square of
  ``test_draft_model_server``); the same test rejects the law of another model (the tiny pair's
  one-layer draft), since this server's draft model is the target;
* with the radix cache on, a request extending the cached sequence of one that never drafted
  catches the draft up over the cached prefix as well (the same rounds and accepted drafts as
  the server that always extends);
* ``/server_info`` reports the skipped extends, the deferred prefills and the catch-ups, and
  the KV pools return to their start;
* the same for a sampled tree (depth 3, k = 2, N = 6; the cycle's lengths are depths): greedy
  rounds and accepted drafts equal to the server that always extends, sampled acceptance kept,
  the T = 1 law, the KV pools.
"""

from __future__ import annotations

import pytest

from tests.sglang_plugin.draft_server_checks import assert_kv_returns, law_p_values, staggered_outputs
from tests.sglang_plugin.server_law import ALPHA
from tests.sglang_plugin.test_draft_model_server import (  # noqa: F401 (pair: a fixture)
    PROMPTS, STAT_SAMPLES, _generate, _hsd_state, _model_law_samples, _pit_p_value, _target_pit, pair)

pytest.importorskip("sglang")
pytestmark = [pytest.mark.sglang, pytest.mark.slow]

NUM_STEPS = 3
CYCLE = "0,0,3,0,2,3,3,0,0,0,1,0,3"
MAX_NEW_TOKENS = 32
TREE = (2, 6)  # k, N of the tree servers (depth NUM_STEPS; the cycle's lengths are its depths)


@pytest.fixture(scope="module")
def reference(pair):
    from sglang_hsd.runtime.model import CausalLM
    from sglang_hsd.runtime.testing import greedy_reference

    model = CausalLM.from_pretrained(pair[1])
    return [greedy_reference(model, ids, MAX_NEW_TOKENS) for ids in PROMPTS]


def _server(pair, catch_up: str, radix_cache: bool = False, tree: bool = False):
    from sglang_hsd.sglang_plugin.cpu.cpu_server import (
        draft_model_server_command, free_port, running_server, server_env)

    root, target, _ = pair
    extra = ["--dtype", "float32", "--hsd-draft-precision", "fp32",
             "--hsd-draft-lengths-cycle", CYCLE, "--hsd-draft-catch-up", catch_up,
             *([] if radix_cache else ["--disable-radix-cache"])]
    shape = dict(topk=TREE[0], num_draft_tokens=TREE[1]) if tree else {}
    cmd = draft_model_server_command(target, free_port(), target, num_steps=NUM_STEPS, extra=extra, **shape)
    log = root / f"catch_up_{catch_up}{'_radix' if radix_cache else ''}{'_tree' if tree else ''}.log"
    return running_server(cmd, server_env(), str(log))


@pytest.fixture(scope="module")
def servers(pair):
    with _server(pair, "on") as on_url, _server(pair, "off") as off_url:
        yield on_url, off_url
    for name in ("on", "off"):
        with open(pair[0] / f"catch_up_{name}.log") as f:
            assert "Traceback" not in f.read()


@pytest.fixture(scope="module")
def tree_servers(pair):
    """The two servers with a sampled tree of depth 3, k = 2, N = 6 (the cycle gives depths)."""
    with _server(pair, "on", tree=True) as on_url, _server(pair, "off", tree=True) as off_url:
        yield on_url, off_url
    for name in ("on", "off"):
        with open(pair[0] / f"catch_up_{name}_tree.log") as f:
            assert "Traceback" not in f.read()


@pytest.fixture(scope="module")
def cached_servers(pair):
    """The same two servers with SGLang's radix (prefix) cache on."""
    with _server(pair, "on", True) as on_url, _server(pair, "off", True) as off_url:
        yield on_url, off_url
    for name in ("on", "off"):
        with open(pair[0] / f"catch_up_{name}_radix.log") as f:
            assert "Traceback" not in f.read()


def _sequential(url):
    return [_generate(url, ids, MAX_NEW_TOKENS) for ids in PROMPTS]


def test_catch_up_leaves_the_draft_cache_the_skipped_extends_would_have(servers, reference):
    on_url, off_url = servers
    start = _hsd_state(on_url)
    assert start["draft_catch_up"]["enabled"] and not _hsd_state(off_url)["draft_catch_up"]["enabled"]
    on, off = _sequential(on_url), _sequential(off_url)
    accepted = 0
    for ids, expected, a, b in zip(PROMPTS, reference, on, off):
        assert a["output_ids"] == expected and b["output_ids"] == expected, ids
        ma, mb = a["meta_info"], b["meta_info"]
        assert ma["hsd_draft_budget"] == mb["hsd_draft_budget"], ids
        assert 0 in ma["hsd_draft_budget"] and max(ma["hsd_draft_budget"]) == NUM_STEPS
        assert ma["spec_correct_drafts_histogram"] == mb["spec_correct_drafts_histogram"], ids
        assert ma["spec_verify_ct"] == mb["spec_verify_ct"], ids
        accepted += ma["spec_num_correct_drafts"]
    assert accepted >= 8  # enough accepted drafts that a wrong draft cache would show
    state = _hsd_state(on_url)["draft_catch_up"]
    assert state["skipped_extends"] > start["draft_catch_up"]["skipped_extends"]
    assert state["catch_ups"] > start["draft_catch_up"]["catch_ups"]
    assert state["caught_up_tokens"] >= state["catch_ups"]


def test_catch_up_covers_a_cached_prefix_that_never_drafted(cached_servers):
    """A request whose rounds all draft nothing (the cycle starts 0, 0) leaves its sequence in
    the radix cache without the draft's KV (its draft prefill was deferred, its extends
    skipped). A later request extending that sequence reuses the target's cached KV and must
    catch the draft up over the cached prefix too: it takes the same rounds and accepts the same
    drafts as on the server that always extends. (Marking it from the cached prefix's end
    instead drafts from slots the draft never wrote, and its accepted drafts differ.)"""
    on_url, off_url = cached_servers
    first = [1, *range(100, 140)]
    results = []
    for url in (on_url, off_url):
        head = _generate(url, first, 2)  # the prefill's token and one L = 0 round
        assert head["meta_info"]["hsd_draft_budget"] == [0], head["meta_info"]
        results.append(_generate(url, first + head["output_ids"] + [7, 8, 9], MAX_NEW_TOKENS))
    on, off = results
    assert on["meta_info"]["cached_tokens"] >= len(first), on["meta_info"]
    assert on["output_ids"] == off["output_ids"]
    assert on["meta_info"]["hsd_draft_budget"] == off["meta_info"]["hsd_draft_budget"]
    assert (on["meta_info"]["spec_correct_drafts_histogram"]
            == off["meta_info"]["spec_correct_drafts_histogram"])
    assert on["meta_info"]["spec_num_correct_drafts"] >= 4  # a stale draft cache would show
    state = _hsd_state(on_url)["draft_catch_up"]
    assert state["deferred_prefills"] >= 2 and state["deferred_rows"] >= len(first)


def test_catch_up_greedy_with_staggered_arrivals(servers, reference):
    """Requests join while others are inside runs of skipped extends, so drafting rounds mix
    requests that must catch up (by one or several positions) with ones that need not."""
    on_url, _ = servers
    outputs = staggered_outputs(on_url, PROMPTS * 3, MAX_NEW_TOKENS)
    for ids, expected, out in zip(PROMPTS * 3, reference * 3, outputs):
        assert out["output_ids"] == expected, ids


@pytest.mark.statistical
def test_catch_up_sampled_law_is_the_targets(pair, servers):
    on_url, _ = servers
    before = _hsd_state(on_url)["draft_catch_up"]["catch_ups"]
    p_server = law_p_values(on_url, pair[1], "catch-up PIT law test")
    p_wrong = _pit_p_value(_target_pit(pair[1], _model_law_samples(pair[2], STAT_SAMPLES)))
    assert p_server[-1] > ALPHA, p_server
    assert p_wrong < ALPHA
    assert _hsd_state(on_url)["draft_catch_up"]["catch_ups"] > before


def test_catch_up_returns_kv(servers):
    assert_kv_returns(servers[0], seed=5)


def test_tree_catch_up_leaves_the_draft_cache_the_skipped_extends_would_have(tree_servers, reference):
    """Trees: greedy requests draft SGLang's top-k tree from the next root's top-k, which the
    catch-up computes for the requests it caught up: the same rounds and accepted drafts as on
    the server that always extends, and the target's greedy tokens."""
    on_url, off_url = tree_servers
    assert _hsd_state(on_url)["draft_catch_up"]["enabled"]
    on, off = _sequential(on_url), _sequential(off_url)
    accepted = 0
    for ids, expected, a, b in zip(PROMPTS, reference, on, off):
        assert a["output_ids"] == expected and b["output_ids"] == expected, ids
        ma, mb = a["meta_info"], b["meta_info"]
        assert ma["hsd_draft_budget"] == mb["hsd_draft_budget"], ids
        assert ma["spec_correct_drafts_histogram"] == mb["spec_correct_drafts_histogram"], ids
        accepted += ma["spec_num_correct_drafts"]
    assert accepted >= 8
    state = _hsd_state(on_url)["draft_catch_up"]
    assert state["skipped_extends"] > 0 and state["catch_ups"] > 0


def test_tree_catch_up_keeps_sampled_acceptance(tree_servers):
    """T = 1: a caught-up request's sampled tree draws from the root q the skipped extend would
    have recorded; with the target as its own draft model nearly every draft is accepted on
    both servers (a wrong root q would show as lost acceptance)."""
    on_url, off_url = tree_servers
    means = []
    for url in (on_url, off_url):
        outs = [_generate(url, ids, MAX_NEW_TOKENS, temperature=1.0) for ids in PROMPTS * 2]
        drafted = [o["meta_info"]["spec_num_correct_drafts"] for o in outs]
        means.append(sum(drafted) / len(drafted))
    print(f"\ntree T=1 accepted drafts per request: catch-up on {means[0]:.2f}, off {means[1]:.2f}")
    assert means[1] >= 6 and means[0] >= 0.85 * means[1], means


@pytest.mark.statistical
def test_tree_catch_up_sampled_law_is_the_targets(pair, tree_servers):
    on_url, _ = tree_servers
    p_server = law_p_values(on_url, pair[1], "tree catch-up PIT law test")
    assert p_server[-1] > ALPHA, p_server


def test_tree_catch_up_returns_kv(tree_servers):
    assert_kv_returns(tree_servers[0], seed=6)
