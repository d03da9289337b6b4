"""SmolLM2-135M-Instruct with its trained EAGLE-3 head through the HSD tree server (slow, real
weights): for the tree shapes of the serving benchmark ((D, k, N) = (5, 4, 8) and (4, 2, 8)),
sampled trees and SGLang's stock top-k trees give greedy output equal to plain greedy decoding of
the same weights (float32) token for token, and every request reports an accept length. Skips
when the model or the head is not in the cache. ~2 minutes per server on 2 cores.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.sglang_plugin.http_client import post_json

pytest.importorskip("sglang")
pytestmark = [pytest.mark.sglang, pytest.mark.slow]

CACHE = Path(os.environ.get("SGLANG_HSD_CACHE", Path.home() / ".cache" / "sglang-hsd"))
MODEL = CACHE / "models" / "smollm2-135m"
HEAD = CACHE / "heads" / "smollm2-135m" / "eagle3"
PROMPTS = ["Explain what a hash map is.", "Write a Python function that adds two numbers."]
MAX_NEW_TOKENS = 24
# (steps, topk, draft tokens incl. the root, --hsd-tree-draft)
SHAPES = [(5, 4, 8, "sampled"), (4, 2, 8, "sampled"), (5, 4, 8, "topk")]


@pytest.fixture(scope="module")
def reference():
    missing = [p for p in (MODEL, HEAD) if not p.is_dir()]
    if missing:
        pytest.skip(f"missing {', '.join(map(str, missing))}: run `sglang-hsd fetch smollm2-135m` "
                    "and `sglang-hsd train-heads --model smollm2-135m --no-exit --eagle3`")
    from transformers import AutoTokenizer

    from sglang_hsd.assets.chat import encode_prompts
    from sglang_hsd.runtime.model import CausalLM
    from sglang_hsd.runtime.testing import greedy_reference

    prompts = encode_prompts(AutoTokenizer.from_pretrained(str(MODEL)), PROMPTS)
    model = CausalLM.from_pretrained(str(MODEL))
    return prompts, [greedy_reference(model, p, MAX_NEW_TOKENS) for p in prompts]


@pytest.mark.parametrize("steps, topk, num_tokens, tree_draft", SHAPES)
def test_smollm2_tree_server_greedy_equals_target(reference, tmp_path, steps, topk, num_tokens,
                                                  tree_draft):
    from sglang_hsd.sglang_plugin.cpu.cpu_server import (
        cpu_server_command, free_port, running_server, server_env)

    prompts, expected = reference
    cmd = cpu_server_command(str(MODEL), free_port(), "HSD", str(HEAD), num_steps=steps,
                             topk=topk, num_draft_tokens=num_tokens,
                             extra=["--hsd-tree-draft", tree_draft, "--dtype", "float32"])
    with running_server(cmd, server_env(), str(tmp_path / "server.log"), timeout=900) as url:
        for ids, want in zip(prompts, expected):
            out = post_json(url, "/generate", {"input_ids": ids, "sampling_params": {
                "max_new_tokens": MAX_NEW_TOKENS, "ignore_eos": True, "temperature": 0.0}})
            assert out["output_ids"] == want, (steps, topk, tree_draft, ids[-8:])
            assert 1.0 <= out["meta_info"]["spec_accept_length"] <= steps + 1
    assert "Traceback" not in (tmp_path / "server.log").read_text()
