"""Top-k, top-p and min-p on every HSD path: the law SGLang's non-speculative sampler draws from.

SGLang 0.5.23's speculative verify (``eagle_utils.eagle_sample``) builds the target rows with
temperature, then top-k, then top-p on the row renormalised after top-k, and no min-p; its
non-speculative sampler applies top-p to the ORIGINAL row and applies min-p. Each path is compared
with that sampler's own torch function (``server_law.sglang_sampler_law``, what the CPU server
samples from) on random logits:

* ``sglang_hsd.sampling.logits_to_probs`` (every level's transform);
* the drafter's q of sampled trees (``request_sampling.sampling_probs``) and the exit level's p;
* the target rows the chain verifier receives from ``eagle_sample`` and those the tree verifier
  receives, through the plugin's hooks;
* the plausible wrong: ``eagle_sample``'s rows as SGLang builds them (renormalised top-p, no
  min-p; the old behaviour) are not that law where top-k meets top-p or min-p bites.

Rows mix min-p alone and with a temperature, top-k or top-p, min-p 1, greedy rows (top_k 1), rows
without any filter, and top-k with top-p (Qwen2.5-Instruct's defaults: T 0.7, top_k 20, top_p
0.8; top_k 40 with top_p 0.95; both with min-p).
"""

from __future__ import annotations

import types

import pytest
import torch

from sglang_hsd.sampling import BatchSamplingParams, SamplingFilters, logits_to_probs
from sglang_hsd.sglang_plugin import verify_hook
from sglang_hsd.sglang_plugin.config import PluginConfig
from sglang_hsd.sglang_plugin.cpu import cpu_sampling
from tests.sglang_plugin.plugin_fixtures import fake_sglang_state, plugin_loaded  # noqa: F401
from tests.sglang_plugin.server_law import sglang_sampler_law

pytestmark = pytest.mark.sglang

# float32 transforms of the same probabilities in another order (renormalised before or after
# the threshold, sorted or not): agreement to rounding, far below any kept probability here.
TOL = 1e-6
OFF = 1 << 30  # SGLang's TOP_K_ALL
TEMPERATURES = [1.0, 0.7, 1.3, 1.0, 1.0, 1.0, 1.0, 0.9, 0.7, 1.0, 1.2]
TOP_KS = [OFF, OFF, 12, OFF, OFF, 1, OFF, OFF, 20, 40, 30]
TOP_PS = [1.0, 1.0, 1.0, 0.8, 1.0, 1.0, 1.0, 1.0, 0.8, 0.95, 0.9]
MIN_PS = [0.1, 0.05, 0.2, 0.1, 1.0, 0.3, 0.0, 0.02, 0.0, 0.0, 0.02]
BS = len(TEMPERATURES)
JOINT = [8, 9, 10]  # the rows combining top-k with top-p


def _info(repeat=1):
    """A stand-in for SGLang's ``SamplingBatchInfo`` of the requests above."""
    return types.SimpleNamespace(
        temperatures=torch.tensor(TEMPERATURES).view(-1, 1), top_ks=torch.tensor(TOP_KS, dtype=torch.int32),
        top_ps=torch.tensor(TOP_PS), min_ps=torch.tensor(MIN_PS), need_top_k_sampling=True,
        need_top_p_sampling=True, need_min_p_sampling=True, is_all_greedy=False,
        acc_additive_penalties=None, acc_scaling_penalties=None, logit_bias=None, sampling_seed=None,
        has_watermark_candidates=False)


def _logits(rows, vocab=64, seed=0):
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 2.5


def _reference(logits, repeats=1):
    """The non-speculative law of ``logits`` [BS * repeats, V], request b's rows contiguous."""
    def per_row(values):
        return torch.tensor(values).repeat_interleave(repeats)

    probs = torch.softmax(logits / per_row(TEMPERATURES).view(-1, 1), -1)
    return sglang_sampler_law(probs, per_row(TOP_KS), per_row(TOP_PS), per_row(MIN_PS))


@pytest.mark.parametrize("seed", range(3))
def test_logits_to_probs_is_sglangs_non_speculative_law(plugin_loaded, seed):
    logits = _logits(BS, seed=seed)
    params = BatchSamplingParams(torch.tensor(TEMPERATURES), torch.tensor(TOP_KS), torch.tensor(TOP_PS),
                                 torch.tensor(MIN_PS))
    reference = _reference(logits)
    kept = (reference > 0).sum(-1)
    assert (kept[torch.tensor(MIN_PS) > 0] < logits.shape[-1]).all()  # min-p bites in every row it is on
    torch.testing.assert_close(logits_to_probs(logits, params), reference, rtol=0, atol=TOL)
    flagged = logits_to_probs(logits, params, SamplingFilters(True, True, True, False, False))
    torch.testing.assert_close(flagged, reference, rtol=0, atol=TOL)


def test_drafter_q_and_exit_level_p_are_the_non_speculative_law(plugin_loaded):
    from sglang_hsd.sglang_plugin.exit_level import probs_like_sglang_verify
    from sglang_hsd.sglang_plugin.request_sampling import sampling_probs

    repeats = 3
    logits = _logits(BS * repeats, seed=4)
    reference = _reference(logits, repeats)
    torch.testing.assert_close(sampling_probs(logits, _info(), repeats), reference, rtol=0, atol=TOL)
    drafter_q = sampling_probs(logits, _info(), repeats, greedy_plain=True)
    plain = torch.softmax(logits, -1)
    greedy = torch.tensor(TOP_KS).repeat_interleave(repeats) == 1
    torch.testing.assert_close(drafter_q[~greedy], reference[~greedy], rtol=0, atol=TOL)
    assert torch.equal(drafter_q[greedy], plain[greedy])  # greedy rows: the drafter's plain softmax
    exit_p = probs_like_sglang_verify(logits, _info(), repeats)
    torch.testing.assert_close(exit_p, reference.view(BS, repeats, -1), rtol=0, atol=TOL)


def test_plugin_transforms_read_nothing_back(plugin_loaded, monkeypatch):
    """SGLang's flags reach ``logits_to_probs``: the drafter's q and the target rows' filters run
    without a host sync (as a captured CUDA graph needs)."""
    from sglang_hsd.sglang_plugin.request_sampling import filter_target_rows, sampling_probs

    logits = _logits(BS * 2, seed=8)
    expected = sampling_probs(logits, _info(), 2, greedy_plain=True)

    def refuse(*args, **kwargs):
        raise AssertionError("host synchronisation")

    for name in ("__bool__", "item", "tolist", "__int__", "__float__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, refuse)
    assert torch.equal(sampling_probs(logits, _info(), 2, greedy_plain=True), expected)
    filter_target_rows(torch.softmax(logits, -1).view(BS, 2, -1), _info())


def _chain_round(bs, steps, vocab, seed):
    """``eagle_sample``'s arguments for chains of ``steps`` drafts drawn from their q."""
    gen = torch.Generator().manual_seed(seed)
    n = steps + 1
    q = torch.softmax(torch.randn(bs, steps, vocab, generator=gen) * 2, -1)
    drafts = torch.multinomial(q.reshape(-1, vocab), 1, generator=gen).reshape(bs, steps)
    root = torch.randint(vocab, (bs, 1), generator=gen)
    next_token = torch.where(torch.arange(n) + 1 < n, torch.arange(n) + 1, -1).expand(bs, n)
    verify_input = types.SimpleNamespace(
        draft_token=torch.cat([root, drafts], 1).reshape(-1), draft_token_num=n, max_tree_depth=n,
        tree_topk=1, draft_probs=q, retrieve_index=torch.arange(bs * n).reshape(bs, n),
        retrieve_next_token=next_token.contiguous(), retrieve_next_sibling=torch.full((bs, n), -1),
        custom_mask=None, positions=None)
    batch = types.SimpleNamespace(
        device="cpu", seq_lens=torch.full((bs,), 7), sampling_info=_info(), return_logprob=False,
        forward_mode=types.SimpleNamespace(is_idle=lambda: False))
    logits = types.SimpleNamespace(next_token_logits=_logits(bs * n, vocab, seed))
    return verify_input, batch, logits


def test_chain_verifier_gets_the_non_speculative_law(plugin_loaded, monkeypatch):
    """Through SGLang's ``eagle_sample``: the rows ``verify_chain`` receives are the
    non-speculative law; SGLang's own rows (renormalised top-p, no min-p: the old behaviour)
    are not, and inside the HSD verify call SGLang's renormalisations pass the rows through."""
    from sglang.srt.speculative import eagle_utils

    fake_sglang_state(monkeypatch)
    for name in ("chain_speculative_sampling_triton", "_verify_uses_greedy", "top_k_renorm_prob",
                 "top_p_renorm_prob", "tree_speculative_sampling_target_only"):
        monkeypatch.setattr(eagle_utils, name, getattr(eagle_utils, name))
    state = verify_hook.VerifyHookState(PluginConfig(verify_method="hsd"))
    verify_hook.install_verify_hooks(state)
    seen = {}
    original_rows = state.target_rows

    def spy_rows(target_probs):
        seen["sglang"] = target_probs.clone()
        return original_rows(target_probs)

    def spy_chain(candidates, draft_probs, target_probs, **kwargs):
        seen["verified"] = target_probs
        return verify_hook_verify_chain(candidates, draft_probs, target_probs, **kwargs)

    verify_hook_verify_chain = verify_hook.verify_chain
    monkeypatch.setattr(state, "target_rows", spy_rows)
    monkeypatch.setattr(verify_hook, "verify_chain", spy_chain)
    steps, vocab = 3, 64
    verify_input, batch, logits = _chain_round(BS, steps, vocab, seed=5)
    raw_logits = logits.next_token_logits.clone()
    reference = _reference(raw_logits, steps + 1).view(BS, steps + 1, vocab)
    with state.verify_call(batch.sampling_info):
        eagle_utils.eagle_sample(verify_input, batch, logits)
    assert state.hsd_calls == 1
    torch.testing.assert_close(seen["verified"], reference, rtol=0, atol=TOL)
    temperature = torch.tensor(TEMPERATURES).repeat_interleave(steps + 1).view(-1, 1)
    plain = torch.softmax(raw_logits / temperature, -1).view(BS, steps + 1, vocab)
    torch.testing.assert_close(seen["sglang"], plain, rtol=0, atol=TOL)  # renormalisations deferred
    unfiltered = (torch.tensor(TOP_KS) == OFF) & (torch.tensor(TOP_PS) == 1) & (torch.tensor(MIN_PS) == 0)
    assert torch.equal(seen["sglang"][unfiltered], seen["verified"][unfiltered])
    # The wrong variant: SGLang's own rows (top-k, then top-p renormalised, no min-p).
    flat = plain.view(-1, vocab)
    per_row = lambda values: torch.tensor(values).repeat_interleave(steps + 1)  # noqa: E731
    sglang_rows = cpu_sampling.top_p_renorm_prob(cpu_sampling.top_k_renorm_prob(flat, per_row(TOP_KS)),
                                                 per_row(TOP_PS)).view(BS, steps + 1, vocab)
    gap = (sglang_rows - reference).abs().sum(-1)  # [bs, K + 1]: twice the total variation
    # min-p alone, with a temperature or with top-k removes more than 5% of the mass here
    # (with top-p 0.8 first, or top_k 1, it has little or nothing left to remove), and top-p on
    # the renormalised top-k row drops more tokens than on the original row
    assert (gap[[0, 1, 2, 4, 7]] > 0.1).all()
    # (where the top-k set holds nearly all the mass the two agree: 5 of these 12 rows differ)
    assert (gap[JOINT] > 0.02).sum() >= 4


def test_tree_verifier_gets_the_non_speculative_law(plugin_loaded, monkeypatch):
    from sglang_hsd.sglang_plugin.tree_draft import DraftTree

    fake_sglang_state(monkeypatch)
    state = verify_hook.VerifyHookState(PluginConfig(verify_method="hsd", topk=2, tree_draft="sampled"))
    seen = {}

    def spy_tree(*args, **kwargs):
        seen["verified"] = args[4]
        return verify_tree(*args, **kwargs)

    verify_tree = verify_hook.verify_tree
    monkeypatch.setattr(verify_hook, "verify_tree", spy_tree)
    torch.manual_seed(7)
    hook = verify_hook.make_hsd_tree_sampling(lambda *args: None, state)
    bs, n, vocab = BS, 3, 64  # root -> {1, 2}
    logits = _logits(bs * n, vocab, seed=6)
    # What eagle_sample hands the hook inside an HSD verify call: softmax(logits / T).
    sglang_rows = torch.softmax(logits / torch.tensor(TEMPERATURES).repeat_interleave(n).view(-1, 1), -1)
    next_token = torch.tensor([[1, -1, -1]] * bs)
    next_sibling = torch.tensor([[-1, 2, -1]] * bs)
    q = torch.softmax(torch.randn(bs, n, vocab), -1)
    candidates = torch.stack([torch.randperm(vocab)[:n] for _ in range(bs)])
    tree = DraftTree(q, next_token, next_sibling, torch.full((bs,), n - 1))
    predicts = torch.zeros(bs * n, dtype=torch.int32)
    accept_index = torch.full((bs, 2), -1, dtype=torch.int32)
    with state.verify_call(_info(), tree=tree):
        hook(predicts, accept_index, torch.zeros(bs, dtype=torch.int32), candidates,
             torch.arange(bs * n).view(bs, n), next_token, next_sibling, torch.rand(bs, n), torch.rand(bs),
             sglang_rows.view(bs, n, vocab), q)
    reference = _reference(logits, n).view(bs, n, vocab)
    torch.testing.assert_close(seen["verified"], reference, rtol=0, atol=TOL)


def test_verify_outside_a_verify_call_is_refused_naming_the_filters(plugin_loaded, monkeypatch):
    fake_sglang_state(monkeypatch)
    state = verify_hook.VerifyHookState(PluginConfig(verify_method="hsd"))
    with pytest.raises(RuntimeError, match="min_p"):
        state.target_rows(torch.ones(1, 2, 3) / 3)
