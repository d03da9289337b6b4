"""Tree verification inside SGLang's ``eagle_sample`` (topk > 1): the plugin's replacement of
``tree_speculative_sampling_target_only`` runs ``verify_tree`` on SGLang's coins and writes
predicts / accept_index / accept lengths as SGLang's tree kernels do (global node indices)."""

from __future__ import annotations

import types

import pytest
import torch

from sglang_hsd.sglang_plugin import verify_hook
from sglang_hsd.sglang_plugin.config import PluginConfig
from sglang_hsd.sglang_plugin.cpu.kernel_ops import build_tree_kernel_efficient_cpu
from sglang_hsd.verify import TreeUniforms, verify_tree
from tests.sglang_plugin.plugin_fixtures import fake_sglang_state, plugin_loaded  # noqa: F401

pytestmark = pytest.mark.sglang

# k = 2, 3 steps, N = 6 (see test_cpu_tree_ops.py): root -> {1, 2}; 1 -> 3; 2 -> 4; 3 -> 5
PARENT_LIST, KEPT, N, VOCAB = [-1, 0, 1, 2, 4], [0, 1, 2, 4, 6], 6, 7


def _install(monkeypatch, method, tree_draft):
    from sglang.srt.speculative import eagle_utils

    for name in ("chain_speculative_sampling_triton", "_verify_uses_greedy",
                 "tree_speculative_sampling_target_only"):
        monkeypatch.setattr(eagle_utils, name, getattr(eagle_utils, name))
    state = verify_hook.VerifyHookState(PluginConfig(verify_method=method, topk=2,
                                                     tree_draft=tree_draft))
    verify_hook.install_verify_hooks(state)
    return state


def _tree_batch(bs, seed, all_greedy=False):
    gen = torch.Generator().manual_seed(seed)
    seq = torch.full((bs,), 5)
    ri, nt, ns = torch.full((3, bs, N), -1, dtype=torch.long)
    build_tree_kernel_efficient_cpu(torch.tensor([PARENT_LIST] * bs), torch.tensor([KEPT] * bs),
                                    seq, torch.ones(bs * N * N, dtype=torch.bool),
                                    torch.empty(bs * N, dtype=torch.long), ri, nt, ns, 2, 3, N, 1)
    # siblings 1, 2 distinct; q rows context dependent
    q = torch.softmax(torch.randn(bs, N, VOCAB, generator=gen) * 2, -1)
    tokens = torch.stack([torch.randperm(VOCAB, generator=gen)[:N] for _ in range(bs)])
    verify_input = types.SimpleNamespace(
        draft_token=tokens.reshape(-1), draft_token_num=N, max_tree_depth=4, tree_topk=2,
        draft_probs=q, retrieve_index=ri, retrieve_next_token=nt, retrieve_next_sibling=ns,
        custom_mask=None, positions=None)
    sampling_info = types.SimpleNamespace(
        is_all_greedy=all_greedy, acc_additive_penalties=None, acc_scaling_penalties=None,
        logit_bias=None, temperatures=torch.ones(bs, 1), top_ks=torch.full((bs,), 1 << 30),
        top_ps=torch.ones(bs), min_ps=torch.zeros(bs), need_top_k_sampling=False,
        need_top_p_sampling=False, need_min_p_sampling=False, sampling_seed=None,
        has_watermark_candidates=False)
    batch = types.SimpleNamespace(
        device="cpu", seq_lens=seq, sampling_info=sampling_info, return_logprob=False,
        forward_mode=types.SimpleNamespace(is_idle=lambda: False))
    logits = types.SimpleNamespace(next_token_logits=torch.randn(bs * N, VOCAB, generator=gen))
    return verify_input, batch, logits


def _info(**fields):
    """A stand-in for SGLang's ``SamplingBatchInfo`` of two requests (T = 1, no filter), with
    ``fields`` replaced."""
    plain = dict(temperatures=torch.ones(2, 1), top_ks=torch.full((2,), 1 << 30),
                 top_ps=torch.ones(2), min_ps=torch.zeros(2), need_top_k_sampling=False,
                 need_top_p_sampling=False, need_min_p_sampling=False)
    return types.SimpleNamespace(**{**plain, **fields})


@pytest.mark.parametrize("method, tree_draft", [("target-only", "topk"), ("hsd", "sampled"),
                                                ("rrs", "sampled")])
def test_tree_batch_runs_verify_tree_on_sglang_coins(plugin_loaded, monkeypatch, method,
                                                     tree_draft):
    from sglang.srt.speculative import eagle_utils
    from sglang_hsd.sglang_plugin.tree_draft import DraftTree

    fake_sglang_state(monkeypatch)
    eagle_utils.get_spec().speculative_use_rejection_sampling = False  # trees
    state = _install(monkeypatch, method, tree_draft)
    bs = 5
    verify_input, batch, logits = _tree_batch(bs, seed=3)
    tree = None
    if tree_draft == "sampled":
        tree = DraftTree(verify_input.draft_probs, verify_input.retrieve_next_token,
                         verify_input.retrieve_next_sibling, torch.full((bs,), N - 1))
    target = torch.softmax(logits.next_token_logits, -1).reshape(bs, N, VOCAB)
    torch.manual_seed(7)
    with state.verify_call(batch.sampling_info, tree=tree):
        predict, accept_lens, accept_index = eagle_utils.eagle_sample(verify_input, batch, logits)
    assert state.hsd_calls == 1

    torch.manual_seed(7)
    uniforms = TreeUniforms(accept=torch.rand(bs, N), sample=torch.rand(bs))
    candidates = verify_input.draft_token.reshape(bs, N)
    direct = verify_tree(candidates, verify_input.retrieve_next_token,
                         verify_input.retrieve_next_sibling,
                         verify_input.draft_probs if tree is not None else None, target,
                         method=method, uniforms=uniforms)
    assert torch.equal(accept_lens.long(), direct.num_accepted + 1)
    for b in range(bs):
        n = int(direct.num_accepted[b])
        path = direct.accept_index[b, : n + 1]
        rows = accept_index[b, : n + 1].long()
        assert torch.equal(rows, path + b * N)  # global node indices via retrive_index
        assert torch.equal(predict[rows].long(), direct.tokens[b, : n + 1])
        assert (accept_index[b, n + 1 :] == -1).all()


def test_sampled_tree_verify_needs_the_rounds_tree(plugin_loaded, monkeypatch):
    from sglang.srt.speculative import eagle_utils

    fake_sglang_state(monkeypatch)
    eagle_utils.get_spec().speculative_use_rejection_sampling = False
    state = _install(monkeypatch, "hsd", "sampled")
    verify_input, batch, logits = _tree_batch(2, seed=4)
    with state.verify_call(batch.sampling_info), pytest.raises(RuntimeError, match="sampled tree"):
        eagle_utils.eagle_sample(verify_input, batch, logits)


def test_all_greedy_tree_batch_keeps_sglang_argmax_walk(plugin_loaded, monkeypatch):
    from sglang.srt.speculative import eagle_utils

    fake_sglang_state(monkeypatch)
    eagle_utils.get_spec().speculative_use_rejection_sampling = False
    state = _install(monkeypatch, "hsd", "sampled")
    verify_input, batch, logits = _tree_batch(3, seed=5, all_greedy=True)
    eagle_utils.eagle_sample(verify_input, batch, logits)
    assert state.hsd_calls == 0


def test_other_algorithms_keep_sglang_tree_sampler(plugin_loaded, monkeypatch):
    fake_sglang_state(monkeypatch, algorithm="EAGLE3")
    state = _install(monkeypatch, "target-only", "topk")
    calls = []
    hook = verify_hook.make_hsd_tree_sampling(lambda *a: calls.append(a), state)
    hook(*[None] * 11)
    assert len(calls) == 1 and state.fallback_calls == 1 and state.hsd_calls == 0


def test_drafter_q_uses_the_targets_sampling_transform(plugin_loaded, monkeypatch):
    """``tree_draft.sampling_probs`` is the transform ``eagle_sample`` applies to the target
    (temperature, top-k, top-p); greedy rows get the plain softmax for the drafter."""
    from sglang.srt.speculative import eagle_utils
    from sglang_hsd.sglang_plugin.request_sampling import sampling_probs
    from sglang_hsd.sglang_plugin.tree_draft import DraftTree

    fake_sglang_state(monkeypatch)
    eagle_utils.get_spec().speculative_use_rejection_sampling = False
    state = _install(monkeypatch, "hsd", "sampled")
    bs = 4
    verify_input, batch, logits = _tree_batch(bs, seed=6)
    info = batch.sampling_info
    info.temperatures = torch.tensor([[0.7], [1.0], [1.3], [1.0]])
    info.top_ks, info.top_ps = torch.tensor([3, 1, 5, 7]), torch.tensor([1.0, 1.0, 0.8, 0.6])
    info.need_top_k_sampling = info.need_top_p_sampling = True
    seen = {}

    def capture(*args, **kwargs):
        seen["target"] = args[4]
        return verify_tree(*args, **kwargs)

    monkeypatch.setattr(verify_hook, "verify_tree", capture)
    tree = DraftTree(verify_input.draft_probs, verify_input.retrieve_next_token,
                     verify_input.retrieve_next_sibling, torch.full((bs,), N - 1))
    raw = logits.next_token_logits.clone()
    with state.verify_call(batch.sampling_info, tree=tree):
        eagle_utils.eagle_sample(verify_input, batch, logits)
    ours = sampling_probs(raw, info, repeats=N).reshape(bs, N, VOCAB)
    torch.testing.assert_close(ours, seen["target"])
    assert ((ours > 0).sum(-1)[0] <= 3).all() and ((ours > 0).sum(-1)[1] == 1).all()
    drafter_q = sampling_probs(raw, info, repeats=N, greedy_plain=True).reshape(bs, N, VOCAB)
    torch.testing.assert_close(drafter_q[1], torch.softmax(raw.reshape(bs, N, VOCAB)[1], -1))
    torch.testing.assert_close(drafter_q[[0, 2, 3]], ours[[0, 2, 3]])


def test_root_q_hook_keeps_the_draft_extends_q_on_the_draft_input(plugin_loaded):
    from sglang_hsd.sglang_plugin.request_sampling import sampling_probs
    from sglang_hsd.sglang_plugin.tree_draft import RootQHook

    calls = []
    module = types.SimpleNamespace(
        renorm_draft_probs=lambda logits, info, flag: calls.append(flag) or logits.softmax(-1))
    hook = RootQHook()
    hook.install(module)
    info = _info(temperatures=torch.tensor([[0.5], [1.0]]), need_top_k_sampling=True,
                 top_ks=torch.tensor([2, 1]))
    logits = torch.randn(2, 9)
    draft_input = types.SimpleNamespace(draft_probs=None)

    def extend():
        module.renorm_draft_probs(logits, info, False)
        return draft_input

    assert hook.run(extend, lambda result: result) is draft_input
    torch.testing.assert_close(draft_input.draft_probs,
                               sampling_probs(logits, info, greedy_plain=True))
    assert calls == [False] and hook.pending is None
    module.renorm_draft_probs(logits, info, False)  # outside a draft extend: nothing recorded
    assert hook.pending is None


def test_draft_temperature_scale_sharpens_every_sampled_row(plugin_loaded):
    """``temperature_scale`` S: the transform at temperature T * S (top-k / top-p after it), for
    the root's q (``RootQHook``) as for the forwards' rows; greedy rows keep the plain softmax."""
    from sglang_hsd.sglang_plugin.request_sampling import sampling_probs
    from sglang_hsd.sglang_plugin.tree_draft import RootQHook

    info = _info(temperatures=torch.tensor([[0.7], [1.0]]), need_top_k_sampling=True,
                 top_ks=torch.tensor([4, 1]))
    logits = torch.randn(2, 9, generator=torch.Generator().manual_seed(0))
    sharp = sampling_probs(logits, info, greedy_plain=True, temperature_scale=0.5)
    scaled = types.SimpleNamespace(**{**vars(info), "temperatures": info.temperatures * 0.5})
    torch.testing.assert_close(sharp[0], sampling_probs(logits, scaled)[0])
    expected = torch.softmax(logits[0] / 0.35, -1)
    expected = torch.where(expected >= expected.topk(4).values[-1], expected, 0)
    torch.testing.assert_close(sharp[0], expected / expected.sum())
    torch.testing.assert_close(sharp[1], torch.softmax(logits[1], -1))
    assert sharp[0].max() > sampling_probs(logits, info)[0].max()  # sharper than at T

    module = types.SimpleNamespace(renorm_draft_probs=lambda logits, info, flag: logits.softmax(-1))
    hook = RootQHook(temperature_scale=0.5)
    hook.install(module)
    draft_input = types.SimpleNamespace(draft_probs=None)

    def extend():
        module.renorm_draft_probs(logits, info, False)
        return draft_input

    hook.run(extend, lambda result: result)
    torch.testing.assert_close(draft_input.draft_probs, sharp)


def test_validation_accepts_the_filler_of_a_short_sampled_tree(plugin_loaded, monkeypatch):
    """``SGLANG_HSD_VALIDATE=1``: a request whose q support ran out (top_k 1 below the tree's
    k = 2) drafts fewer than N - 1 nodes; the drafter's filler columns are unreachable, and the
    hook's validation accepts them as filler while still checking the rest of the batch."""
    from sglang_hsd.sglang_plugin.tree_draft import DraftTree
    from sglang_hsd.tree_draft import DraftPlan, KeyedNoise, LevelDrafter, TreeShape

    fake_sglang_state(monkeypatch)
    gen = torch.Generator().manual_seed(9)
    bs, depth, k = 2, 3, 2
    root_q = torch.softmax(torch.randn(bs, VOCAB, generator=gen), -1)
    root_q[1] = torch.nn.functional.one_hot(torch.tensor(3), VOCAB).float()  # one token of support
    drafter = LevelDrafter(DraftPlan.build(TreeShape(depth, k, N), "spine"), root_q, torch.zeros(bs, dtype=torch.bool),
                           KeyedNoise.fresh(torch.zeros(bs, dtype=torch.long), gen))
    drafter.first()
    for _ in range(depth - 1):
        rows = torch.softmax(torch.randn(bs * k, VOCAB, generator=gen), -1)
        rows[k:] = torch.nn.functional.one_hot(torch.tensor(4), VOCAB).float()
        drafter.step(rows)
    level_tree = drafter.finish()
    assert level_tree.num_kept.tolist() == [N - 1, depth]  # request 1: a chain, then filler
    tree = DraftTree(level_tree.draft_probs, level_tree.retrive_next_token,
                     level_tree.retrive_next_sibling, level_tree.num_kept)
    state = verify_hook.VerifyHookState(PluginConfig(verify_method="hsd", topk=k, tree_draft="sampled",
                                                     validate=True))
    hook = verify_hook.make_hsd_tree_sampling(lambda *args: None, state)
    candidates = level_tree.candidates.clone()
    target = torch.softmax(torch.randn(bs, N, VOCAB, generator=gen), -1)
    accept_index = torch.full((bs, depth + 1), -1, dtype=torch.int32)
    accept_num = torch.zeros(bs, dtype=torch.int32)

    def run(tree):
        with state.verify_call(_info(), tree=tree):
            hook(torch.zeros(bs * N, dtype=torch.int32), accept_index, accept_num, candidates,
                 torch.arange(bs * N).view(bs, N), level_tree.retrive_next_token,
                 level_tree.retrive_next_sibling, torch.rand(bs, N, generator=gen),
                 torch.rand(bs, generator=gen), target, level_tree.draft_probs)

    run(tree)
    assert state.hsd_calls == 1 and int(accept_num[1]) <= depth
    broken = level_tree.retrive_next_token.clone()
    broken[0, 0] = -1  # request 0 (no filler): its nodes become orphans, still refused
    with pytest.raises(ValueError, match="orphan"):
        run(DraftTree(tree.draft_probs, broken, tree.retrive_next_sibling, tree.num_kept))
