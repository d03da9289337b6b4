"""A checkpoint's own sampling defaults reach HSD: requests that set nothing are served with them.

The tiny random target carries the generation_config.json ``sglang-hsd fetch`` writes for the Qwen
pair (``registry.QWEN25_SMALL_INSTRUCT_DEFAULTS``: temperature 0.7, top_k 20, top_p 0.8,
repetition_penalty 1.1), and SGLang applies it to every chat request that leaves a parameter out
(its log: "Using default chat sampling params from model generation config"; SGLang 0.5.23's
native /generate does not apply them). The server is the one ``sglang-hsd serve`` builds, its
chain drafting 3 tokens every round. Chat requests carry only a seed, so their tokens are fixed:
each token after the first is the keyed Gumbel-max draw (``verify/coupled.py``) of the target's
row with the defaults applied, which this test recomputes with transformers, the project's
penalty reference and ``sampling.logits_to_probs``. The same reference without the repetition
penalty, or without top-k and top-p, gives other tokens (so each default is seen). The first token
comes from SGLang's own sampler, which keys its draw by rank under top-k: not recomputed here.
About a minute and a half on 2 cores.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from tests.sglang_plugin.http_client import post_json

pytest.importorskip("sglang")
pytestmark = [pytest.mark.sglang, pytest.mark.slow]

NEW_TOKENS = 48
SEEDS = (3, 4, 5, 6)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from sglang_hsd.assets.registry import QWEN25_SMALL_INSTRUCT_DEFAULTS
    from sglang_hsd.sglang_plugin.cpu.cpu_server import free_port, running_server
    from sglang_hsd.sglang_plugin.cpu.tiny_models import build_tiny_draft_pair
    from sglang_hsd.sglang_plugin.serve_launch import ServeConfig, build_launch, resolve_models

    root = tmp_path_factory.mktemp("model_defaults")
    target, draft = build_tiny_draft_pair(str(root))
    path = os.path.join(target, "generation_config.json")
    config = json.load(open(path)) if os.path.exists(path) else {}
    config.update(dict(QWEN25_SMALL_INSTRUCT_DEFAULTS))
    with open(path, "w") as f:
        json.dump(config, f)
    launch_config = ServeConfig(target=target, draft=draft, device="cpu",
                                sglang_args=("--port", str(free_port()), "--hsd-draft-lengths-cycle", "3"))
    launch = build_launch(launch_config, resolve_models(launch_config, fetch=None), "cpu")
    log = root / "server.log"
    outputs = {}
    with running_server(launch.command, {**os.environ, **launch.env}, str(log)) as url:
        for seed in SEEDS:
            body = {"model": "tiny", "messages": [{"role": "user", "content": f"Hello number {seed}"}],
                    "seed": seed, "max_tokens": NEW_TOKENS, "ignore_eos": True,
                    "return_prompt_token_ids": True, "return_token_ids": True}
            choice = post_json(url, "/v1/chat/completions", body)["choices"][0]
            outputs[seed] = (choice["prompt_token_ids"], choice["response_token_ids"])
    assert "Traceback" not in log.read_text()
    return target, outputs


def _reference(model_dir, prompt, output, seed, temperature=0.7, top_k=20, top_p=0.8, repetition=1.1):
    """Tokens 2.. of a seeded request given its first token: each the keyed draw of the target's
    row (repetition penalty on the output so far, temperature, top-k, top-p), keyed by the
    position of the row's input token, as plain seeded decoding draws it."""
    from transformers import AutoModelForCausalLM

    from sglang_hsd.sampling import SamplingParams, logits_to_probs
    from sglang_hsd.verify.coupled import keyed_draw
    from tests.penalty_reference import penalised_logits

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    tokens = list(output[:1])
    with torch.no_grad():
        for _ in range(len(output) - 1):
            logits = model(torch.tensor([prompt + tokens])).logits[0, -1].double().numpy()
            row = torch.from_numpy(penalised_logits(logits, tokens, repetition=repetition)).float()
            probs = logits_to_probs(row.unsqueeze(0), params)
            position = torch.tensor([len(prompt) + len(tokens) - 1])
            tokens.append(int(keyed_draw(probs, torch.tensor([seed]), position)))
    return tokens


def test_requests_without_parameters_get_the_checkpoints_defaults(served):
    target, outputs = served
    for seed, (prompt, output) in outputs.items():
        assert len(output) == NEW_TOKENS
        assert _reference(target, prompt, output, seed) == output, seed


def test_each_default_changes_the_tokens(served):
    target, outputs = served
    served_tokens = [output for _, output in outputs.values()]
    without_penalty = [_reference(target, *pair, seed, repetition=1.0) for seed, pair in outputs.items()]
    without_filters = [_reference(target, *pair, seed, top_k=0, top_p=1.0) for seed, pair in outputs.items()]
    assert without_penalty != served_tokens
    assert without_filters != served_tokens
