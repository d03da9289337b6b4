"""Every allowed pair of server features, served (``compatibility.pairwise_cover``).

Each combination of the cover is started the way users start it (the command ``sglang-hsd
serve --target --draft -- FLAGS`` builds, SGLang's defaults for everything it does not set) on a
tiny random Llama target (4 layers) and a draft language model (its first layer), and sent one
burst of staggered requests: greedy (the target's plain greedy text, token for token), T = 1 with
top-p 0.9, T = 0.7 with min-p 0.05, a seeded request twice (the same tokens unless seeds are
off) and a streamed request aborted after three chunks. Then: no error, no traceback in the log,
the free slots of the target's and the draft's KV pools back where they started once SGLang's
radix cache (on, as serve leaves it) is flushed. Together the
combinations hold every pair of features the table lets compose (20 servers, 13 minutes on
2 cores: run them with ``SGLANG_HSD_COMBINATIONS=1``; ``test_feature_combinations.py`` checks
every refusal before models load on every run).
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from sglang_hsd.sglang_plugin.compatibility import AXES, flags_of, pairwise_cover
from tests.sglang_plugin.http_client import get_json, post_json

pytest.importorskip("sglang")
pytestmark = [
    pytest.mark.sglang, pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("SGLANG_HSD_COMBINATIONS") != "1",
                       reason="20 servers, ~13 min: SGLANG_HSD_COMBINATIONS=1 make test PYTEST_ARGS="
                              "'-k feature_combinations_server'"),
]

PROMPTS = [[1, 40, 41, 42], [1, 77, 300, 12, 9]]
NEW_TOKENS = 16
VOCAB = 512
COVER = pairwise_cover()


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from sglang_hsd.runtime.model import CausalLM
    from sglang_hsd.runtime.testing import greedy_reference
    from sglang_hsd.sglang_plugin.cpu.tiny_models import build_tiny_draft_pair

    root = tmp_path_factory.mktemp("feature_combinations_server")
    target, draft = build_tiny_draft_pair(str(root))
    model = CausalLM.from_pretrained(target)
    return root, target, draft, [greedy_reference(model, ids, NEW_TOKENS) for ids in PROMPTS]


def _generate(url, ids, **sampling):
    params = {"max_new_tokens": NEW_TOKENS, "ignore_eos": True, "temperature": 0.0, **sampling}
    return post_json(url, "/generate", {"input_ids": ids, "sampling_params": params})


def _burst(url, prompts) -> dict:
    """The mixed requests, sent 50 ms apart and all in flight together: {name: what came back}."""
    from benchmarks.bench_sglang_load import run_job

    jobs = {f"greedy {i}": (lambda ids=ids: _generate(url, ids)) for i, ids in enumerate(prompts)}
    jobs.update({f"top_p {i}": (lambda ids=ids: _generate(url, ids, temperature=1.0, top_p=0.9))
                 for i, ids in enumerate(prompts)})
    jobs.update({f"min_p {i}": (lambda ids=ids: _generate(url, ids, temperature=0.7, min_p=0.05))
                 for i, ids in enumerate(prompts)})
    jobs.update({f"seed {i}": (lambda: _generate(url, prompts[0], temperature=1.0, sampling_seed=5))
                 for i in range(2)})
    abort = {"input_ids": prompts[1], "rid": "combination-abort", "abort_after_chunks": 3,
             "sampling_params": {"max_new_tokens": 64, "ignore_eos": True, "temperature": 1.0}}
    jobs["aborted"] = lambda: run_job(url, abort, VOCAB)
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        futures = {}
        for name, job in jobs.items():
            futures[name] = pool.submit(job)
            time.sleep(0.05)
        return {name: future.result() for name, future in futures.items()}


def _wait_idle(url, start: dict | None, timeout: float = 120.0) -> dict:
    """Poll until both KV pools are back to ``start`` (aborted requests finish asynchronously);
    ``start`` None: flush once and return the state (the reference).
    Serve leaves SGLang's radix cache on, which keeps finished requests' KV: each poll first asks
    SGLang to flush it (done only once no request runs), so what stays held is a leak."""
    import requests

    deadline = time.monotonic() + timeout
    while True:
        requests.post(url + "/flush_cache", timeout=30)
        state = get_json(url, "/server_info")["internal_states"][0]["hsd"]
        if start is None:  # flushed: the reference state
            return state
        idle = all(state[key] == start[key] for key in ("kv_available_size", "draft_kv_available_size"))
        if idle or time.monotonic() > deadline:
            return state
        time.sleep(2.0)


@pytest.mark.parametrize("names", COVER, ids=[
    "+".join(n for n, f in zip(names, AXES.values()) if n != f[0].name) or "defaults" for names in COVER])
def test_the_combination_serves_a_mixed_burst(pair, names):
    from sglang_hsd.sglang_plugin.cpu.cpu_server import free_port, running_server
    from sglang_hsd.sglang_plugin.serve_launch import ServeConfig, build_launch, resolve_models

    root, target, draft, reference = pair
    config = ServeConfig(target=target, draft=draft, device="cpu",
                         sglang_args=("--port", str(free_port()), *flags_of(names)))
    launch = build_launch(config, resolve_models(config, fetch=None), "cpu")
    log = root / f"combination_{COVER.index(names)}.log"
    with running_server(launch.command, {**os.environ, **launch.env}, str(log)) as url:
        start = _wait_idle(url, None)  # the server's warm-up request left its KV in the radix cache
        got = _burst(url, PROMPTS)
        end = _wait_idle(url, start)
    for i, expected in enumerate(reference):
        assert got[f"greedy {i}"]["output_ids"] == expected, (names, i)
    for name, out in got.items():
        if name != "aborted":
            assert len(out["output_ids"]) == NEW_TOKENS and all(0 <= t < VOCAB for t in out["output_ids"]), name
    assert got["aborted"]["kind"] == "aborted", got["aborted"]
    if "seeds off" not in names:
        assert got["seed 0"]["output_ids"] == got["seed 1"]["output_ids"], names
    for key in ("kv_available_size", "draft_kv_available_size"):
        assert end[key] == start[key], (key, start[key], end[key])
    assert "Traceback" not in log.read_text()
