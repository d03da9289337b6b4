"""Acceptance and cost measurement on tiny random models; the plan command end to end."""

import argparse
import json

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from sglang_hsd.hierarchy.measure import target_continuation, measure_acceptance, measure_costs  # noqa: E402
from sglang_hsd.runtime.plan_file import PlanFile, PlannedHierarchy  # noqa: E402
from sglang_hsd.hierarchy.planner import Plan  # noqa: E402
from sglang_hsd.runtime.model import CausalLM  # noqa: E402
from sglang_hsd.runtime.testing import tiny_llama  # noqa: E402
from sglang_hsd.sampling import SamplingParams, logits_to_probs  # noqa: E402

# Group-by-group and one-shot forwards sum float32 in different orders.
PROB_ATOL = 1e-5


@pytest.fixture(scope="module")
def tiny():
    return CausalLM.from_hf(tiny_llama(vocab_size=48, num_layers=6, hidden_size=32, seed=2))


def _direct_alpha(model, prompts, exits, params, continuation):
    """Each exit on its own fresh cache, then sum(min(p_i, p_j)) position by position."""
    num = len(exits) + 1
    total, count = np.zeros((num, num)), 0
    for prompt in prompts:
        ids = prompt + target_continuation(model, prompt, continuation)
        probs = []
        for end in list(exits) + [model.num_layers]:
            hidden = model.forward_layers(model.embed(torch.tensor([ids])), 0, end, model.new_cache(1, len(ids)))
            probs.append(logits_to_probs(model.exit_logits(hidden), params)[0])
        for pos in range(len(prompt) - 1, len(ids) - 1):
            for i in range(num):
                for j in range(i + 1, num):
                    total[i, j] += float(torch.minimum(probs[i][pos], probs[j][pos]).sum())
            count += 1
    return total / count


@pytest.mark.parametrize("params", [SamplingParams(1.0), SamplingParams(0.0), SamplingParams(0.7, top_k=10)])
def test_acceptance_matches_direct_computation(tiny, params):
    prompts = [[1, 5, 9, 3], [7, 7, 2]]
    exits = [1, 3, 4]
    with torch.inference_mode():
        got = measure_acceptance(tiny, prompts, exits, params, continuation=5)
        want = _direct_alpha(tiny, prompts, exits, params, 5)
    assert got.shape == (4, 4)
    np.testing.assert_allclose(got, want, atol=PROB_ATOL)
    assert np.all(got[np.triu_indices(4, 1)] > 0) and np.all(got <= 1 + PROB_ATOL)
    if params.greedy:  # one-hot rows: alpha is an agreement rate over 2 x 5 positions
        np.testing.assert_allclose(got * 10, np.round(got * 10), atol=PROB_ATOL)


def test_acceptance_rejects_bad_exits(tiny):
    with pytest.raises(ValueError, match="exits"):
        measure_acceptance(tiny, [[1, 2]], [3, 2])


def test_costs_are_positive_and_compose(tiny):
    costs, prefix = measure_costs(tiny, [2, 4], context_len=16, token_counts=(1, 2, 4), repeats=3)
    assert set(prefix) == {2, 4, 6}
    assert all(v > 0 for v in prefix.values())
    assert costs.draft_step(0) > 0 and costs.autoregressive_step() > costs.forward(0, 6, 1)
    # Verifying a longer draft never costs less: the measured tables are made non-decreasing, so
    # this holds whatever the timer saw (on a tiny model the tables can be flat, hence >=).
    assert costs.verify(0, 2, 30) >= costs.verify(0, 2, 4) >= costs.verify(0, 2, 1)
    assert costs.forward(3, 3, 5) == 0.0


def test_planned_hierarchy_from_a_plan_reaches_the_runtime(tmp_path):
    plan = Plan(levels=(0, 2, 3), buffers=(3, 5), latency=1.0, speedup=1.5, exact_latency=0.9)
    planned = PlannedHierarchy.from_plan(plan, [4, 8, 12])
    assert (planned.level_names, planned.buffer_text) == ("exit:4,exit:12,target", "3,5")
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"levels": planned.level_names, "buffers": planned.buffer_text}))
    best = PlanFile.read(path).best
    assert (best.level_names, best.buffers) == ("exit:4,exit:12,target", [3, 5])
    from sglang_hsd.runtime.config import parse_levels

    config = parse_levels(best.level_names, best.buffers)
    assert [lvl.buffer for lvl in config.levels[:-1]] == [3, 5]


class _CharTokenizer:
    chat_template = None
    eos_token_id = None

    def __call__(self, text):
        return {"input_ids": [ord(c) % 48 for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(97 + i % 26) for i in ids)


def test_plan_then_generate_with_the_plan_on_a_tiny_model(tmp_path, monkeypatch, capsys):
    from sglang_hsd.cli import build_parser
    from sglang_hsd.runtime import loading

    hf = tiny_llama(vocab_size=48, num_layers=6, hidden_size=32, seed=4)
    loaded = loading.LoadedModel(CausalLM.from_hf(hf), hf, _CharTokenizer(), tmp_path)
    monkeypatch.setattr(loading, "load_model", lambda name: loaded)
    monkeypatch.setattr(loading, "prompt_set_texts", lambda name, limit: ["hello there", "a b c d"][:limit])
    out = tmp_path / "plan.json"
    args = build_parser().parse_args(
        ["plan", "--model", "tiny", "--num-prompts", "2", "--continuation", "4", "--candidates", "1,3",
         "--max-buffer", "4", "--out", str(out)]
    )
    with torch.inference_mode():
        assert args.func(args) == 0
    data = json.loads(out.read_text())
    assert data["candidates"] == [1, 3]
    assert data["levels"].endswith("target")
    assert data["runner_up_single_draft"]["levels"].count(",") == 1
    assert "best:" in capsys.readouterr().out
    plan = PlanFile.read(out)
    assert plan.to_json() == data  # the typed plan holds every field the command wrote, in order
    assert list(plan.to_json()) == list(data)
    # generate --plan runs the planned hierarchy.
    args = build_parser().parse_args(["generate", "--model", "tiny", "--plan", str(out), "--prompt", "hi",
                                      "--max-new-tokens", "4", "--exit-heads", "none"])
    assert args.func(args) == 0
    assert f"=== {data['levels']} ===" in capsys.readouterr().out  # the plan's levels ran


def test_draw_is_timed_as_the_runtime_draws(monkeypatch):
    """The planners price a drafted token at one inverse-CDF draw (``Engine._sample``), not at a
    ``torch.multinomial`` call (about 3x dearer over a 152k vocabulary)."""
    import sglang_hsd.hierarchy.measure as measure

    calls = []

    def counting(weights, uniform):
        calls.append(weights.shape)
        return torch.zeros(weights.shape[0], dtype=torch.long)

    def forbidden(*args, **kwargs):
        raise AssertionError("the runtime never draws with torch.multinomial")

    monkeypatch.setattr(measure, "inverse_cdf_sample", counting)
    monkeypatch.setattr(torch, "multinomial", forbidden)
    seconds = measure.draw_seconds(64, torch.Generator().manual_seed(0), repeats=3, warmup=1)
    assert seconds >= 0 and calls == [torch.Size([1, 64])] * 4
