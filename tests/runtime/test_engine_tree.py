"""The engine with sampled draft trees (``HierarchyConfig.tree``, ``runtime/tree_rounds.py``):
greedy output equals the target's for a separate draft model and an exit drafter (shared or own
KV cache), several tree shapes and methods; the sampled 3-token law equals the target's (chi-square
against the exact law, a batch of 6000 requests), and the same test rejects two plausible wrong
variants (verifying as if siblings were i.i.d.; SGLang's pruning on sampled children);
bad configurations are refused naming what is wrong."""

import pytest
import torch

pytest.importorskip("transformers")

from sglang_hsd.draft_length import DraftLengthRule  # noqa: E402
from sglang_hsd.runtime import tree_rounds  # noqa: E402
from sglang_hsd.runtime.config import HierarchyConfig, parse_levels  # noqa: E402
from sglang_hsd.runtime.engine import SpeculativeGenerator  # noqa: E402
from sglang_hsd.runtime.model import CausalLM  # noqa: E402
from sglang_hsd.runtime.testing import greedy_reference, tiny_llama  # noqa: E402
from sglang_hsd.sampling import SamplingParams  # noqa: E402
from sglang_hsd.verify.oracles.stats import chi_square_p_value  # noqa: E402
from sglang_hsd.tree_draft import DraftPlan, TreeShape  # noqa: E402
from tests.runtime.helpers import PROMPTS, eagle3_head_for, exact_target_prefix_probs, sharpen_lm_head  # noqa: E402


def _small(vocab, seed=2):
    return CausalLM.from_hf(sharpen_lm_head(tiny_llama(vocab_size=vocab, num_layers=2, hidden_size=32, seed=seed), 4.0))


def _generator(target, spec, tree, method="hsd", reuse_kv=True, rule="spine_wide"):
    drafter = _small(target.vocab_size) if spec.startswith("model") else None
    config = parse_levels(spec, buffers=[3], methods=[method], tree=tree, tree_rule=rule)
    if not reuse_kv:
        config = HierarchyConfig(config.levels, reuse_kv=False, tree=tree, tree_rule=rule)
    return SpeculativeGenerator(target, config, drafter=drafter, validate=True)


@pytest.mark.parametrize("spec,reuse_kv", [("model:tiny,target", True), ("exit:2,target", True),
                                           ("exit:3,target", False)])
@pytest.mark.parametrize("shape", [(3, 2, 6), (4, 2, 8), (2, 3, 5), (1, 3, 4)])
@pytest.mark.parametrize("method", ["hsd", "tokenwise", "greedy"])
def test_greedy_output_equals_target_greedy(target, spec, reuse_kv, shape, method):
    tree = TreeShape(*shape)
    result = _generator(target, spec, tree, method, reuse_kv).generate(
        PROMPTS, SamplingParams(temperature=0.0), max_new_tokens=14)
    for prompt, out in zip(PROMPTS, result.tokens):
        assert out == greedy_reference(target, prompt, 14), (spec, shape, method)
    drafter, top = result.levels
    assert top.rounds > 0 and top.proposed == drafter.proposed
    assert top.proposed <= top.rounds * (tree.num_draft_tokens - 1)
    assert 0 < top.accepted <= top.rounds * tree.depth


@pytest.mark.parametrize("draft_vocab", [48, 24])
@pytest.mark.parametrize("shape", [(3, 2, 6), (4, 2, 8), (2, 3, 5), (1, 3, 4)])
@pytest.mark.parametrize("method", ["hsd", "greedy"])
def test_eagle3_greedy_output_equals_target_greedy(target, draft_vocab, shape, method):
    # An EAGLE-3 head (draft vocabulary all or half of the target's) drafting sampled trees: each
    # beam reads its parent's output and attends its forwarded ancestors' entries of the head's cache.
    head, _ = eagle3_head_for(target, draft_vocab, [2, 3, 5])
    tree = TreeShape(*shape)
    gen = SpeculativeGenerator(target, parse_levels("eagle3:x,target", [3], [method], tree=tree), eagle3_head=head,
                               validate=True)
    result = gen.generate(PROMPTS, SamplingParams(temperature=0.0), max_new_tokens=14)
    for prompt, out in zip(PROMPTS, result.tokens):
        assert out == greedy_reference(target, prompt, 14), (shape, method)
    drafter, top = result.levels
    assert top.rounds > 0 and 0 < top.accepted <= top.rounds * tree.depth


def test_eagle3_head_forwarded_in_two_calls_equals_one_tree_masked_call(target):
    # Eagle3Head.forward_cached's mask_prefix: entries 3..6 of a tree see entries 0..2 (written by
    # an earlier call of the same tree) only where they are ancestors, as in one tree-masked call.
    from tests.runtime.test_tree import PARENTS, tree_mask_and_depth

    head, _ = eagle3_head_for(target, 48, [2, 3, 5])
    gen = torch.Generator().manual_seed(3)
    nodes = len(PARENTS)
    ids = torch.randint(0, 48, (1, nodes), generator=gen)
    hidden = torch.randn(1, nodes, target.hidden_size, generator=gen)
    context_ids = torch.randint(0, 48, (1, 4), generator=gen)
    context = torch.randn(1, 4, target.hidden_size, generator=gen)
    mask, depth = tree_mask_and_depth(PARENTS)
    positions = 4 + depth[None, :]

    def fresh_cache():
        cache = head.new_cache(1, 16)
        head.forward_cached(context_ids, context, cache, torch.tensor([4]))
        return cache

    one = head.forward_cached(ids, hidden, fresh_cache(), torch.tensor([nodes]), positions, mask[None])
    cache = fresh_cache()
    first, rest = slice(0, 3), slice(3, nodes)
    head.forward_cached(ids[:, first], hidden[:, first], cache, torch.tensor([3]), positions[:, first],
                        mask[first, first][None])
    two = head.forward_cached(ids[:, rest], hidden[:, rest], cache, torch.tensor([nodes - 3]), positions[:, rest],
                              mask[rest][None], torch.tensor([3]))
    assert (two - one[:, rest]).abs().max() < 1e-5
    # Without the prefix mask the later entries see every earlier one: different outputs.
    cache.truncate(torch.tensor([7]))
    causal = head.forward_cached(ids[:, rest], hidden[:, rest], cache, torch.tensor([nodes - 3]),
                                 positions[:, rest], mask[rest, rest][None])
    assert (causal - one[:, rest]).abs().max() > 1e-3


@pytest.mark.parametrize("spec,reuse_kv", [("model:tiny,target", True), ("exit:3,target", False)])
def test_drafter_keeps_the_accepted_path_it_forwarded(target, monkeypatch, spec, reuse_kv):
    # A drafter with its own cache compacts the accepted nodes it forwarded instead of re-running
    # them: fewer drafter layer-forwards, and the KV it keeps is the one re-running would write, so
    # the sampled output (same seed, same uniforms) is the same token for token.
    params = SamplingParams(temperature=1.0)

    def run():
        gen = _generator(target, spec, TreeShape(4, 2, 8), reuse_kv=reuse_kv)
        model = gen.drafter if gen.drafter is not None else target
        before = model.counters.layer_token_forwards
        result = gen.generate(PROMPTS, params, max_new_tokens=20, seed=3)
        return result, model.counters.layer_token_forwards - before

    compacted, compacted_forwards = run()

    def recompute(self, idx, tree, res):  # the earlier behaviour: cut the tree, re-run the path
        run_state, group = self.run, self.group
        self.forwarded = []
        group.cache.truncate(torch.minimum(group.length(), run_state.seq_len), layers=range(group.start, group.end))

    monkeypatch.setattr(tree_rounds._LayerTreeDrafter, "keep_accepted", recompute)
    rerun, rerun_forwards = run()
    assert compacted.tokens == rerun.tokens
    assert compacted.levels[-1].accepted == rerun.levels[-1].accepted > 0
    assert compacted_forwards < rerun_forwards


def test_greedy_trees_accept_more_than_a_chain_of_the_same_depth(target):
    # The top-k tree holds the chain's argmax path, so per target round it accepts at least as much.
    chain = SpeculativeGenerator(target, parse_levels("exit:2,target", buffers=[3]), validate=True)
    tree = _generator(target, "exit:2,target", TreeShape(3, 2, 6))
    params = SamplingParams(temperature=0.0)
    per_round = []
    for gen in (chain, tree):
        top = gen.generate(PROMPTS, params, max_new_tokens=24).levels[-1]
        per_round.append(top.accepted / top.rounds)
    assert per_round[1] >= per_round[0]


def _sampled_counts(spec, params, method, shape=(2, 2, 4), runs=6000, vocab=6, length=3, seed=0, children="inverse_cdf"):
    model = CausalLM.from_hf(sharpen_lm_head(tiny_llama(vocab_size=vocab, num_layers=4, hidden_size=32, seed=5), 3.0))
    drafter = _small(vocab, seed=7) if spec.startswith("model") else None
    head = eagle3_head_for(model, vocab - 1, [1, 2, 3], std=0.3)[0] if spec.startswith("eagle3") else None
    config = parse_levels(spec, [2], [method], tree=TreeShape(*shape), tree_children=children)
    gen = SpeculativeGenerator(model, config, drafter=drafter, eagle3_head=head, validate=True)
    prompt = [1, 4, 2]
    result = gen.generate([prompt] * runs, params, max_new_tokens=length, seed=seed)
    codes = torch.tensor([t[0] * vocab * vocab + t[1] * vocab + t[2] for t in result.tokens])
    counts = torch.bincount(codes, minlength=vocab**length)
    return counts, exact_target_prefix_probs(model, prompt, length, params), result


@pytest.mark.statistical
@pytest.mark.parametrize("spec,params,shape", [
    ("exit:2,target", SamplingParams(temperature=1.0), (2, 2, 4)),
    ("model:tiny,target", SamplingParams(temperature=1.0), (2, 2, 4)),
    ("exit:1,target", SamplingParams(temperature=0.8, top_p=0.9), (2, 2, 4)),
    ("model:tiny,target", SamplingParams(temperature=1.0, top_k=3), (3, 2, 6)),
    ("eagle3:x,target", SamplingParams(temperature=1.0), (3, 2, 6)),
])
@pytest.mark.parametrize("method", ["hsd", "tokenwise"])
def test_sampled_output_matches_target_distribution(spec, params, shape, method):
    counts, exact, result = _sampled_counts(spec, params, method, shape)
    assert chi_square_p_value(counts, exact) > 1e-4
    top = result.levels[-1]
    assert top.accepted > 0 and top.accepted < top.rounds * 2  # trees are accepted, not always whole


@pytest.mark.statistical
@pytest.mark.parametrize("wrong", ["iid", "pruned"])
def test_sampled_test_rejects_wrong_tree_rounds(monkeypatch, wrong):
    # Teeth: the same law test must fail for hsd told that siblings were drawn i.i.d. (rejected
    # siblings not removed from the residual), and for SGLang's selection on sampled children
    # (the "pruned" rule keeps nodes whose own draws scored well). The stock target-only rule is
    # no such variant: it ignores q and samples from p along any tree, so it stays lossless.
    if wrong == "iid":
        original = tree_rounds.verify_tree
        monkeypatch.setattr(tree_rounds, "verify_tree",
                            lambda *args, **kwargs: original(*args, **{**kwargs, "draft_mode": "iid"}))
    else:
        original_init = tree_rounds.TreeRounds.__init__

        def pruned_init(self, run):
            original_init(self, run)
            self.rule = "pruned"
            self.plan = DraftPlan.build(self.shape, "pruned", run.tokens.device)

        monkeypatch.setattr(tree_rounds.TreeRounds, "__init__", pruned_init)
    counts, exact, _ = _sampled_counts("exit:2,target", SamplingParams(temperature=1.0), "hsd")
    assert chi_square_p_value(counts, exact) < 1e-6


@pytest.mark.statistical
@pytest.mark.parametrize("spec,params,shape", [
    ("exit:2,target", SamplingParams(temperature=0.7), (3, 2, 6)),
    ("model:tiny,target", SamplingParams(temperature=1.0), (2, 2, 4)),
])
def test_argmax_first_children_match_target_distribution(spec, params, shape):
    counts, exact, result = _sampled_counts(spec, params, "hsd", shape, children="argmax_first_cdf")
    assert chi_square_p_value(counts, exact) > 1e-4
    assert result.levels[-1].accepted > 0


@pytest.mark.statistical
def test_argmax_first_children_verified_as_sampled_are_rejected(monkeypatch):
    # The deterministic first child tested as if it had been drawn from q: biased.
    original = tree_rounds.verify_tree
    monkeypatch.setattr(tree_rounds, "verify_tree",
                        lambda *args, **kwargs: original(*args, **{**kwargs, "draft_mode": "without-replacement"}))
    counts, exact, _ = _sampled_counts("exit:2,target", SamplingParams(temperature=0.7), "hsd", (3, 2, 6),
                                       children="argmax_first_cdf")
    assert chi_square_p_value(counts, exact) < 1e-6


def test_argmax_first_greedy_output_equals_target_greedy(target):
    config = parse_levels("exit:2,target", buffers=[3], tree=TreeShape(3, 2, 6), tree_children="argmax_first_cdf")
    params = SamplingParams(temperature=0.0)
    result = SpeculativeGenerator(target, config, validate=True).generate(PROMPTS, params, max_new_tokens=14)
    for prompt, out in zip(PROMPTS, result.tokens):
        assert out == greedy_reference(target, prompt, 14)
    assert result.levels[-1].accepted > 0


def test_bad_tree_configurations_are_refused():
    tree = TreeShape(3, 2, 6)
    with pytest.raises(ValueError, match="two levels"):
        parse_levels("exit:1,exit:3,target", [3, 3], tree=tree)
    with pytest.raises(ValueError, match="'model', 'exit' or 'eagle3' drafter"):
        parse_levels("eagle3:x,exit:3,target", [3, 3], tree=tree)
    with pytest.raises(ValueError, match="target's method must be one of"):
        parse_levels("exit:1,target", [3], ["hsd-paper"], tree=tree)
    with pytest.raises(ValueError, match="tree_rule must be one of"):
        parse_levels("exit:1,target", [3], tree=tree, tree_rule="pruned")
    with pytest.raises(ValueError, match="tree_children must be one of"):
        parse_levels("exit:1,target", [3], tree=tree, tree_children="with_replacement")
    with pytest.raises(ValueError, match="do not fit depth 2"):
        parse_levels("exit:1,target", [3], tree=TreeShape(2, 2, 8))
    adaptive = DraftLengthRule("adaptive", threshold=0.5, min_length=1, max_length=6, grow=2)
    with pytest.raises(ValueError, match="draft_length 'fixed'"):
        parse_levels("exit:1,target", [3], draft_length=adaptive, tree=tree)


def test_mask_prefix_is_checked(target):
    cache = target.new_cache(1, 16)
    target(torch.tensor([[1, 2, 3]]), cache)
    hidden = target.embed(torch.tensor([[4, 5]]))
    mask = torch.ones(1, 2, 4, dtype=torch.bool)
    with pytest.raises(ValueError, match="pass mask_prefix"):
        target.forward_layers(hidden, 0, target.num_layers, cache, attn_mask=mask)
    with pytest.raises(ValueError, match="mask_prefix must lie in"):
        target.forward_layers(hidden, 0, target.num_layers, cache, attn_mask=mask, mask_prefix=torch.tensor([5]))
    with pytest.raises(ValueError, match="needs an attn_mask"):
        target.forward_layers(hidden, 0, target.num_layers, cache, mask_prefix=torch.tensor([1]))
