"""Same seed, same tokens, on the server ``sglang-hsd serve`` starts (no ``--random-seed``,
``--hsd-request-seeds`` at its default, adaptive draft lengths and the draft catch-up on).

A tiny random target and a close draft language model (its copy with 2% noise on the layers),
T = 1. Five servers in turn, built by ``serve_launch.build_launch`` as the command line builds them:
a chain whose rounds draft 0, 4, 1, 3 tokens in turn (``--hsd-draft-lengths-cycle``: on this pair
the controller finds that drafting does not pay and mostly drafts nothing), a sampled tree and
SGLang's stock tree (depth 3, k = 2, N = 6) with serve's adaptive controller, the exit level
(layer 2, logit lens) and a lookup level below the draft model. A seeded request gives the
same tokens every time: alone, in a burst with unseeded requests (other batch sizes, other draft
lengths chosen by the controller), and on every other server (another draft shape, another
level): seeded batches are verified by the coupled rule, whose tokens do not depend on what was
drafted. Another seed, or
none, gives other tokens. The coupled drafts agree with the target: a seeded request accepts about
as many drafts per round as an unseeded one (keys off by one position would accept almost none).
Each server takes about a minute to start on 2 cores.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.sglang_plugin.http_client import post_json

pytest.importorskip("sglang")
pytestmark = [pytest.mark.sglang, pytest.mark.slow]

PROMPT = [1, 40, 41, 42]
OTHERS = [[1, 77, 300, 12, 9], [1, 5], [1, 200, 201, 202], [1, 9, 8, 7, 6, 5]]
NEW_TOKENS = 32
# The chain drafts 0, 4, 1, 3 tokens in turn from each request's first round (the batch follows
# its youngest request); the tree is serve's adaptive controller choosing depths from timings.
TREE = ("--speculative-num-steps", "3", "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "6")
SHAPES = {"chain": ("--hsd-draft-lengths-cycle", "0,4,1,3"),
          "tree": TREE,
          # SGLang's stock tree: deterministic top-k children; the coupled rule walks its links
          "stock": (*TREE, "--hsd-tree-draft", "topk"),
          # the exit level (layer 2 of 4, logit lens) between the draft model and the target
          "exit": ("--hsd-exit-layer", "2", "--hsd-exit-heads", "none"),
          # a prompt-lookup level below the draft model (copies after the text's last <= 3 tokens)
          "lookup": ("--hsd-draft-lookup", "3")}
# What each server's log says about its shape.
SHAPE_LOG = {"chain": "rounds take the lengths [0, 4, 1, 3]", "tree": "adaptive on",
             "stock": "verifying trees with verify_tree(method='target-only')",
             "exit": "exit level at layer 2", "lookup": "prompt-lookup level below the draft model"}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from sglang_hsd.sglang_plugin.cpu.tiny_models import build_perturbed_copy, build_tiny_llama

    root = tmp_path_factory.mktemp("request_seeds_server")
    target = str(root / "target")
    build_tiny_llama(target, init_std=0.3)
    return root, target, build_perturbed_copy(target, str(root / "draft"))


def _sample(url, ids, **params):
    sampling = {"max_new_tokens": NEW_TOKENS, "ignore_eos": True, "temperature": 1.0, **params}
    out = post_json(url, "/generate", {"input_ids": ids, "sampling_params": sampling})
    meta = out["meta_info"]
    assert meta["spec_verify_ct"] >= 1
    return out["output_ids"], meta["completion_tokens"] / meta["spec_verify_ct"]


def _serve_and_sample(pair, shape: str) -> dict:
    """Start the server serve builds for ``shape``, send the requests, return what they got."""
    from sglang_hsd.sglang_plugin.cpu.cpu_server import free_port, running_server
    from sglang_hsd.sglang_plugin.serve_launch import ServeConfig, build_launch, resolve_models

    root, target, draft = pair
    config = ServeConfig(target=target, draft=draft, device="cpu",
                         sglang_args=("--port", str(free_port()), *SHAPES[shape]))
    launch = build_launch(config, resolve_models(config, fetch=None), "cpu")
    assert "--random-seed" not in launch.command and "--hsd-request-seeds" not in launch.command
    log = root / f"{shape}.log"
    got: dict = {}
    with running_server(launch.command, {**__import__("os").environ, **launch.env}, str(log)) as url:
        got["first"], got["seeded_rate"] = _sample(url, PROMPT, sampling_seed=7)
        got["again"], _ = _sample(url, PROMPT, sampling_seed=7)
        with ThreadPoolExecutor(max_workers=5) as pool:  # in a burst with unseeded requests
            futures = [pool.submit(_sample, url, ids) for ids in OTHERS]
            got["batched"], _ = _sample(url, PROMPT, sampling_seed=7)
            got["unseeded_rates"] = [f.result()[1] for f in futures]
        got["other_seed"], _ = _sample(url, PROMPT, sampling_seed=8)
        got["no_seed"] = [_sample(url, PROMPT)[0] for _ in range(2)]
        got["min_p"] = [_sample(url, PROMPT, sampling_seed=11, min_p=0.05)[0] for _ in range(2)]
        got["top_k_top_p"] = [_sample(url, PROMPT, sampling_seed=12, top_k=20, top_p=0.8)[0] for _ in range(2)]
    text = log.read_text()
    assert "Traceback" not in text
    assert SHAPE_LOG[shape] in text, SHAPE_LOG[shape]
    return got


@pytest.fixture(scope="module")
def served(pair):
    return {shape: _serve_and_sample(pair, shape) for shape in SHAPES}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_same_seed_same_tokens_alone_and_in_a_burst(served, shape):
    got = served[shape]
    assert got["again"] == got["first"]
    assert got["batched"] == got["first"]
    assert got["other_seed"] != got["first"]
    assert got["no_seed"][0] != got["no_seed"][1]  # no seed: a fresh draw each time
    assert got["min_p"][0] == got["min_p"][1]
    assert got["top_k_top_p"][0] == got["top_k_top_p"][1]


@pytest.mark.parametrize("shape", [shape for shape in SHAPES if shape != "chain"])
def test_seeded_tokens_do_not_depend_on_the_draft_shape(served, shape):
    for key in ("first", "other_seed"):
        assert served["chain"][key] == served[shape][key], key
    assert served["chain"]["min_p"][0] == served[shape]["min_p"][0]
    assert served["chain"]["top_k_top_p"][0] == served[shape]["top_k_top_p"][0]


def test_seeded_drafts_agree_with_the_target_chain(served):
    got = served["chain"]
    unseeded = sum(got["unseeded_rates"]) / len(got["unseeded_rates"])
    # Tokens per round above one: keyed drafts accepted at least half as often as unseeded
    # requests' (measured: 1.6 vs 1.9 with every round drafting 4; misaligned keys: 1.03).
    assert got["seeded_rate"] - 1 >= 0.5 * (unseeded - 1), (got["seeded_rate"], got["unseeded_rates"])
