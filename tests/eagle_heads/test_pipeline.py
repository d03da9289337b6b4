"""Training data on continuations, budget snapshots, and the per-draft-position bench counters."""

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from eagle_heads.bench import per_position_acceptance, record_accepted_lengths  # noqa: E402
from eagle_heads.data import FeatureSet, target_hidden_states  # noqa: E402
from eagle_heads.pipeline import train_and_save_eagle3, train_and_save_exit_heads  # noqa: E402
from sglang_hsd.runtime.exit_heads import load_exit_heads, read_manifest  # noqa: E402
from sglang_hsd.runtime.config import parse_levels  # noqa: E402
from sglang_hsd.runtime.eagle3 import Eagle3Head  # noqa: E402
from sglang_hsd.runtime.engine import SpeculativeGenerator  # noqa: E402
from sglang_hsd.sampling import SamplingParams  # noqa: E402

LAYERS = [2, 3]  # exit layers; with 6 target layers the EAGLE-3 captures are [2, 3, 3]


def features(target, lengths, prompt_lens, seed=0) -> FeatureSet:
    gen = torch.Generator().manual_seed(seed)
    bounds = sorted({*LAYERS, 2, 3, target.num_layers})
    tokens, hidden = [], {b: [] for b in bounds}
    for length in lengths:
        seq = torch.randint(target.vocab_size, (length,), generator=gen).tolist()
        states = target_hidden_states(target, seq, bounds)
        tokens.append(torch.tensor(seq))
        for b in bounds:
            hidden[b].append(states[b])
    indptr = torch.zeros(len(lengths) + 1, dtype=torch.long)
    indptr[1:] = torch.tensor(lengths).cumsum(0)
    return FeatureSet(torch.cat(tokens), indptr, torch.tensor(prompt_lens), {b: torch.cat(v) for b, v in hidden.items()},
                      {"names": [f"s{i}" for i in range(len(lengths))], "seconds": 1.0})


def test_continuation_mask_marks_positions_that_predict_continuation_tokens(target):
    feats = features(target, [5, 3], [2, 3])
    # sequence 0: positions 1.. predict tokens 2.. (the continuation); sequence 1: only its last
    assert feats.continuation_mask().tolist() == [False, True, True, True, True, False, False, True]


def test_concat_keeps_every_sequence_in_order(target):
    a, b = features(target, [5, 3], [2, 3], seed=0), features(target, [4], [1], seed=1)
    both = FeatureSet.concat([a, b])
    assert both.seq_indptr.tolist() == [0, 5, 8, 12]
    assert torch.equal(both.tokens, torch.cat([a.tokens, b.tokens]))
    assert torch.equal(both.hidden[6][8:], b.hidden[6])
    assert both.prompt_lens.tolist() == [2, 3, 1] and both.meta["names"] == ["s0", "s1", "s0"]
    with pytest.raises(ValueError, match="boundaries"):
        FeatureSet.concat([a, FeatureSet(b.tokens, b.seq_indptr, b.prompt_lens, {6: b.hidden[6]}, {})])


def test_pipeline_records_a_budget_curve_and_loadable_snapshots(target, tmp_path):
    train, heldout = features(target, [24] * 8, [6] * 8), features(target, [20] * 2, [5] * 2, seed=3)
    train_and_save_exit_heads(target, "tiny", train, heldout, LAYERS, tmp_path / "exit", budget_minutes=0.02,
                              snapshot_minutes=(0, 0.01), progress=False)
    curve = read_manifest(str(tmp_path / "exit"))["budget_curve"]
    assert [entry["train_minutes"] for entry in curve] == [0.0, 0.01, 0.02]
    assert curve[-1]["heldout"]["continuation"]["exit:2"]["positions"] == int(heldout.continuation_mask().sum())
    assert sorted(load_exit_heads(str(tmp_path / "exit" / "snapshots" / "0.01min"), target)) == LAYERS
    metrics = train_and_save_eagle3(target, "tiny", train, heldout, tmp_path / "eagle3", budget_minutes=0.02,
                                    draft_vocab=32, snapshot_minutes=(0.01,), steps=2, progress=False)
    assert set(metrics["continuation"]) == {"step0", "step1"}
    Eagle3Head.from_pretrained(str(tmp_path / "eagle3" / "snapshots" / "0.01min"), target)
    Eagle3Head.from_pretrained(str(tmp_path / "eagle3"), target)
    # A rerun with the budget spent keeps the snapshots and the curve instead of overwriting them.
    snapshot = (tmp_path / "exit" / "snapshots" / "0min" / "exit_heads.safetensors").read_bytes()
    train_and_save_exit_heads(target, "tiny", train, heldout, LAYERS, tmp_path / "exit", budget_minutes=0.02,
                              snapshot_minutes=(0, 0.01), progress=False)
    assert read_manifest(str(tmp_path / "exit"))["budget_curve"][:2] == curve[:2]
    assert (tmp_path / "exit" / "snapshots" / "0min" / "exit_heads.safetensors").read_bytes() == snapshot


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_per_position_counts_add_up_to_the_engine_statistics(target, temperature):
    gen = SpeculativeGenerator(target, parse_levels("exit:2,target", buffers=[3]))
    with record_accepted_lengths() as calls:
        result = gen.generate([[3, 4, 5], [9, 1, 2, 7]], SamplingParams(temperature=temperature), 24, seed=1)
    stats = result.levels[1]
    assert sum(int(c[1].sum()) for c in calls) == stats.accepted
    assert sum(int(c[0].sum()) for c in calls) == stats.proposed
    fraction, conditional = per_position_acceptance(calls, 3)
    lengths, accepted = torch.cat([c[0] for c in calls]), torch.cat([c[1] for c in calls])
    # Position 1 is both; later positions: conditional >= unconditional.
    assert fraction[0] == conditional[0] == round(float((accepted >= 1).float().mean()), 3)
    assert all(c is None or f is None or c >= f for f, c in zip(fraction, conditional))
    assert len(lengths) == stats.rounds


def test_per_position_acceptance_by_hand():
    calls = [(torch.tensor([3, 3, 2]), torch.tensor([0, 3, 1]))]
    fraction, conditional = per_position_acceptance(calls, 4)
    # drafted >= k: 3, 3, 2 rounds; accepted >= k: 2, 1, 1; accepted >= k - 1 among them: 3, 2, 1
    assert fraction == [round(2 / 3, 3), round(1 / 3, 3), 0.5, None]
    assert conditional == [round(2 / 3, 3), 0.5, 1.0, None]
    calls = [(torch.tensor([4, 4, 4, 4]), torch.tensor([0, 1, 2, 4]))]
    assert per_position_acceptance(calls, 4) == ([0.75, 0.5, 0.25, 0.25], [0.75, round(2 / 3, 3), 0.5, 1.0])


def test_training_positions_cover_the_continuation(target):
    """Exit heads train on ``next_token_pairs`` positions: every continuation position except each
    sequence's last (which has no next token), so the targets there are the target's own text."""
    feats = features(target, [5, 3, 4], [2, 3, 1])
    pos, nxt = feats.next_token_pairs()
    cont = set(feats.continuation_mask().nonzero().squeeze(-1).tolist())
    assert cont - set(pos.tolist()) == set((feats.seq_indptr[1:] - 1).tolist())
    assert torch.equal(nxt, pos + 1)


def test_continuations_are_the_targets_own_greedy_and_sampled_text(target):
    from eagle_heads.data import generate_continuations
    from sglang_hsd.runtime.testing import greedy_reference

    prompts = [[3, 4, 5], [9, 1, 2, 7], [5, 5], [8]]
    out = generate_continuations(target, prompts, 12, None, batch_size=4, progress=False)
    for row in (0, 2):  # even rows: greedy
        assert out[row] == greedy_reference(target, prompts[row], 12)
    assert all(len(tokens) == 12 for tokens in out)
