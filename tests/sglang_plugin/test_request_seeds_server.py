"""Same seed, same tokens: ``--hsd-request-seeds on`` on CPU servers with a tiny random target and
a draft language model (``test_draft_model_server.py``'s pair), a chain of K = 3 and a sampled tree
(depth 3, k = 2, N = 6), T = 1.

A request with a seed gives the same tokens every time, alone or in a batch with other requests,
with trees and with chains (and with min-p, which SGLang's seeded sampler would refuse); another
seed, or no seed, gives other tokens. Each server takes about a minute to start on 2 cores.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.sglang_plugin.http_client import post_json

pytest.importorskip("sglang")
pytestmark = [pytest.mark.sglang, pytest.mark.slow]

PROMPT = [1, 40, 41, 42]
OTHERS = [[1, 77, 300, 12, 9], [1, 5], [1, 200, 201, 202]]
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from sglang_hsd.sglang_plugin.cpu.tiny_models import build_tiny_draft_pair

    root = tmp_path_factory.mktemp("request_seeds_server")
    return (root, *build_tiny_draft_pair(str(root)))


@pytest.fixture(scope="module", params=["chain", "tree"])
def url(request, pair):
    from sglang_hsd.sglang_plugin.cpu.cpu_server import (
        draft_model_server_command, free_port, running_server, server_env)

    root, target, draft = pair
    tree = dict(topk=2, num_draft_tokens=6) if request.param == "tree" else {}
    cmd = draft_model_server_command(target, free_port(), draft, num_steps=3, **tree,
                                     extra=["--dtype", "float32", "--disable-radix-cache",
                                            "--hsd-request-seeds", "on"])
    log = root / f"{request.param}.log"
    with running_server(cmd, server_env(), str(log)) as server_url:
        yield server_url
    assert "Traceback" not in log.read_text()


def _sample(url, ids, **params):
    sampling = {"max_new_tokens": NEW_TOKENS, "ignore_eos": True, "temperature": 1.0, **params}
    out = post_json(url, "/generate", {"input_ids": ids, "sampling_params": sampling})
    assert out["meta_info"]["spec_verify_ct"] >= 1
    return out["output_ids"]


def test_same_seed_same_tokens(url):
    first = _sample(url, PROMPT, sampling_seed=7)
    assert _sample(url, PROMPT, sampling_seed=7) == first
    with ThreadPoolExecutor(max_workers=4) as pool:  # in a batch with unseeded requests
        futures = [pool.submit(_sample, url, ids) for ids in OTHERS]
        batched = _sample(url, PROMPT, sampling_seed=7)
        [f.result() for f in futures]
    assert batched == first
    assert _sample(url, PROMPT, sampling_seed=8) != first
    assert _sample(url, PROMPT) != _sample(url, PROMPT)  # no seed: a stream of its own each time


def test_same_seed_same_tokens_with_min_p(url):
    first = _sample(url, PROMPT, sampling_seed=11, min_p=0.05)
    assert _sample(url, PROMPT, sampling_seed=11, min_p=0.05) == first
