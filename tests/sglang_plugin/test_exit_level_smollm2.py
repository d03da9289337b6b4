"""SmolLM2-135M-Instruct through the HSD server with the early-exit level (slow, real weights).

``--hsd-exit-layer 16`` with the trained exit heads (``heads/smollm2-135m/exit``) and the trained
EAGLE-3 head, exit buffer N_i = 1 and N_i = K + 1 = 5: greedy output equals plain greedy decoding
of the same weights (float32) token for token; every round's acceptance at the exit (per
sub-round) and at the target equals the runtime's windowed round (``HierarchyConfig.window``)
with the same heads; sampled requests complete. Skips when the model or the heads are not in
the cache. ~4 minutes per buffer on 2 cores.
"""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("sglang")
pytestmark = [pytest.mark.sglang, pytest.mark.slow]

CACHE = Path(os.environ.get("SGLANG_HSD_CACHE", Path.home() / ".cache" / "sglang-hsd"))
MODEL = CACHE / "models" / "smollm2-135m"
HEADS = CACHE / "heads" / "smollm2-135m"
PROMPTS = ["Explain what a hash map is.", "Write a Python function that adds two numbers."]
MAX_NEW_TOKENS = 24
EXIT_LAYER = 16
NUM_STEPS = 4


def _post(url, path, payload):
    req = urllib.request.Request(url + path, data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=900) as resp:
        return json.loads(resp.read())


@pytest.fixture(scope="module")
def assets():
    missing = [p for p in (MODEL, HEADS / "eagle3", HEADS / "exit") if not p.is_dir()]
    if missing:
        pytest.skip(f"missing {', '.join(map(str, missing))}: run `sglang-hsd fetch smollm2-135m` "
                    "and train the heads (`sglang-hsd train-heads --model smollm2-135m --eagle3`)")
    from transformers import AutoTokenizer

    from sglang_hsd.assets.chat import encode_prompts
    from sglang_hsd.runtime.model import CausalLM
    from sglang_hsd.runtime.testing import greedy_reference

    tokenizer = AutoTokenizer.from_pretrained(str(MODEL))
    model = CausalLM.from_pretrained(str(MODEL))
    prompts = encode_prompts(tokenizer, PROMPTS)
    return prompts, [greedy_reference(model, p, MAX_NEW_TOKENS) for p in prompts], model


def _runtime_rounds(model, prompts, expected, exit_buffer):
    """Per prompt, the runtime's windowed rounds [(exit accepted per sub-round, target accepted)]
    after prompt + the first token (which SGLang samples in its prefill)."""
    from sglang_hsd.runtime.exit_heads import load_exit_heads
    from sglang_hsd.runtime.config import parse_levels
    from sglang_hsd.runtime.engine import SpeculativeGenerator
    from sglang_hsd.sampling import SamplingParams

    config = parse_levels(f"eagle3:{HEADS / 'eagle3'},exit:{EXIT_LAYER},target",
                          buffers=[NUM_STEPS, exit_buffer], window=True)
    generator = SpeculativeGenerator(model, config,
                                     exit_heads=load_exit_heads(str(HEADS / "exit"), model))
    rounds = []
    for ids, reference in zip(prompts, expected):
        result = generator.generate([ids + reference[:1]], SamplingParams(temperature=0.0),
                                    max_new_tokens=MAX_NEW_TOKENS - 1, trace_rounds=True)
        assert result.tokens[0] == reference[1:]
        rounds.append([(r["exit_accepted"], r["target_accepted"]) for r in result.round_trace[0]])
    return rounds


@pytest.mark.parametrize("exit_buffer", [1, NUM_STEPS + 1])
def test_smollm2_exit_level_greedy_equals_target(assets, tmp_path, exit_buffer):
    from sglang_hsd.sglang_plugin.cpu.cpu_server import (
        cpu_server_command, free_port, running_server, server_env)

    prompts, expected, model = assets
    cmd = cpu_server_command(str(MODEL), free_port(), "HSD", str(HEADS / "eagle3"),
                             num_steps=NUM_STEPS,
                             extra=["--hsd-exit-layer", str(EXIT_LAYER), "--hsd-exit-heads",
                                    str(HEADS / "exit"), "--dtype", "float32",
                                    "--hsd-exit-buffer", str(exit_buffer)])
    server_rounds = []
    with running_server(cmd, server_env(), str(tmp_path / "server.log"), timeout=900) as url:
        for ids, reference in zip(prompts, expected):
            out = _post(url, "/generate", {"input_ids": ids, "sampling_params": {
                "max_new_tokens": MAX_NEW_TOKENS, "temperature": 0.0, "ignore_eos": True}})
            assert out["output_ids"] == reference
            meta = out["meta_info"]
            server_rounds.append(list(zip(meta["hsd_exit_sub_rounds"],
                                          meta["hsd_target_accepted"])))
        sampled = _post(url, "/generate", {"input_ids": prompts[0], "sampling_params": {
            "max_new_tokens": MAX_NEW_TOKENS, "temperature": 0.8, "top_p": 0.95,
            "ignore_eos": True}})
        assert len(sampled["output_ids"]) == MAX_NEW_TOKENS
        with urllib.request.urlopen(url + "/server_info", timeout=30) as resp:
            state = json.loads(resp.read())["internal_states"][0]["hsd"]
    assert "Traceback" not in (tmp_path / "server.log").read_text()
    assert state["exit_layer"] == EXIT_LAYER
    if exit_buffer == 1:
        assert state["levels"]["layer_forwards_saved"] > 0
    runtime_rounds = _runtime_rounds(model, prompts, expected, exit_buffer)
    assert server_rounds == runtime_rounds
    print(f"\nSmolLM2 exit level, N_i={exit_buffer}: {state['levels']}\nrounds: {server_rounds}")
