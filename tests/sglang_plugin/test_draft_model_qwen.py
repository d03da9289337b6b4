"""Qwen2.5-Coder 0.5B drafting for Qwen2.5-Coder 1.5B through the HSD server (slow, real weights).

``--speculative-algorithm HSD --speculative-draft-model-path qwen2.5-coder-0.5b`` (the draft kind
is detected from its config: a causal LM, so a separate draft language model with its own KV
cache), float32 on CPU: greedy output equals plain greedy decoding of the 1.5B target token for
token on 2 prompts x 16 tokens, and drafts were accepted; and with a round plan of three levels
(``--hsd-plan``: the 0.5B, the 1.5B's exit after layer 24, the 1.5B) the same output, with the
exit level's counters in ``/server_info``; and with a plan whose lookup level drafts for the 0.5B
(``lookup:3,model:...,target``), the same output with copies accepted. Skips when the models are
not in the cache. A few minutes on 2 cores.
"""

from __future__ import annotations

import gc
import json
import os
from pathlib import Path

import pytest

from tests.sglang_plugin.http_client import get_json, post_json

pytest.importorskip("sglang")
pytestmark = [pytest.mark.sglang, pytest.mark.slow]

CACHE = Path(os.environ.get("SGLANG_HSD_CACHE", Path.home() / ".cache" / "sglang-hsd"))
TARGET = CACHE / "models" / "qwen2.5-coder-1.5b"
DRAFT = CACHE / "models" / "qwen2.5-coder-0.5b"
PROMPTS = ["Write a Python function that checks whether a number is prime.",
           "Explain what a hash map is.",
           # re-typed code: the lookup level's copies are accepted
           "Add a docstring to this function and return the whole function:\n\n"
           "def scale(values, factor):\n    return [value * factor for value in values]\n"]
MAX_NEW_TOKENS = 16


@pytest.fixture(scope="module")
def expected():
    missing = [str(p) for p in (TARGET, DRAFT) if not p.is_dir()]
    if missing:
        pytest.skip(f"missing {', '.join(missing)}: run `sglang-hsd fetch qwen2.5-coder-0.5b` and "
                    "`sglang-hsd fetch qwen2.5-coder-1.5b`")
    from transformers import AutoTokenizer

    from sglang_hsd.assets.chat import encode_prompts
    from sglang_hsd.runtime.model import CausalLM
    from sglang_hsd.runtime.testing import greedy_reference

    prompts = encode_prompts(AutoTokenizer.from_pretrained(str(TARGET)), PROMPTS)
    model = CausalLM.from_pretrained(str(TARGET))
    references = [greedy_reference(model, p, MAX_NEW_TOKENS) for p in prompts]
    del model  # 6 GB in float32: freed before the server loads its own copy
    gc.collect()
    return prompts, references


def _serve_greedy(extra: list[str], prompts, references, log: Path, draft_kind: str | None = "model") -> tuple[list, dict]:
    """Serve the pair (float32, chains of 4) with ``extra`` flags, greedy-decode ``prompts``, check
    each output against its reference and the log for tracebacks; (outputs, the HSD state of
    ``/server_info``)."""
    from sglang_hsd.sglang_plugin.cpu.cpu_server import (
        draft_model_server_command, free_port, running_server, server_env, sized_memory_flags)

    # Sized from free memory: SGLang's default share (0.716 on CPU) leaves the pair's 8.9 GB of
    # float32 weights no KV room on a host with under 12.4 GB free.
    memory = sized_memory_flags([str(TARGET), str(DRAFT)], "float32")
    cmd = draft_model_server_command(str(TARGET), free_port(), str(DRAFT), num_steps=4,
                                     extra=["--dtype", "float32", *memory, *extra], draft_kind=draft_kind)
    with running_server(cmd, server_env(), str(log), timeout=1200) as url:
        outs = [post_json(url, "/generate", {"input_ids": ids, "sampling_params": {
            "max_new_tokens": MAX_NEW_TOKENS, "temperature": 0.0, "ignore_eos": True}},
            timeout=900) for ids in prompts]
        state = get_json(url, "/server_info")["internal_states"][0]["hsd"]
    for ids, out, reference in zip(prompts, outs, references):
        assert out["output_ids"] == reference, ids
    assert "Traceback" not in log.read_text()
    return outs, state


def test_qwen_pair_greedy_equals_target(expected, tmp_path):
    # no --hsd-draft-kind: detected from the draft's config
    outs, state = _serve_greedy([], *expected, tmp_path / "qwen_server.log", draft_kind=None)
    # per request: SGLang's server-wide average appears only after a 40-step decode-log interval
    accept = sum(o["meta_info"]["spec_accept_length"] for o in outs) / len(outs)
    assert accept > 1.0
    assert state["draft_kv_shares_allocator"]
    print(f"\nQwen2.5-Coder 0.5B -> 1.5B greedy: accept length {accept:.2f}")


EXIT_LAYER = 24  # of 28: the logit lens agrees with the final argmax on 91% of code tokens there


def test_qwen_pair_serves_a_plan_with_one_intermediate_exit(expected, tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"levels": f"model:{DRAFT},exit:{EXIT_LAYER},target", "buffers": "4,1"}))
    _, state = _serve_greedy(["--hsd-plan", str(plan)], *expected, tmp_path / "qwen_plan_server.log")
    levels = state["levels"]
    assert state["exit_layer"] == EXIT_LAYER
    # Every level worked: the exit saw the 0.5B's drafts, the target the exit's chains.
    assert levels["exit_proposed"] > 0 and levels["target_proposed"] > 0 and levels["rounds"] > 0
    print(f"\nQwen2.5-Coder 0.5B -> 1.5B exit {EXIT_LAYER} -> 1.5B greedy, per level: {levels}")


def test_qwen_pair_serves_a_plan_with_a_lookup_level_below_the_draft_model(expected, tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"levels": f"lookup:3,model:{DRAFT},target", "buffers": "3,4"}))
    _, state = _serve_greedy(["--hsd-plan", str(plan), "--hsd-adaptive", "off"], *expected,
                             tmp_path / "qwen_lookup_server.log")
    lookup = state["draft_lookup"]
    assert (lookup["ngram"], lookup["copies"]) == (3, 3)
    # The lookup's copies were accepted by the 0.5B's draws, with fewer forwards than its steps.
    assert lookup["accepted"] > 0 and lookup["forwards"] < lookup["chain_forwards"], lookup
    print(f"\nQwen2.5-Coder lookup:3 -> 0.5B -> 1.5B greedy, lookup level: {lookup}")
