"""SmolLM2-135M-Instruct through the HSD server with the early-exit level (slow, real weights).

``--hsd-exit-layer 16`` with the trained exit heads (``heads/smollm2-135m/exit``) and the trained
EAGLE-3 head: greedy output equals plain greedy decoding of the same weights (transformers,
float32) token for token; sampled requests complete; the exit level saved target
layer-forwards. Skips when the model or the heads are not in the cache. ~5 minutes on 2 cores.
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
                    "and train the heads (python -m eagle_heads.cli)")
    from transformers import AutoTokenizer

    from sglang_hsd.runtime.model import CausalLM
    from sglang_hsd.runtime.testing import greedy_reference

    tokenizer = AutoTokenizer.from_pretrained(str(MODEL))
    model = CausalLM.from_pretrained(str(MODEL))
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": p}],
                                           add_generation_prompt=True, tokenize=False)
             for p in PROMPTS]
    prompts = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    return prompts, [greedy_reference(model, p, MAX_NEW_TOKENS) for p in prompts]


def test_smollm2_exit_level_greedy_equals_target(assets, tmp_path):
    from sglang_hsd.sglang_plugin.cpu_server import (
        cpu_server_command, free_port, running_server, server_env)

    prompts, expected = assets
    cmd = cpu_server_command(str(MODEL), free_port(), "HSD", str(HEADS / "eagle3"), num_steps=4,
                             extra=["--hsd-exit-layer", str(EXIT_LAYER), "--hsd-exit-heads",
                                    str(HEADS / "exit"), "--dtype", "float32"])
    with running_server(cmd, server_env(), str(tmp_path / "server.log"), timeout=900) as url:
        for ids, reference in zip(prompts, expected):
            out = _post(url, "/generate", {"input_ids": ids, "sampling_params": {
                "max_new_tokens": MAX_NEW_TOKENS, "temperature": 0.0, "ignore_eos": True}})
            assert out["output_ids"] == reference
        sampled = _post(url, "/generate", {"input_ids": prompts[0], "sampling_params": {
            "max_new_tokens": MAX_NEW_TOKENS, "temperature": 0.8, "top_p": 0.95,
            "ignore_eos": True}})
        assert len(sampled["output_ids"]) == MAX_NEW_TOKENS
        with urllib.request.urlopen(url + "/server_info", timeout=30) as resp:
            state = json.loads(resp.read())["internal_states"][0]["hsd"]
    assert "Traceback" not in (tmp_path / "server.log").read_text()
    assert state["exit_layer"] == EXIT_LAYER
    assert state["levels"]["layer_forwards_saved"] > 0
    print(f"\nSmolLM2 exit level: {state['levels']}")
