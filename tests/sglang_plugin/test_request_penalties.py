"""Penalties through HSD's verify hooks and SGLang's own ``eagle_sample``
(``sglang_plugin/request_penalties.py``, ``verify_hook.make_verify_entry``).

A chain round and a tree round of requests with frequency, presence and repetition penalties and
min_new_tokens: the rows the verifier receives are softmax of each row's logits penalised with
the request's whole committed output plus the drafts on the row's path (written out here token
by token); SGLang's own accumulated penalties (deliberately wrong here, so applying them shows)
are not applied on top; a batch without penalties and a non-HSD server are left to SGLang.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from sglang_hsd.sglang_plugin import verify_hook
from sglang_hsd.sglang_plugin.config import PluginConfig
from sglang_hsd.sglang_plugin.request_penalties import batch_penalties, stop_token_ids
from tests.penalty_reference import penalised_logits
from tests.sglang_plugin.plugin_fixtures import fake_sglang_state, plugin_loaded  # noqa: F401

pytestmark = pytest.mark.sglang

TOL = 1e-6  # float32 rows
VOCAB = 32
EOS = 7
# (frequency, presence, repetition, min_new_tokens) per request
PENALTIES = [(0.8, 0.0, 1.0, 0), (0.0, 1.2, 1.0, 0), (0.0, 0.0, 1.6, 0), (0.3, 0.4, 1.2, 6), (0.0, 0.0, 1.0, 0)]
OUTPUTS = [[3, 3, 5], [1, 2], [4, 9, 4, 11], [5, 6, 2, 2], [8]]  # committed output, the root last


def _reqs():
    return [types.SimpleNamespace(
        rid=str(b), output_ids=list(out), eos_token_ids={EOS},
        tokenizer=types.SimpleNamespace(additional_stop_token_ids=None, eos_token_id=EOS),
        sampling_params=types.SimpleNamespace(frequency_penalty=f, presence_penalty=p, repetition_penalty=r,
                                              min_new_tokens=m, stop_token_ids={13}))
        for b, ((f, p, r, m), out) in enumerate(zip(PENALTIES, OUTPUTS))]


def _expected_row(logits: np.ndarray, output: list[int], penalties) -> np.ndarray:
    """softmax of plain decoding's penalised logits after ``output``."""
    frequency, presence, repetition, min_new = penalties
    out = penalised_logits(logits, output, frequency=frequency, presence=presence, repetition=repetition,
                           min_new_tokens=min_new, stop_tokens=[EOS, 13])
    e = np.exp(out - out.max())
    return e / e.sum()


def _round(links_next, links_sibling, candidates, seed):
    """``eagle_sample``'s arguments for a round of the five requests; SGLang's accumulated
    penalties are set to a wrong constant so their application would show."""
    bs, n = candidates.shape
    gen = torch.Generator().manual_seed(seed)
    info = types.SimpleNamespace(
        temperatures=torch.ones(bs, 1), top_ks=torch.full((bs,), 1 << 30, dtype=torch.int32),
        top_ps=torch.ones(bs), min_ps=torch.zeros(bs), need_top_k_sampling=False, need_top_p_sampling=False,
        need_min_p_sampling=False, is_all_greedy=False, acc_additive_penalties=torch.full((bs, VOCAB), -3.0),
        acc_scaling_penalties=torch.full((bs, VOCAB), 2.0), logit_bias=None, sampling_seed=None,
        has_watermark_candidates=False)
    q = torch.softmax(torch.randn(bs, n - 1, VOCAB, generator=gen), -1)
    verify_input = types.SimpleNamespace(
        draft_token=candidates.reshape(-1), draft_token_num=n, max_tree_depth=n, tree_topk=1, draft_probs=q,
        retrieve_index=torch.arange(bs * n).reshape(bs, n), retrieve_next_token=links_next,
        retrieve_next_sibling=links_sibling, custom_mask=None, positions=None)
    batch = types.SimpleNamespace(device="cpu", seq_lens=torch.full((bs,), 9), sampling_info=info,
                                  return_logprob=False, reqs=_reqs(),
                                  forward_mode=types.SimpleNamespace(is_idle=lambda: False))
    logits = types.SimpleNamespace(next_token_logits=torch.randn(bs * n, VOCAB, generator=gen) * 2)
    return verify_input, batch, logits


def _install(monkeypatch, state):
    from sglang.srt.speculative import eagle_utils, eagle_worker_common

    fake_sglang_state(monkeypatch)
    for name in ("chain_speculative_sampling_triton", "_verify_uses_greedy", "top_k_renorm_prob",
                 "top_p_renorm_prob", "tree_speculative_sampling_target_only"):
        monkeypatch.setattr(eagle_utils, name, getattr(eagle_utils, name))
    monkeypatch.setattr(eagle_worker_common, "eagle_sample", eagle_worker_common.eagle_sample)
    verify_hook.install_verify_hooks(state)
    return eagle_worker_common


def _spy(monkeypatch, name):
    seen = {}
    original = getattr(verify_hook, name)

    def spy(*args, **kwargs):
        seen["rows"] = args[4] if name == "verify_tree" else args[2]
        return original(*args, **kwargs)

    monkeypatch.setattr(verify_hook, name, spy)
    return seen


def _check_rows(rows, logits, candidates, parents):
    bs, n, _ = rows.shape
    for b in range(bs):
        for j in range(n):
            path, node = [], j
            while node > 0:
                path.insert(0, int(candidates[b, node]))
                node = parents[node]
            expected = _expected_row(logits[b * n + j].numpy(), OUTPUTS[b] + path, PENALTIES[b])
            np.testing.assert_allclose(rows[b, j].numpy(), expected, rtol=0, atol=TOL, err_msg=f"{b}, {j}")


def test_chain_rows_are_penalised_along_their_path(plugin_loaded, monkeypatch):
    state = verify_hook.VerifyHookState(PluginConfig(verify_method="hsd"))
    module = _install(monkeypatch, state)
    seen = _spy(monkeypatch, "verify_chain")
    bs, n = len(OUTPUTS), 4
    candidates = torch.tensor([[5, 3, 3, 1], [2, 1, 2, 1], [11, 4, 0, 4], [2, 2, 6, 7], [8, 8, 8, 8]])
    links = torch.tensor([[1, 2, 3, -1]] * bs)
    verify_input, batch, logits = _round(links, torch.full((bs, n), -1), candidates, seed=1)
    raw = logits.next_token_logits.clone()
    with state.verify_call(batch.sampling_info):
        module.eagle_sample(verify_input, batch, logits)
    assert state.hsd_calls == 1
    _check_rows(seen["rows"], raw, candidates, parents=[-1, 0, 1, 2])
    assert batch.sampling_info.acc_additive_penalties is not None  # SGLang's object untouched


def test_tree_rows_are_penalised_along_their_path(plugin_loaded, monkeypatch):
    from sglang_hsd.sglang_plugin.tree_draft import DraftTree

    state = verify_hook.VerifyHookState(PluginConfig(verify_method="hsd", topk=2, tree_draft="sampled"))
    module = _install(monkeypatch, state)
    from sglang.srt.speculative import eagle_utils

    eagle_utils.get_spec().speculative_use_rejection_sampling = False  # trees: SGLang's tree sampler
    seen = _spy(monkeypatch, "verify_tree")
    bs, n = len(OUTPUTS), 4  # root -> {1, 2}, 1 -> {3}
    next_token = torch.tensor([[1, 3, -1, -1]] * bs)
    next_sibling = torch.tensor([[-1, 2, -1, -1]] * bs)
    candidates = torch.tensor([[5, 3, 5, 3], [2, 1, 2, 1], [11, 4, 9, 4], [2, 2, 6, 13], [8, 8, 1, 8]])
    # SGLang's links (a filler node hung under node 2) differ from the drafted tree's: the drafted win
    verify_input, batch, logits = _round(next_token, torch.tensor([[-1, 2, 3, -1]] * bs), candidates, seed=2)
    verify_input.tree_topk = 2
    raw = logits.next_token_logits.clone()
    tree = DraftTree(verify_input.draft_probs[:, :1].expand(bs, n, VOCAB).contiguous(), next_token, next_sibling,
                     torch.full((bs,), n - 1))
    with state.verify_call(batch.sampling_info, tree=tree):
        module.eagle_sample(verify_input, batch, logits)
    _check_rows(seen["rows"], raw, candidates, parents=[-1, 0, 0, 1])


def test_batches_without_penalties_and_other_algorithms_are_sglangs(plugin_loaded, monkeypatch):
    state = verify_hook.VerifyHookState(PluginConfig(verify_method="hsd"))
    module = _install(monkeypatch, state)
    bs, n = len(OUTPUTS), 2
    candidates = torch.randint(VOCAB, (bs, n), generator=torch.Generator().manual_seed(0))
    links = torch.tensor([[1, -1]] * bs)
    calls = []
    monkeypatch.setattr(verify_hook, "penalise_verify_logits", lambda *a: calls.append(a))
    verify_input, batch, logits = _round(links, torch.full((bs, n), -1), candidates, seed=3)
    batch.sampling_info.acc_additive_penalties = batch.sampling_info.acc_scaling_penalties = None
    with state.verify_call(batch.sampling_info):
        module.eagle_sample(verify_input, batch, logits)
    assert calls == []
    # Another algorithm's verify (no HSD verify call): SGLang's eagle_sample gets the batch itself.
    fake_sglang_state(monkeypatch, algorithm="EAGLE3")
    received = []
    wrapper = verify_hook.make_verify_entry(lambda vi, b, lo, *a, **k: received.append(b), state)
    verify_input, batch, logits = _round(links, torch.full((bs, n), -1), candidates, seed=3)
    with state.verify_call(batch.sampling_info):
        wrapper(verify_input, batch, logits)
    assert received == [batch] and calls == []


def test_batch_penalties_read_sglangs_requests():
    reqs = _reqs()
    penalties = batch_penalties(reqs, VOCAB, "cpu")
    assert dict(zip(penalties.seen_ids[0].tolist(), penalties.seen_counts[0].tolist())) == {3: 2, 5: 1, -1: 0}
    assert penalties.output_len.tolist() == [3, 2, 4, 4, 1]
    assert stop_token_ids(reqs[3]) == {EOS, 13}
    assert penalties.stop_ids[3].tolist() == [EOS, 13]
    assert (penalties.stop_ids[0] == -1).all()  # no min_new_tokens: nothing forbidden
    reqs[0].output_ids.append(VOCAB)
    with pytest.raises(ValueError, match="token ids"):
        batch_penalties(reqs, VOCAB, "cpu")
