"""End to end on CPU: ``--hsd-cpu-linear onednn-packed`` in a server drafting with a separate
language model (tiny random pair, ``cpu/tiny_models.py``).

* both models' linear layers and lm_heads run the packed kernel (the server says how many);
* greedy output equals the target's plain greedy decoding token for token (the packed kernel is
  the same float32 product up to summation order);
* weight updates are answered with a failure naming the flag (the packed copies would be stale);
* a bfloat16 model with the flag is refused before its weights load, naming the flag.
"""

from __future__ import annotations

import json
import subprocess
import urllib.error

import pytest

from sglang_hsd.sglang_plugin.cpu.cpu_server import cpu_linear_flags
from tests.sglang_plugin.http_client import post_json

pytest.importorskip("sglang")
pytestmark = [pytest.mark.sglang, pytest.mark.slow]

PROMPTS = [[1, 40, 41, 42], [1, 77, 300, 12, 9], [1, 5]]
MAX_NEW_TOKENS = 12
PACKED = cpu_linear_flags("onednn-packed")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from sglang_hsd.sglang_plugin.cpu.tiny_models import build_tiny_draft_pair

    root = tmp_path_factory.mktemp("cpu_linear_server")
    return (root, *build_tiny_draft_pair(str(root)))


def test_packed_server_greedy_equals_target_and_refuses_weight_updates(pair):
    from sglang_hsd.runtime.model import CausalLM
    from sglang_hsd.runtime.testing import greedy_reference
    from sglang_hsd.sglang_plugin.cpu.cpu_server import (
        draft_model_server_command, free_port, running_server, server_env)

    root, target, draft = pair
    model = CausalLM.from_pretrained(target)
    reference = [greedy_reference(model, ids, MAX_NEW_TOKENS) for ids in PROMPTS]
    cmd = draft_model_server_command(target, free_port(), draft, num_steps=3,
                                     extra=["--dtype", "float32", *PACKED])
    log_path = root / "server_packed.log"
    with running_server(cmd, server_env(), str(log_path)) as url:
        for ids, expected in zip(PROMPTS, reference):
            out = post_json(url, "/generate", {"input_ids": ids, "sampling_params": {
                "max_new_tokens": MAX_NEW_TOKENS, "temperature": 0.0, "ignore_eos": True}})
            assert out["output_ids"] == expected, ids
            assert out["meta_info"]["spec_verify_ct"] >= 1
        with pytest.raises(urllib.error.HTTPError) as refused:  # SGLang answers a failure with 400
            post_json(url, "/update_weights_from_disk", {"model_path": target})
        answer = json.loads(refused.value.read())
        assert answer["success"] is False
        assert "--hsd-cpu-linear onednn-packed cannot update weights" in answer["message"]
    log = log_path.read_text()
    assert "Traceback" not in log
    # Target and draft (4 and 1 decoder layers of 4 linear layers each, plus their lm_heads).
    assert log.count("run oneDNN's packed kernel") == 2, log[-2000:]


def test_packed_server_refuses_a_bfloat16_model(pair):
    from sglang_hsd.sglang_plugin.cpu.cpu_server import cpu_server_command, free_port, server_env

    root, target, _ = pair
    cmd = cpu_server_command(target, free_port(), extra=["--dtype", "bfloat16", *PACKED])
    proc = subprocess.run(cmd, env=server_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0
    assert "--hsd-cpu-linear onednn-packed needs a float32 model (--dtype float32)" in (
        proc.stdout + proc.stderr)
