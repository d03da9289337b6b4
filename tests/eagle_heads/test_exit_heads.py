"""Early-exit heads: logit-lens start, training reduces KL, save/load, lossless runtime; slow real-model checks."""

import os

import pytest
import torch

pytest.importorskip("transformers")

from eagle_heads.data import collect_features, target_hidden_states  # noqa: E402
from eagle_heads.exit_heads import evaluate_exit_heads, kl_final_exit, train_exit_heads  # noqa: E402
from sglang_hsd.runtime.exit_heads import (  # noqa: E402
    ExitHead,
    apply_exit_map,
    load_exit_heads,
    load_exit_map,
    save_exit_heads,
)
from sglang_hsd.runtime.config import parse_levels  # noqa: E402
from sglang_hsd.runtime.engine import SpeculativeGenerator  # noqa: E402
from sglang_hsd.runtime.testing import greedy_reference  # noqa: E402
from sglang_hsd.sampling import SamplingParams  # noqa: E402
from tests.eagle_heads.tiny_heads import random_features  # noqa: E402


def _random_features(target, num_seqs=12, length=20, layers=(2, 3), seed=0):
    return random_features(target, layers, num_seqs, length, seed)


def test_zero_init_head_is_the_logit_lens_exactly(target):
    hidden = torch.randn(2, 5, target.hidden_size)
    head = ExitHead(target, 3)
    assert torch.equal(target.exit_logits(hidden, head), target.exit_logits(hidden))


def test_hidden_states_match_a_full_forward(target):
    seq = [1, 5, 7, 9, 11]
    states = target_hidden_states(target, seq, [2])
    with torch.inference_mode():
        logits = target(torch.tensor([seq]), target.new_cache(1, 8))
    torch.testing.assert_close(target.exit_logits(states[target.num_layers][None]), logits)


def test_training_reduces_kl_and_raises_acceptance(target):
    torch.manual_seed(0)
    # 48 training sequences: with 12 the held-out gain on this tiny model was within noise (+0.003).
    train = _random_features(target, num_seqs=48, seed=0)
    heldout = _random_features(target, num_seqs=6, seed=1)
    before = evaluate_exit_heads(target, heldout, {}, layers=[2, 3])
    heads, log = train_exit_heads(target, train, [2, 3], max_steps=60, batch_positions=64, lr=3e-3, progress=False,
                                  init="zero")
    after = evaluate_exit_heads(target, heldout, heads)
    for layer in (2, 3):
        assert log[-1][f"kl@{layer}"] < log[0][f"kl@{layer}"]
        assert after[f"exit:{layer}"]["head_1-tv"] > before[f"exit:{layer}"]["lens_1-tv"] + 0.01
        assert after[f"exit:{layer}"]["lens_1-tv"] == before[f"exit:{layer}"]["lens_1-tv"]


def test_lstsq_init_beats_the_logit_lens(target):
    train, heldout = _random_features(target, num_seqs=48, seed=0), _random_features(target, num_seqs=6, seed=1)
    heads, _ = train_exit_heads(target, train, [2, 3], max_steps=0, progress=False)
    before = evaluate_exit_heads(target, heldout, {}, layers=[2, 3])
    after = evaluate_exit_heads(target, heldout, heads)
    for layer in (2, 3):
        assert after[f"exit:{layer}"]["head_1-tv"] > before[f"exit:{layer}"]["lens_1-tv"]


def test_kl_is_zero_on_equal_distributions():
    logp = torch.log_softmax(torch.randn(4, 10), -1)
    assert torch.allclose(kl_final_exit(logp, logp), torch.zeros(4), atol=1e-6)


def test_save_load_round_trip_and_resume(target, tmp_path):
    train = _random_features(target)
    heads, _ = train_exit_heads(target, train, [2, 3], max_steps=5, batch_positions=32, progress=False,
                                checkpoint_dir=str(tmp_path / "ckpt"))
    save_exit_heads(str(tmp_path / "heads"), heads, {"model": "tiny"})
    loaded = load_exit_heads(str(tmp_path / "heads"), target)
    hidden = torch.randn(3, 4, target.hidden_size)
    for layer in (2, 3):
        assert torch.equal(loaded[layer](hidden), heads[layer](hidden))
    # Resuming continues from step 5 instead of starting over.
    _, log = train_exit_heads(target, train, [2, 3], max_steps=10, batch_positions=32, progress=False,
                              checkpoint_dir=str(tmp_path / "ckpt"), log_every=1)
    assert log[-1]["step"] == 10 and len([e for e in log if e["step"] > 5]) == 5
    with pytest.raises(KeyError):
        load_exit_heads(str(tmp_path / "heads"), target, layers=[4])


def test_the_server_reads_what_training_writes(target, tmp_path):
    """One format and one map: the server's loader returns the trained A, b, and the shared map
    equals the runtime head's transform (in float32 and, cast back, from bfloat16 hidden states)."""
    heads, _ = train_exit_heads(target, _random_features(target), [2, 3], max_steps=2, batch_positions=16,
                                progress=False)
    save_exit_heads(str(tmp_path), heads, {"model": "tiny"})
    A, b = load_exit_map(str(tmp_path), 3, target.hidden_size)
    assert torch.equal(A, heads[3].A.float()) and torch.equal(b, heads[3].b.float())
    hidden = torch.randn(5, target.hidden_size)
    assert torch.equal(apply_exit_map(hidden, A, b), heads[3].transform(hidden))
    half = hidden.bfloat16()
    assert apply_exit_map(half, A, b).dtype == torch.bfloat16
    assert torch.equal(apply_exit_map(half, A, b), heads[3].transform(half.float()).bfloat16())
    with pytest.raises(KeyError, match=r"no head for exit layer 4 \(it has layers \[2, 3\]\)"):
        load_exit_map(str(tmp_path), 4, target.hidden_size)


@pytest.mark.parametrize("spec,buffers", [("exit:2,target", [3]), ("exit:2,exit:4,target", [2, 3])])
def test_runtime_with_trained_heads_stays_lossless_greedy(target, spec, buffers):
    heads, _ = train_exit_heads(target, _random_features(target, layers=(2, 4)), [2, 4], max_steps=20,
                                batch_positions=64, lr=3e-3, progress=False)
    gen = SpeculativeGenerator(target, parse_levels(spec, buffers=buffers), exit_heads=heads, validate=True)
    prompts = [[3, 4, 5], [9, 1, 2, 7, 8]]
    result = gen.generate(prompts, SamplingParams(temperature=0.0), max_new_tokens=16)
    for prompt, tokens in zip(prompts, result.tokens):
        assert tokens == greedy_reference(target, prompt, 16)
    assert gen.target.counters.exit_head_tokens > 0  # the trained heads were really used


# ----------------------------------------------------------------------------- real model

@pytest.fixture(scope="module")
def smollm():
    from eagle_heads.pipeline import load_target
    from sglang_hsd.assets.heads import heads_dir

    path = os.path.expanduser("~/.cache/sglang-hsd/models/smollm2-135m/sglang-hsd-complete.json")
    if not os.path.exists(path):
        pytest.skip("SmolLM2 not cached: run `sglang-hsd fetch --model smollm2-135m`")
    target, tok = load_target("smollm2-135m")
    return target, tok, heads_dir("smollm2-135m")


@pytest.fixture(scope="module")
def smollm_exit_heads(smollm):
    target, _, root = smollm
    if not (root / "exit" / "manifest.json").exists():
        pytest.skip("no trained exit heads: run `sglang-hsd train-heads --model smollm2-135m`")
    return load_exit_heads(str(root / "exit"), target)


@pytest.mark.slow
def test_real_model_trained_exit_heads_beat_the_logit_lens(smollm, smollm_exit_heads):
    target, tok, _ = smollm
    heads = smollm_exit_heads
    features = collect_features(target, tok, ["mtbench"], 4, sorted(heads), max_new_tokens=16, progress=False)
    metrics = evaluate_exit_heads(target, features, heads)
    for name, row in metrics.items():
        assert row["head_1-tv"] > row["lens_1-tv"], (name, row)


@pytest.mark.slow
def test_real_model_greedy_with_trained_exit_heads_equals_target(smollm, smollm_exit_heads):
    target, tok, _ = smollm
    heads = smollm_exit_heads
    prompt = tok("Name three colours.", add_special_tokens=False)["input_ids"]
    plain = SpeculativeGenerator(target, parse_levels("target")).generate([prompt], SamplingParams(temperature=0.0), 24)
    layers = sorted(heads)[:2]
    spec = SpeculativeGenerator(target, parse_levels(f"exit:{layers[0]},exit:{layers[1]},target", buffers=[2, 4]), exit_heads=heads)
    assert spec.generate([prompt], SamplingParams(temperature=0.0), 24).tokens == plain.tokens
