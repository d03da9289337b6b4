"""End to end on CPU: ``python -m sglang.launch_server --speculative-algorithm HSD`` with a tiny
random Llama and a random EAGLE-3 head with a reduced draft vocabulary (so q goes through the d2t
scatter). Checks: greedy output equals the same server without speculation token for token;
sampled (T=1) concurrent requests and /v1/chat/completions work; the verifier really ran (log
line) and the accept length read from /server_info is above 1. ~2 minutes on 2 cores.
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


def test_hsd_server_end_to_end(tiny_models):
    from sglang_hsd.sglang_plugin.cpu.cpu_server import (
        cpu_server_command, free_port, running_server, server_env)

    target, head = str(tiny_models / "target"), str(tiny_models / "eagle3")
    base_cmd = cpu_server_command(target, free_port())
    # A fixed draft length: with a random head the greedy requests reject most drafts, and the
    # adaptive default would then decode the sampled ones plainly (its choice is tested elsewhere).
    hsd_cmd = cpu_server_command(target, free_port(), "HSD", head, num_steps=3,
                                 extra=["--hsd-verify-method", "hsd", "--hsd-adaptive", "off"])
    hsd_log = str(tiny_models / "hsd_server.log")
    with running_server(base_cmd, server_env(), str(tiny_models / "base.log")) as base_url:
        baseline = [_generate(base_url, p, 0.0)["output_ids"] for p in PROMPTS]
    with running_server(hsd_cmd, server_env(), hsd_log) as url:
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
    with open(hsd_log) as f:
        log = f.read()
    assert "verifying chains with verify_chain(method='hsd')" in log
    assert "Traceback" not in log
    # Random head, half the vocabulary: p ~ q near uniform, so sampled drafts get accepted often.
    assert sum(accept) / len(accept) > 1.2, accept
    assert server_accept > 1.0, info["internal_states"][0]
    print(f"\nsampled accept lengths {accept}; /server_info avg_spec_accept_length "
          f"{server_accept:.3f}")
