"""End to end on CPU: ``--speculative-algorithm HSD --hsd-exit-layer 2`` (EAGLE-3 drafts -> the
target's first 2 of 4 layers + logit lens -> full target) on a tiny random Llama, with exit buffer
N_i = 1 (one exit sub-round per round) and N_i = 4 (exit sub-rounds fill the 4-position window).

One server per buffer (float32, radix cache off, split self-check on) checks:
* greedy output equals plain greedy decoding of the same weights (transformers) token for token,
  alone and inside a batch that mixes greedy, T=1, top-k and top-p requests;
* every request of the mixed batch completes with its length;
* per-request ``meta_info`` carries each round's exit acceptance per sub-round and the target's,
  and the sub-rounds follow the rule (stop once N_i tokens are provisional or the window is full);
* the runtime's windowed rounds (``HierarchyConfig.window``) agree with the server round by round
  at T = 0, and in distribution at T = 1 (accepted lengths per sub-round and per round);
* ``/server_info``: the exit level ran, saved target layer-forwards, its split forward (layers
  [0, 2) then [2, 4) over the surviving positions) matched SGLang's full verify forward, and the
  KV pool's free slots returned to their starting count after all requests.
~1-2 minutes per buffer on 2 cores.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from sglang_hsd.verify.oracles.stats import two_sample_p_value
from tests.sglang_plugin.http_client import get_json, post_json

pytest.importorskip("sglang")
pytestmark = [pytest.mark.sglang]

PROMPTS = [[1, 40, 41, 42], [1, 77, 300, 12, 9], [1, 5], [1, 200, 201, 202, 203, 204]]
MAX_NEW_TOKENS = 20
NUM_STEPS = 3  # K drafts: a verify window of 4 positions
SAMPLED_REPEATS = 12  # T = 1 requests per prompt for the runtime / server law comparison
# Split vs full verify forward (float32; different attention kernels for the two passes).
SPLIT_LOGIT_TOLERANCE = 1e-3


def _generate(url, ids, **sampling):
    params = {"max_new_tokens": MAX_NEW_TOKENS, "ignore_eos": True, "temperature": 0.0}
    params.update(sampling)
    return post_json(url, "/generate", {"input_ids": ids, "sampling_params": params})


def _hsd_state(url):
    return get_json(url, "/server_info")["internal_states"][0]["hsd"]


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    from eagle_heads.eagle3 import build_random_eagle3_head
    from sglang_hsd.sglang_plugin.cpu.tiny_models import build_tiny_llama

    root = tmp_path_factory.mktemp("hsd_exit")
    config = build_tiny_llama(str(root / "target"), init_std=0.1)
    build_random_eagle3_head(str(root / "eagle3"), config, draft_vocab_size=config.vocab_size // 2)
    return root


def _runtime_rounds(tiny_models, exit_buffer, prompts, temperature):
    """The runtime's windowed rounds (``HierarchyConfig.window``) for the same hierarchy, per
    prompt: [(exit accepted per sub-round, target accepted)] for each round. SGLang emits the
    first token from its prefill, so each prompt must already end with that token."""
    from sglang_hsd.runtime.config import parse_levels
    from sglang_hsd.runtime.engine import SpeculativeGenerator
    from sglang_hsd.runtime.model import CausalLM
    from sglang_hsd.sampling import SamplingParams

    model = CausalLM.from_pretrained(str(tiny_models / "target"))
    config = parse_levels(f"eagle3:{tiny_models / 'eagle3'},exit:2,target",
                          buffers=[NUM_STEPS, exit_buffer], window=True)
    result = SpeculativeGenerator(model, config).generate(
        prompts, SamplingParams(temperature=temperature), max_new_tokens=MAX_NEW_TOKENS - 1,
        trace_rounds=True, seed=0)
    return [[(r["exit_accepted"], r["target_accepted"]) for r in rounds]
            for rounds in result.round_trace]


def _histograms(rounds_per_request, width):
    """(drafts the exit accepted per sub-round [width], tokens the target accepted per round
    [width + 1]) counted over every round of every request."""
    exit_counts, target_counts = torch.zeros(width), torch.zeros(width + 1)
    for rounds in rounds_per_request:
        for subs, taken in rounds:
            for accepted in subs:
                exit_counts[accepted] += 1
            target_counts[taken] += 1
    return exit_counts, target_counts


def _reference(target_dir):
    from sglang_hsd.runtime.model import CausalLM
    from sglang_hsd.runtime.testing import greedy_reference

    model = CausalLM.from_pretrained(target_dir)
    return [greedy_reference(model, ids, MAX_NEW_TOKENS) for ids in PROMPTS]


@pytest.mark.parametrize("exit_buffer", [1, 4])
def test_exit_level_server_end_to_end(tiny_models, exit_buffer):
    from sglang_hsd.sglang_plugin.cpu.cpu_server import (
        cpu_server_command, free_port, running_server, server_env)

    target, head = str(tiny_models / "target"), str(tiny_models / "eagle3")
    expected = _reference(target)
    cmd = cpu_server_command(target, free_port(), "HSD", head, num_steps=NUM_STEPS, extra=[
        "--hsd-exit-layer", "2", "--hsd-exit-heads", "none", "--dtype", "float32",
        "--disable-radix-cache", "--hsd-exit-buffer", str(exit_buffer)])
    env = server_env()
    env["SGLANG_HSD_CHECK_SPLIT"] = "1"
    log_path = str(tiny_models / f"exit_server_{exit_buffer}.log")
    with running_server(cmd, env, log_path, timeout=600) as url:
        free_at_start = _hsd_state(url)["kv_available_size"]
        server_rounds = []
        for ids, reference in zip(PROMPTS, expected):
            out = _generate(url, ids)
            assert out["output_ids"] == reference, ids
            meta = out["meta_info"]  # one entry per verify round and level
            server_rounds.append(list(zip(meta["hsd_exit_sub_rounds"], meta["hsd_target_accepted"])))
            assert len(meta["hsd_exit_accepted"]) == meta["spec_verify_ct"]
            emitted = 1  # SGLang's prefill emits the first token
            for total, subs, taken in zip(meta["hsd_exit_accepted"], meta["hsd_exit_sub_rounds"],
                                          meta["hsd_target_accepted"]):
                provisional = sum(a + 1 for a in subs)  # n: what the target verified
                assert sum(subs) == total and 0 <= taken <= provisional <= NUM_STEPS + 1
                # sub-rounds stop exactly when N_i tokens are provisional, the window is full or
                # the chain holds every token the request may still emit
                limit = min(exit_buffer, NUM_STEPS, MAX_NEW_TOKENS - emitted)
                assert provisional >= limit and provisional - (subs[-1] + 1) < limit
                emitted += provisional if taken == provisional else taken + 1
            if exit_buffer == 1:
                assert all(len(subs) == 1 for subs in meta["hsd_exit_sub_rounds"])

        requests = [dict(temperature=0.0), dict(temperature=1.0), dict(temperature=0.8, top_k=20),
                    dict(temperature=1.0, top_p=0.9)]
        jobs = [(ids, sampling) for ids in PROMPTS for sampling in requests]
        with ThreadPoolExecutor(max_workers=8) as pool:
            outputs = list(pool.map(lambda job: _generate(url, job[0], **job[1]), jobs))
        for (ids, sampling), out in zip(jobs, outputs):
            assert len(out["output_ids"]) == MAX_NEW_TOKENS
            if sampling["temperature"] == 0.0:  # greedy rows inside a mixed batch
                assert out["output_ids"] == expected[PROMPTS.index(ids)], ids
        # T = 1: the server's random streams are its own, so compare laws, not draws.
        sampled_jobs = [ids for ids in PROMPTS for _ in range(SAMPLED_REPEATS)]
        with ThreadPoolExecutor(max_workers=8) as pool:
            sampled = list(pool.map(lambda ids: _generate(url, ids, temperature=1.0), sampled_jobs))
        state = _hsd_state(url)
    # The runtime and the server agree round by round on what each level accepted (greedy: the
    # sampling streams are identical by construction).
    runtime_rounds = _runtime_rounds(
        tiny_models, exit_buffer, [ids + ref[:1] for ids, ref in zip(PROMPTS, expected)], 0.0)
    for ids, server, runtime in zip(PROMPTS, server_rounds, runtime_rounds):
        assert server == runtime, (ids, server, runtime)
    # At T = 1 the two produce the same distribution of accepted lengths (two-sample chi-square
    # over every round of 48 requests; rounds of one request are not independent, hence 1e-4).
    server_sampled = [list(zip(out["meta_info"]["hsd_exit_sub_rounds"],
                               out["meta_info"]["hsd_target_accepted"])) for out in sampled]
    runtime_sampled = _runtime_rounds(
        tiny_models, exit_buffer, [ids + out["output_ids"][:1]
                                   for ids, out in zip(sampled_jobs, sampled)], 1.0)
    for server_counts, runtime_counts in zip(_histograms(server_sampled, NUM_STEPS + 1),
                                             _histograms(runtime_sampled, NUM_STEPS + 1)):
        assert two_sample_p_value(server_counts, runtime_counts) > 1e-4, (server_counts,
                                                                           runtime_counts)
    compared = [r for rounds in server_rounds for r in rounds]
    assert any(sum(subs) > 0 for subs, _ in compared) and any(t > 0 for _, t in compared)
    print(f"\nN_i={exit_buffer}: {len(compared)} rounds agree, e.g. {server_rounds[0][:6]}")
    with open(log_path) as f:
        log = f.read()
    assert "Traceback" not in log
    assert "exit level at layer 2 of 4 (logit lens)" in log
    levels = state["levels"]
    assert levels["rounds"] > 0
    if exit_buffer == 1:
        assert levels["exit_subrounds"] == levels["rounds"]
        assert 0.0 < levels["layer_forwards_saved"] < 0.5
    else:  # later sub-rounds re-run window positions through layers [0, 2): no saving promised
        assert levels["exit_subrounds_per_round"] > 1.0
        assert levels["target_proposed"] / levels["rounds"] > 1.5
    assert state["max_split_logit_diff"] < SPLIT_LOGIT_TOLERANCE, state
    assert state["kv_available_size"] == free_at_start, state
    print(f"\nexit level: {levels}")
