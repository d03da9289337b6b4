"""benchmarks/bench_tree.py: its exact and Monte Carlo estimates agree, on tiny and real worlds.

Fast tests use random tiny worlds; the slow test runs the real-model pipeline on one SmolLM2
context (skips when the model is not in the cache).
"""

import json
import math

import numpy as np
import pytest
import torch

from benchmarks import bench_tree, drafters
from sglang_hsd.verify import verify_tree
from sglang_hsd.verify.oracles.full_tree_draft import topk_tree
from sglang_hsd.verify.oracles import exact

# Monte Carlo means must sit within this many standard errors of the exact value (plus a floor
# for worlds where the SE is ~0 because every tree accepts everything).
Z_TOLERANCE = 4.5
FLOOR = 1e-3


def _agrees(mc: tuple[float, float], exact_value: float) -> bool:
    mean, se = mc
    return abs(mean - exact_value) <= Z_TOLERANCE * se + FLOOR


@pytest.mark.parametrize("seed,topk", [(0, 2), (1, 3)])
def test_world_monte_carlo_matches_exact(seed, topk):
    world = exact.random_world(4, 3, seed=seed, concentration=0.5)
    exact_values = bench_tree.world_exact(world, topk, 3)
    gen = torch.Generator().manual_seed(seed)
    for method in bench_tree.SAMPLED_METHODS:
        mc = bench_tree.world_monte_carlo(world, method, topk, 3, 5000, gen)
        assert _agrees(mc, exact_values[method]), (method, mc, exact_values[method])


def test_stock_expectation_matches_target_only_sampling():
    world = exact.random_world(5, 3, seed=3, concentration=0.5)

    def q_fn(paths):
        return torch.tensor(np.array([[world.q(tuple(p[1:])) for p in row] for row in paths.tolist()]))

    tree = topk_tree(q_fn, 2, 3, root_tokens=torch.zeros(1, dtype=torch.long))
    target = torch.tensor([[world.p(path) for path in bench_tree.tree_paths(tree)]])
    expected = bench_tree.stock_expected_accepted(tree, target)
    oracle = bench_tree.world_exact(world, 2, 3)["stock"]
    assert expected == pytest.approx(oracle, abs=1e-12)
    draws = 40000
    expand = lambda t: t.expand(draws, *t.shape[1:])  # noqa: E731
    res = verify_tree(expand(tree.candidates), expand(tree.retrive_next_token), expand(tree.retrive_next_sibling),
                      None, expand(target), method="target-only", generator=torch.Generator().manual_seed(0))
    accepted = res.num_accepted.double()
    assert _agrees((float(accepted.mean()), float(accepted.std()) / math.sqrt(draws)), expected)


def test_budgeted_rules_on_a_world():
    """The level-synchronous default, the argmax-first rule and SGLang's stock tree at one node budget, exactly."""
    world = exact.random_world(3, 2, seed=1)
    values = bench_tree.world_budgeted(world, 2, 2, 4)
    assert set(values) == {"level_hsd", "level_stock", "level_argmax_first"}
    assert all(0.0 <= v <= 2.0 for v in values.values())
    with pytest.raises(ValueError, match="num-draft-tokens"):
        bench_tree.parse_args(["--num-draft-tokens", "12", "--depth", "2", "--topk", "2"])


def test_world_at_rows_are_distributions():
    vocab, depth = 4, 2
    logits = torch.randn(1 + vocab, 10)
    tokens = torch.stack([torch.topk(row, vocab).indices for row in logits])
    recorded = {"target": logits, "draft": torch.randn(1 + vocab, 10), "tokens": tokens}
    world = bench_tree.world_at(recorded, vocab, depth, 0.6)
    assert world.target.shape == (1 + vocab + vocab**2, vocab)
    assert torch.allclose(torch.tensor(world.target.sum(-1)), torch.ones(len(world.target), dtype=torch.float64))
    assert torch.allclose(torch.tensor(world.draft.sum(-1)), torch.ones(len(world.draft), dtype=torch.float64))
    # Tiny token 0 is the target's most likely token at the root.
    assert world.p(())[0] == pytest.approx(float(torch.softmax(logits[0] / 0.6, -1).max()), rel=1e-6)


def test_lumping_rare_tokens_keeps_the_accepted_counts():
    """Rows over 3000 tokens with a long tail: verifying the lumped rows gives the same accepted
    count draw for draw (same uniforms) except where a coin lands within the lumped mass of a weight."""
    from sglang_hsd.verify import TreeUniforms
    from sglang_hsd.verify.oracles.full_tree_draft import sample_tree

    vocab, draws = 3000, 400
    gen = torch.Generator().manual_seed(0)
    base = torch.randn(vocab, generator=gen) * 4

    def q_fn(paths):
        return torch.softmax(base + torch.randn(*paths.shape[:2], vocab, generator=gen), -1)

    tree = sample_tree(q_fn, 2, 3, gen, root_tokens=torch.zeros(1, dtype=torch.long))
    target = torch.softmax(base + torch.randn(1, tree.draft_probs.shape[1], vocab, generator=gen), -1)
    small = bench_tree.lump_small_tokens(tree.candidates, tree.draft_probs, target, 1e-7)
    assert small[1].shape[-1] < vocab and small[3] < 1e-4
    assert torch.allclose(small[2].sum(-1), torch.ones(1, target.shape[1]))
    uniforms = TreeUniforms.draw(draws, tree.candidates.shape[1], generator=gen)
    expand = lambda t: t.expand(draws, *t.shape[1:])  # noqa: E731
    links = (expand(tree.retrive_next_token), expand(tree.retrive_next_sibling))
    for method in bench_tree.SAMPLED_METHODS:
        full = verify_tree(expand(tree.candidates), *links, expand(tree.draft_probs), expand(target), method=method,
                           uniforms=uniforms, validate=False).num_accepted
        lumped = verify_tree(expand(small[0]), *links, expand(small[1]), expand(small[2]), method=method,
                             uniforms=uniforms, validate=False).num_accepted
        assert (full == lumped).float().mean() >= 0.99


def test_drafter_option_is_checked():
    with pytest.raises(ValueError, match="--drafter"):
        bench_tree.load_pair("smollm2-135m", "layer:3", "none")


@pytest.mark.slow
def test_real_pipeline_on_one_context():
    from sglang_hsd.assets.fetch import model_path

    if model_path("smollm2-135m") is None:
        pytest.skip("SmolLM2-135M is not in the cache; run: sglang-hsd fetch smollm2-135m")
    torch.manual_seed(0)
    target_loaded, target, drafter, _ = bench_tree.load_pair("smollm2-135m", "exit:16", "none")
    ids = bench_tree.prompt_items(target_loaded.tokenizer, ["mtbench"], 1)[0]["ids"]
    target_logits, drafter_logits = target.prefill(ids), drafter.prefill(ids)
    target.set_context(len(ids), target_logits[-1])
    drafter.set_context(len(ids), drafter_logits[-1])
    args = type("Args", (), {"world_vocab": 4, "depth": 2, "topk": [2], "temperature": [1.0], "trees": 3, "coins": 2,
                             "check_trees": 20000, "keep_prob": 1e-7, "num_draft_tokens": 4})()
    gen = torch.Generator().manual_seed(0)
    measured, recorded = bench_tree.run_context(target, drafter, ids[-1], args, gen)
    row = measured[(2, 1.0)]
    for key in ("stock", "rrs", "hsd", "world_stock", "world_rrs", "world_hsd", "world_level_hsd", "world_level_stock"):
        assert 0.0 <= row[key] <= args.depth, (key, row[key])
    # The memoised tree-mask forward equals plain per-path forwards.
    checks = bench_tree.consistency_checks(target, ids, recorded, args, gen)
    assert checks["tree_mask_vs_per_path_max_abs_logit_diff"] < 1e-3
    for method in bench_tree.SAMPLED_METHODS:
        mc = checks["world_monte_carlo"][method]
        assert _agrees((mc["mean"], mc["se"]), checks["world_exact"][method]), (method, mc, checks["world_exact"])


@pytest.mark.parametrize("exit_layer", [None, 2])
def test_prefix_model_tree_forward_equals_plain_forwards(exit_layer):
    """The KV-cached tree forward (context cropped between contexts, memoised paths) against one
    plain forward per path, for the full model and for an early exit (logit lens); tiny model."""
    from sglang_hsd.runtime.testing import tiny_llama

    hf = tiny_llama(vocab_size=64, num_layers=4, seed=7)
    model = drafters.PrefixModel(hf, exit_layer=exit_layer, vocab_size=64)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 64, (12,), generator=gen).tolist()
    full = model.prefill(tokens)
    assert full.shape == (12, 64)
    for length in (10, 7):  # long to short, as the benchmark crops its contexts
        model.set_context(length, full[length - 1])
        context = tokens[:length]
        paths = [(), (3,), (3, 5), (9,), (9, 1), (9, 2)]
        cached = drafters.node_logits(model, paths)
        plain = model.path_logits(context, paths)
        assert not (cached.requires_grad or full.requires_grad)  # the benchmark turns them into numpy
        torch.testing.assert_close(cached, plain, atol=1e-4, rtol=0)
        # memoised paths are served again without a forward; the context is unchanged
        torch.testing.assert_close(drafters.node_logits(model, paths[:3]), cached[:3])
        torch.testing.assert_close(model.prefill(context)[-1], full[length - 1], atol=1e-4, rtol=0)
        model.prefill(tokens)


def test_results_files_hold_tables_and_the_run(tmp_path, monkeypatch):
    from benchmarks import common

    monkeypatch.setattr(bench_tree, "RESULTS_DIR", tmp_path)
    row = {"stock": 1.0, "rrs": 1.2, "hsd": 1.3, "rrs_se": 0.1, "hsd_se": 0.1, "hsd_minus_rrs_se": 0.05,
           "world_stock": 1.1, "world_rrs": 1.2, "world_hsd": 1.25, "lumped_mass": 0.0,
           "world_level_hsd": 1.5, "world_level_stock": 1.0, "world_level_argmax_first": 1.2}
    rows = [{"context": c, "set": "mtbench", "prompt": 0, "position": 8 * c, "topk": 2, "temperature": 1.0, **row}
            for c in range(2)]
    meta = {"target": "t", "drafter": "exit:16", "world_vocab": 5, "depth": 3, "num_draft_tokens": 8,
            "command": "python benchmarks/bench_tree.py"}
    run = common.start_run(bench_tree.__file__, ["--name", "x"])
    bench_tree.save_results("x", meta, rows, run)
    text = (tmp_path / "x.md").read_text()
    assert "| 2 | 1.0 | 2 | 1.000 | 1.200 | 1.300 | +0.300 +- 0.071 |" in text and "\n## Run\n" in text
    assert "| 2 | 1.0 | 2 | 1.000 | 1.500 | +0.500 | 0 |" in text
    saved = json.loads((tmp_path / "x.json").read_text())
    assert saved["summary"][0]["contexts"] == 2 and saved["run"]["command"].endswith("--name x")


def test_contexts_set_both_models_to_each_prefix_long_to_short():
    """Each yielded context is the prompt plus the first ``position`` tokens of one continuation,
    and both models' caches hold exactly it (their root logits are the context's last row)."""
    from types import SimpleNamespace

    from sglang_hsd.runtime.testing import tiny_llama

    hf = tiny_llama(vocab_size=64, num_layers=2, seed=3)
    target, drafter = drafters.PrefixModel(hf, vocab_size=64), drafters.PrefixModel(hf, exit_layer=1, vocab_size=64)
    items = [{"set": "s", "prompt": 0, "ids": [5, 9, 2]}]
    seen = []
    for item, position, tokens in bench_tree.contexts(SimpleNamespace(hf=hf), target, drafter, items, [0, 4], seed=1):
        assert len(tokens) == 3 + position and tokens[:3] == [5, 9, 2]
        assert target.length == drafter.length == len(tokens)
        torch.testing.assert_close(target.memo[()], target.path_logits(tokens, [()])[0], atol=1e-4, rtol=0)
        seen.append((position, tokens))
    assert [p for p, _ in seen] == [4, 0]
    assert seen[1][1] == seen[0][1][:3]  # one continuation per prompt, cropped


def test_contexts_at_position_zero_only_need_no_continuation():
    from types import SimpleNamespace

    from sglang_hsd.runtime.testing import tiny_llama

    hf = tiny_llama(vocab_size=64, num_layers=2, seed=3)
    model = drafters.PrefixModel(hf, vocab_size=64)
    items = [{"set": "s", "prompt": 0, "ids": [5, 9, 2]}]
    assert [t for _, _, t in bench_tree.contexts(SimpleNamespace(hf=hf), model, model, items, [0], seed=1)] == [[5, 9, 2]]
