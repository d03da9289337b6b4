"""Checks that servers drafting with a separate language model share (the draft-cache catch-up
and tail-extend tests): greedy tokens with staggered arrivals, the target's law at T = 1, and the
KV pools back to their start after a mixed load."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from tests.sglang_plugin.server_law import confirmed_p_values
from tests.sglang_plugin.test_draft_model_server import (
    STAT_PROMPT, STAT_SAMPLES, STAT_TOKENS, _generate, _hsd_state, _pit_p_value, _target_pit)


def staggered_outputs(url, prompts, max_new_tokens):
    """Greedy outputs of ``prompts`` sent 50 ms apart, each while the earlier ones run (so
    batches mix requests at different points of their rounds)."""
    outputs = [None] * len(prompts)

    def run(i):
        time.sleep(0.05 * i)
        outputs[i] = _generate(url, prompts[i], max_new_tokens)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outputs


def assert_same_rounds(url, other_url, prompts, reference, max_new_tokens):
    """Greedy outputs of ``prompts``, one request at a time on each of two servers: both equal to
    ``reference`` (token lists), with the same draft budgets, accepted drafts per round (SGLang's
    per-request histogram) and verify counts, and the same server-wide accepted drafts per draft
    length (``/server_info`` ``hsd.adaptive``): a draft cache that differed anywhere would draft
    differently. Returns the ``adaptive.accepted_drafts_by_length`` both servers report."""
    first = [_generate(url, ids, max_new_tokens) for ids in prompts]
    second = [_generate(other_url, ids, max_new_tokens) for ids in prompts]
    for ids, expected, a, b in zip(prompts, reference, first, second):
        assert a["output_ids"] == expected and b["output_ids"] == expected, ids
        ma, mb = a["meta_info"], b["meta_info"]
        assert ma["hsd_draft_budget"] == mb["hsd_draft_budget"], ids
        assert ma["spec_correct_drafts_histogram"] == mb["spec_correct_drafts_histogram"], ids
        assert ma["spec_verify_ct"] == mb["spec_verify_ct"], ids
    # index a of each length's list: rounds of that length that kept a drafts
    by_length = _hsd_state(url)["adaptive"]["accepted_drafts_by_length"]
    assert by_length == _hsd_state(other_url)["adaptive"]["accepted_drafts_by_length"]
    return by_length


def law_p_values(url, target, label, prompt=STAT_PROMPT):
    """The PIT chi-square p-values (``server_law.confirmed_p_values``) of the server's first
    T = 1 tokens after ``prompt`` under the law of the model in folder ``target``."""

    def server_p_value(count):
        with ThreadPoolExecutor(max_workers=8) as pool:
            outs = list(pool.map(lambda _: _generate(url, prompt, STAT_TOKENS,
                                                     temperature=1.0), range(count)))
        sequences = torch.tensor([prompt + out["output_ids"] for out in outs])
        return _pit_p_value(_target_pit(target, sequences, prompt_len=len(prompt)))

    return confirmed_p_values(server_p_value, STAT_SAMPLES, label)


def assert_kv_returns(url, seed):
    """16 concurrent mixed requests (``bench_sglang_load``), every one valid, then the free slots
    of the target's and the draft's KV pools back to where they started."""
    from benchmarks.bench_sglang_load import make_jobs, run_job, wait_idle

    start = _hsd_state(url)
    jobs = make_jobs(16, seed=seed, vocab=512)
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        results = list(pool.map(lambda job: run_job(url, job, 512), jobs))
    assert all(r["valid"] for r in results), results
    wait_idle(url, start["kv_available_size"])
    end = _hsd_state(url)
    assert end["kv_available_size"] == start["kv_available_size"], (start, end)
    assert end["draft_kv_available_size"] == start["draft_kv_available_size"], (start, end)
