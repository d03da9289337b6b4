"""bench_round_planner's measurement of one row: a warm-up before the timed repeats, every repeat
recorded, the shapes whose single rows ran packed, the models unpacked afterwards, and the range
shown in the table."""

import pytest
import torch

pytest.importorskip("transformers")

from benchmarks import bench_round_planner  # noqa: E402
from sglang_hsd.hierarchy.round_costs import KernelSetting  # noqa: E402
from sglang_hsd.hierarchy.round_planner import RoundShape  # noqa: E402
from sglang_hsd.runtime.kernel_paths import PATH_MKL  # noqa: E402
from sglang_hsd.runtime.model import CausalLM  # noqa: E402
from sglang_hsd.runtime.testing import tiny_llama  # noqa: E402
from sglang_hsd.sampling import SamplingParams  # noqa: E402


def test_measure_warms_up_and_returns_every_repeat(monkeypatch):
    with torch.inference_mode():
        target = CausalLM.from_hf(tiny_llama(vocab_size=40, num_layers=2, hidden_size=32, seed=1))
    calls = []
    real = bench_round_planner.run_runtime

    def counting(generator, prompts, params, max_new, eos, seed, batch_size):
        calls.append((len(prompts), max_new))
        return real(generator, prompts, params, max_new, eos, seed, batch_size)

    monkeypatch.setattr(bench_round_planner, "run_runtime", counting)
    prompts = [[1, 2, 3], [4, 5, 6, 7]]
    with torch.inference_mode():
        rates, tokens, per_round, packed, levels = bench_round_planner._measure(
            target, None, None, RoundShape(), KernelSetting(1, PATH_MKL), {}, prompts, SamplingParams(0.0), 6,
            None, repeats=3)
    assert calls == [(1, bench_round_planner.WARMUP_TOKENS), (2, 6), (2, 6), (2, 6)]
    assert len(rates) == 3 and all(rate > 0 for rate in rates)
    assert [len(t) for t in tokens] == [6, 6] and per_round == 1.0
    assert packed == ({"target": []}, {"target": "no row padding"})  # mkl: nothing packed, nothing padded
    assert [lv["name"] for lv in levels] == ["target"]
    assert bench_round_planner._range([30.0, 24.94, 37.21]) == "24.9-37.2"


def test_lookup_and_middle_shapes_run_as_their_levels_and_keep_greedy_output():
    from sglang_hsd.hierarchy.lookup_replay import LookupShape
    from sglang_hsd.hierarchy.middle_replay import MiddleShape
    from sglang_hsd.levels import LevelKind, LevelSpec
    from sglang_hsd.runtime.plan_file import PlannedHierarchy

    def levels_and_buffers(level, shape):
        planned = PlannedHierarchy(shape.levels(level))
        return planned.level_names, planned.buffers

    spec = LevelSpec(LevelKind.MODEL, model_path="d")
    three, two = RoundShape(lookup=LookupShape(3, 8, 16)), RoundShape(lookup=LookupShape(2, 4))
    assert levels_and_buffers(spec, three) == ("lookup:3,model:d,target", [8, 16])
    assert levels_and_buffers(spec, two) == ("lookup:2,target", [4])
    middle = RoundShape(middle=MiddleShape(1, 3, 2))
    assert levels_and_buffers(spec, middle) == ("model:d,exit:1,target", [3, 2])
    assert levels_and_buffers(None, RoundShape()) == ("target", [])
    with torch.inference_mode():
        target = CausalLM.from_hf(tiny_llama(vocab_size=40, num_layers=2, hidden_size=32, seed=1))
        drafter = CausalLM.from_hf(tiny_llama(vocab_size=40, num_layers=1, hidden_size=16, seed=2))
        prompts = [[1, 2, 3, 1, 2], [4, 5, 4, 5]]
        runs = [bench_round_planner._measure(target, drafter, spec, shape, KernelSetting(1, PATH_MKL), {},
                                             prompts, SamplingParams(0.0), 8, None, repeats=1)
                for shape in (RoundShape(), two, RoundShape(lookup=LookupShape(2, 2, 3)), middle)]
    outputs = [run[1] for run in runs]
    assert outputs[0] == outputs[1] == outputs[2] == outputs[3]
    assert [lv["name"] for lv in runs[3][4]] == ["model:d", "exit:1", "target"]
