"""End to end on CPU: ``python -m sglang.launch_server --speculative-algorithm HSD`` with a tiny
random Llama and a random EAGLE-3 head with a reduced draft vocabulary (so q goes through the d2t
scatter). Checks: greedy output equals the same server without speculation token for token;
sampled (T=1) concurrent requests and /v1/chat/completions work; the verifier really ran (log
line) and the accept length read from /server_info is above 1; greedy requests with logit_bias,
top-k + top-p, penalties, min_new_tokens, a regex, a JSON schema, n = 2, stop ids and strings
give the same tokens and text as the server without speculation, and logprobs agree. ~3 minutes
on 2 cores.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.sglang_plugin.http_client import get_json, post_json

pytest.importorskip("sglang")
pytestmark = [pytest.mark.sglang, pytest.mark.slow]

PROMPTS = ["Hello world", "The quick brown fox", "def add(a, b):", "Once upon a time"]
MAX_NEW_TOKENS = 24


def _generate(url, prompt, temperature, max_new_tokens=MAX_NEW_TOKENS):
    return post_json(url, "/generate", {"text": prompt, "sampling_params": {
        "max_new_tokens": max_new_tokens, "temperature": temperature, "ignore_eos": True}})


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    from eagle_heads.eagle3 import build_random_eagle3_head
    from sglang_hsd.sglang_plugin.cpu.tiny_models import build_tiny_llama

    root = tmp_path_factory.mktemp("hsd_e2e")
    config = build_tiny_llama(str(root / "target"))
    build_random_eagle3_head(str(root / "eagle3"), config, draft_vocab_size=config.vocab_size // 2)
    return root


@pytest.fixture(scope="module")
def base_url(tiny_models):
    """The same target without speculation, without the overlap scheduler (as HSD runs on CPU):
    SGLang's overlap scheduler applies penalties one token late (the output it counts lags the
    request's by one; the first decode counts the prompt's last token), which neither plain
    decoding nor HSD does."""
    from sglang_hsd.sglang_plugin.cpu.cpu_server import cpu_server_command, free_port, running_server, server_env

    target = str(tiny_models / "target")
    cmd = cpu_server_command(target, free_port()) + ["--disable-overlap-schedule"]
    with running_server(cmd, server_env(), str(tiny_models / "base.log")) as url:
        yield url


@pytest.fixture(scope="module")
def hsd_url(tiny_models):
    from sglang_hsd.sglang_plugin.cpu.cpu_server import cpu_server_command, free_port, running_server, server_env

    target, head = str(tiny_models / "target"), str(tiny_models / "eagle3")
    # A fixed draft length: with a random head the greedy requests reject most drafts, and the
    # adaptive default would then decode the sampled ones plainly (its choice is tested elsewhere).
    hsd_cmd = cpu_server_command(target, free_port(), "HSD", head, num_steps=3,
                                 extra=["--hsd-verify-method", "hsd", "--hsd-adaptive", "off"])
    hsd_log = str(tiny_models / "hsd_server.log")
    with running_server(hsd_cmd, server_env(), hsd_log) as url:
        yield url
    with open(hsd_log) as f:
        log = f.read()
    assert "verifying chains with verify_chain(method='hsd')" in log
    assert "Traceback" not in log


def test_hsd_server_end_to_end(base_url, hsd_url):
    baseline = [_generate(base_url, p, 0.0)["output_ids"] for p in PROMPTS]
    url = hsd_url
    greedy = [_generate(url, p, 0.0) for p in PROMPTS]
    for prompt, out, expected in zip(PROMPTS, greedy, baseline):
        assert out["output_ids"] == expected, f"greedy output differs for {prompt!r}"
        assert out["meta_info"]["spec_verify_ct"] >= 1

    with ThreadPoolExecutor(max_workers=4) as pool:
        sampled = list(pool.map(lambda p: _generate(url, p, 1.0), PROMPTS * 2))
    assert all(len(s["output_ids"]) == MAX_NEW_TOKENS for s in sampled)
    accept = [s["meta_info"]["spec_accept_length"] for s in sampled]

    chat = post_json(url, "/v1/chat/completions", {
        "model": "tiny", "messages": [{"role": "user", "content": "Say hello"}],
        "max_tokens": 8, "temperature": 1.0, "ignore_eos": True})
    assert chat["choices"][0]["message"]["content"] is not None
    assert chat["usage"]["completion_tokens"] == 8

    info = get_json(url, "/server_info")
    server_accept = info["internal_states"][0]["avg_spec_accept_length"]
    # Random head, half the vocabulary: p ~ q near uniform, so sampled drafts get accepted often.
    assert sum(accept) / len(accept) > 1.2, accept
    assert server_accept > 1.0, info["internal_states"][0]
    print(f"\nsampled accept lengths {accept}; /server_info avg_spec_accept_length "
          f"{server_accept:.3f}")


# Request features, each compared at T = 0 with the server without speculation.
# float32 logits of a 4-row verify forward against a 1-row decode forward (other kernels, other
# summation orders): 4.8e-4 measured on this tiny model
LOGPROB_TOL = 2e-3
FEATURES = {
    "logit_bias": {"logit_bias": {"7": 5.0, "11": -100.0}},
    "top_k_top_p": {"top_k": 20, "top_p": 0.8},
    "penalties": {"frequency_penalty": 0.5, "presence_penalty": 0.5, "repetition_penalty": 1.1},
    "min_new_tokens": {"min_new_tokens": 12, "ignore_eos": False},
    # Grammars as users send them (a finished grammar ends the output at its stop token).
    "regex": {"regex": "(ab|cd|[0-9])+", "ignore_eos": False},
    "ebnf": {"ebnf": 'root ::= item+\nitem ::= "ab" | "cd" | [0-9]', "ignore_eos": False},
    "json_schema": {"json_schema": '{"type": "object", "properties": {"n": {"type": "integer"}}, '
                                   '"required": ["n"]}', "ignore_eos": False},
    "n": {"n": 2},
}


def _feature_request(url, prompt, sampling, **extra):
    """A greedy /generate request with ``sampling`` added; ``prompt`` text, or ``input_ids`` in
    ``extra``."""
    params = {"max_new_tokens": MAX_NEW_TOKENS, "temperature": 0.0, "ignore_eos": True, **sampling}
    body = {"sampling_params": params, **extra}
    if prompt is not None:
        body["text"] = prompt
    return post_json(url, "/generate", body)


# Two greedy outputs may part where the target's top two (penalised) logits are closer than the
# float32 difference between a verify forward and a decode forward (about 5e-4 here: see
# LOGPROB_TOL): the tiny random model's logits are flat enough for such near-ties.
NEAR_TIE = 1e-3


def _penalised_logits(model_dir, ids, output, sampling):
    """The target's next-token logits after ``ids + output`` with the request's penalties and
    logit bias (float64 [V]; transformers and ``tests/penalty_reference.py``)."""
    import torch
    from transformers import AutoModelForCausalLM

    from tests.penalty_reference import penalised_logits
    from tests.sglang_plugin.test_draft_model_server import request_penalties

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        logits = penalised_logits(model(torch.tensor([ids + output])).logits[0, -1].double().numpy(), output,
                                  **request_penalties(sampling))
    for token, bias in sampling.get("logit_bias", {}).items():
        logits[int(token)] += bias
    return logits


def _assert_same_greedy(model_dir, ids, sampling, want, have):
    """``have`` equals ``want``, or parts from it at a near-tie of the target's logits."""
    if have == want:
        return
    first = next(i for i, (a, b) in enumerate(zip(want, have)) if a != b) if len(want) == len(have) else None
    assert first is not None, (want, have)
    logits = _penalised_logits(model_dir, ids, want[:first], sampling)
    gap = abs(float(logits[want[first]] - logits[have[first]]))
    print(f"\ngreedy outputs part at token {first}: logits {want[first]} / {have[first]} differ by {gap:.2e}")
    assert gap < NEAR_TIE, (first, want, have)


def assert_features_give_the_plain_servers_greedy_text(model_dir, plain_url, url, prompts, feature):
    """Greedy requests with ``FEATURES[feature]`` on each of ``prompts`` (token ids) give at
    ``url`` the token ids and text the server without speculation at ``plain_url`` gives
    (``n`` = 2: both completions), up to a float near-tie of the target's logits."""
    sampling = FEATURES[feature]
    for ids in prompts:
        expected = _feature_request(plain_url, None, sampling, input_ids=ids)
        got = _feature_request(url, None, sampling, input_ids=ids)
        pairs = zip(expected, got) if isinstance(expected, list) else [(expected, got)]
        for want, have in pairs:
            _assert_same_greedy(model_dir, ids, sampling, want["output_ids"], have["output_ids"])
            if have["output_ids"] == want["output_ids"]:
                assert have["text"] == want["text"], (feature, ids)


@pytest.mark.parametrize("feature", list(FEATURES))
def test_request_features_give_the_plain_servers_greedy_text(tiny_models, base_url, hsd_url, feature):
    from transformers import AutoTokenizer

    target = str(tiny_models / "target")
    tokenizer = AutoTokenizer.from_pretrained(target)
    prompts = [tokenizer(prompt).input_ids for prompt in PROMPTS[:2]]
    assert_features_give_the_plain_servers_greedy_text(target, base_url, hsd_url, prompts, feature)


def test_stop_strings_and_ids_and_logprobs_equal_the_plain_servers(base_url, hsd_url):
    """Stop ids and strings end the output where the server without speculation ends it (nothing
    past a stop); logprobs and top logprobs of the greedy tokens agree within ``LOGPROB_TOL``."""
    prompt = PROMPTS[0]
    plain = _feature_request(base_url, prompt, {})
    stop_id = plain["output_ids"][6]
    stop_text = _feature_request(base_url, prompt, {"max_new_tokens": 10})["text"][-3:]
    for sampling in ({"stop_token_ids": [stop_id]}, {"stop": [stop_text]} if stop_text.strip() else {}):
        expected = _feature_request(base_url, prompt, sampling)
        got = _feature_request(hsd_url, prompt, sampling)
        assert got["output_ids"] == expected["output_ids"] and got["text"] == expected["text"], sampling
    extra = {"return_logprob": True, "top_logprobs_num": 3}
    expected = _feature_request(base_url, prompt, {}, **extra)["meta_info"]
    got = _feature_request(hsd_url, prompt, {}, **extra)["meta_info"]
    want = [entry[0] for entry in expected["output_token_logprobs"]]
    have = [entry[0] for entry in got["output_token_logprobs"]]
    assert [e[1] for e in got["output_token_logprobs"]] == [e[1] for e in expected["output_token_logprobs"]]
    assert max(abs(a - b) for a, b in zip(want, have)) < LOGPROB_TOL
    for want_top, have_top in zip(expected["output_top_logprobs"], got["output_top_logprobs"]):
        assert [t[1] for t in have_top] == [t[1] for t in want_top]
