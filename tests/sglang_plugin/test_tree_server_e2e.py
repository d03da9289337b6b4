"""Draft trees end to end on CPU (``--speculative-eagle-topk`` > 1) with the tiny random Llama and
its random EAGLE-3 head (half the vocabulary, so q goes through the d2t scatter):

* greedy output equals the target's greedy output for topk 2, 3, 4 (sampled trees) and for
  SGLang's stock top-k trees under ``target-only``, alone and inside a mixed batch;
* at T = 1 (top_k = 2) the joint law of the first three tokens equals the target's (chi-square, a
  rejection confirmed on a fresh sample four times as large, ``server_law.py``;
  the first comes from the prefill, the next from the first tree rounds), also with the drafter
  sampling at half the request's temperature under the beam rule
  (``--hsd-draft-temperature-scale 0.5 --hsd-tree-rule beam``);
* 32 concurrent mixed requests (greedy, T > 0, top-k / top-p, a quarter aborted mid-stream): no
  error, every completed response valid, the KV pool's free slots back to their start.
"""

from __future__ import annotations

import itertools
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from sglang_hsd.verify.oracles.stats import chi_square_p_value
from tests.sglang_plugin.http_client import get_json, post_json
from tests.sglang_plugin.server_law import ALPHA, confirmed_p_values

pytest.importorskip("sglang")
pytestmark = [pytest.mark.sglang, pytest.mark.slow]

PROMPTS = [[1, 40, 41, 42], [1, 77, 300, 12, 9], [1, 5]]
MAX_NEW_TOKENS = 16
STEPS = 3
# (topk, --speculative-num-draft-tokens, --hsd-tree-draft): N - 1 <= D * k for sampled trees
SHAPES = [(2, 6, "sampled"), (3, 8, "sampled"), (4, 9, "sampled"), (2, 6, "topk")]


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    from eagle_heads.eagle3 import build_random_eagle3_head
    from sglang_hsd.sglang_plugin.cpu.tiny_models import build_tiny_llama

    root = tmp_path_factory.mktemp("hsd_tree")
    config = build_tiny_llama(str(root / "target"), init_std=0.1)
    build_random_eagle3_head(str(root / "eagle3"), config, draft_vocab_size=config.vocab_size // 2)
    return root


def _tree_server(tiny_models, topk, num_tokens, tree_draft="sampled", log="tree.log", flags=()):
    from sglang_hsd.sglang_plugin.cpu.cpu_server import (
        cpu_server_command, free_port, running_server, server_env)

    cmd = cpu_server_command(
        str(tiny_models / "target"), free_port(), "HSD", str(tiny_models / "eagle3"),
        num_steps=STEPS, topk=topk, num_draft_tokens=num_tokens,
        extra=["--hsd-tree-draft", tree_draft, "--dtype", "float32", "--disable-radix-cache",
               *flags])
    return running_server(cmd, server_env(), str(tiny_models / log), timeout=600)


def _generate(url, ids, max_new_tokens=MAX_NEW_TOKENS, **sampling):
    params = {"max_new_tokens": max_new_tokens, "ignore_eos": True, "temperature": 0.0}
    params.update(sampling)
    return post_json(url, "/generate", {"input_ids": ids, "sampling_params": params})


def _log_ok(path, method):
    with open(path) as f:
        log = f.read()
    assert "Traceback" not in log
    assert f"verifying trees with verify_tree(method='{method}')" in log


@pytest.fixture(scope="module")
def greedy_reference(tiny_models):
    from sglang_hsd.runtime.model import CausalLM
    from sglang_hsd.runtime.testing import greedy_reference

    model = CausalLM.from_pretrained(str(tiny_models / "target"))
    return [greedy_reference(model, ids, MAX_NEW_TOKENS) for ids in PROMPTS]


@pytest.mark.parametrize("topk, num_tokens, tree_draft", SHAPES)
def test_tree_server_greedy_equals_target(tiny_models, greedy_reference, topk, num_tokens,
                                          tree_draft):
    log = f"tree_{topk}_{tree_draft}.log"
    with _tree_server(tiny_models, topk, num_tokens, tree_draft, log) as url:
        for ids, expected in zip(PROMPTS, greedy_reference):
            out = _generate(url, ids)
            assert out["output_ids"] == expected, (topk, ids)
            assert out["meta_info"]["spec_verify_ct"] >= 1
        mixed = [(ids, s) for ids in PROMPTS for s in (
            {}, {"temperature": 1.0}, {"temperature": 0.8, "top_k": 20}, {"top_p": 0.9,
                                                                          "temperature": 1.0})]
        with ThreadPoolExecutor(max_workers=8) as pool:
            outs = list(pool.map(lambda job: _generate(url, job[0], **job[1]), mixed))
        info = get_json(url, "/server_info")["internal_states"][0]
    for (ids, sampling), out in zip(mixed, outs):
        assert len(out["output_ids"]) == MAX_NEW_TOKENS
        if not sampling:  # greedy rows inside a mixed batch
            assert out["output_ids"] == greedy_reference[PROMPTS.index(ids)], (topk, ids)
        assert 1.0 <= out["meta_info"]["spec_accept_length"] <= STEPS + 1
    assert 1.0 <= info["avg_spec_accept_length"] <= STEPS + 1
    _log_ok(str(tiny_models / log), "hsd" if tree_draft == "sampled" else "target-only")


def _target_law(target_dir, prompt, top_k, length):
    """Exact law of the first ``length`` tokens at T = 1 with top-k renormalisation: outcomes in
    rank order (itertools.product of ranks), probabilities float64 [top_k ** length]."""
    from sglang_hsd.runtime.model import CausalLM

    model = CausalLM.from_pretrained(target_dir)
    outcomes, probs = [], []
    for ranks in itertools.product(range(top_k), repeat=length):
        ids, prob = list(prompt), 1.0
        for rank in ranks:
            with torch.inference_mode():
                cache = model.new_cache(1, len(ids) + 1)
                logits = model(torch.tensor([ids]), cache)[0, -1].double()
            top = torch.softmax(logits, -1).topk(top_k)
            ids.append(int(top.indices[rank]))
            prob *= float(top.values[rank] / top.values.sum())
        outcomes.append(tuple(ids[len(prompt):]))
        probs.append(prob)
    return outcomes, torch.tensor(probs, dtype=torch.float64)


@pytest.mark.statistical
@pytest.mark.parametrize("flags", [(), ("--hsd-draft-temperature-scale", "0.5", "--hsd-tree-rule", "beam")])
def test_tree_server_first_tokens_follow_the_target_law(tiny_models, flags):
    """T = 1, top-k 2: the first tokens' joint law is the target's with the default sampled tree,
    and with the drafter sampling at half the request's temperature under the beam rule."""
    prompt, top_k, length, samples = PROMPTS[0], 2, 3, 240
    outcomes, probs = _target_law(str(tiny_models / "target"), prompt, top_k, length)

    def server_p_value(count):
        with ThreadPoolExecutor(max_workers=8) as pool:
            outs = list(pool.map(lambda _: _generate(url, prompt, length, temperature=1.0,
                                                     top_k=top_k), range(count)))
        counts = torch.zeros(len(outcomes), dtype=torch.float64)
        for out in outs:
            seen = tuple(out["output_ids"])
            assert seen in outcomes, seen  # outside the target's top-k support
            counts[outcomes.index(seen)] += 1
        p_value = chi_square_p_value(counts, probs)
        print(f"\n{flags or 'default'}: {count} samples, chi-square p={p_value:.3g}, counts "
              f"{counts.tolist()}, expected {(probs * count).tolist()}")
        return p_value

    with _tree_server(tiny_models, 2, 6, log="tree_law.log", flags=flags) as url:
        p_values = confirmed_p_values(server_p_value, samples, f"tree server law {flags}")
    assert p_values[-1] > ALPHA, p_values
    _log_ok(str(tiny_models / "tree_law.log"), "hsd")


def test_tree_server_mixed_load_with_aborts(tiny_models):
    from benchmarks.bench_sglang_load import _safe, make_jobs, run_job, wait_idle
    from benchmarks.serving_harness import read_server_info

    vocab = 512
    jobs = make_jobs(32, seed=0, vocab=vocab)
    for job in jobs:  # short requests: the point is concurrency, aborts and KV bookkeeping
        job["sampling_params"]["max_new_tokens"] = min(job["sampling_params"]["max_new_tokens"], 16)
    with _tree_server(tiny_models, 3, 8, log="tree_load.log") as url:
        free_at_start = read_server_info(url).hsd["kv_available_size"]
        with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
            results = list(pool.map(lambda job: _safe(run_job, url, job, vocab), jobs))
        free_after = wait_idle(url, free_at_start)
    assert not [r for r in results if r["kind"] == "error"], results
    assert all(r["valid"] for r in results if r["kind"] == "complete")
    assert sum(r["kind"] == "complete" for r in results) >= 24
    assert free_after == free_at_start
    _log_ok(str(tiny_models / "tree_load.log"), "hsd")
