"""Sampled trees under SGLang's draft CUDA graph (``sglang_plugin/tree_graph.py``), as far as a CPU
machine can check it: SGLang captures no draft graph on CPU, so these tests drive the pieces the
capture and replay go through (the runner class swapped in for the capture, the seven outputs a
captured sampled round returns, their slicing after a padded replay, the tree handed to
verification) with stand-ins for SGLang's runner. The captured round itself replays equal to
eager on a GPU (``tests/gpu/test_draft_capture.py``)."""

from __future__ import annotations

import types

import pytest
import torch

from tests.sglang_plugin.plugin_fixtures import args_namespace, plugin_loaded  # noqa: F401

pytestmark = pytest.mark.sglang


def _tree_outputs(bs=3, n=6, vocab=11):
    gen = torch.Generator().manual_seed(0)
    return (torch.zeros(bs, 5, dtype=torch.long), torch.arange(n - 1).expand(bs, -1).clone(),
            torch.randint(0, vocab, (bs, n - 1), generator=gen), torch.rand(bs, n, vocab, generator=gen),
            torch.full((bs, n), -1, dtype=torch.long), torch.full((bs, n), -1, dtype=torch.long),
            torch.full((bs,), n - 1, dtype=torch.long))


def test_graph_outputs_split_into_sglangs_four_and_the_tree(plugin_loaded):
    from sglang_hsd.sglang_plugin.tree_graph import split_graph_outputs

    out = _tree_outputs()
    four, tree = split_graph_outputs(out)
    assert len(four) == 4 and all(a is b for a, b in zip(four, out[:4]))
    assert tree.draft_probs is out[3] and tree.retrive_next_token is out[4]
    assert tree.retrive_next_sibling is out[5] and tree.num_kept is out[6]
    assert split_graph_outputs(out[:4]) == (out[:4], None)  # SGLang's own all-greedy round
    with pytest.raises(RuntimeError, match="5 outputs"):
        split_graph_outputs(out[:5])


def test_padded_replay_slices_every_output_to_the_real_batch(plugin_loaded):
    from sglang_hsd.sglang_plugin.tree_graph import SampledTreeGraphRunner

    out = SampledTreeGraphRunner._postprocess_output_to_raw_bs(None, _tree_outputs(bs=4), 3)
    assert len(out) == 7 and all(t.shape[0] == 3 for t in out)


def test_capture_swaps_in_the_tree_runner_and_restores_sglangs(plugin_loaded):
    from sglang.srt.speculative import eagle_worker_v2

    from sglang_hsd.sglang_plugin.tree_graph import SampledTreeGraphRunner, sampled_tree_graph_runner

    original = eagle_worker_v2.EAGLEDraftCudaGraphRunner
    with pytest.raises(KeyError):
        with sampled_tree_graph_runner():
            assert eagle_worker_v2.EAGLEDraftCudaGraphRunner is SampledTreeGraphRunner
            raise KeyError("capture failed")
    assert eagle_worker_v2.EAGLEDraftCudaGraphRunner is original


def test_runner_captures_with_the_worker_flag_set(plugin_loaded, monkeypatch):
    """While the runner's constructor captures, the worker's draft_forward returns the tree as
    outputs; afterwards it is back to the eager contract (the flag is cleared, also on failure)."""
    from sglang.srt.speculative.eagle_draft_cuda_graph_runner import EAGLEDraftCudaGraphRunner

    from sglang_hsd.sglang_plugin.tree_graph import SampledTreeGraphRunner

    seen = []

    def fake_init(self, eagle_worker, **kwargs):
        seen.append((eagle_worker.hsd_capturing_tree, kwargs))
        raise RuntimeError("no CUDA here")

    monkeypatch.setattr(EAGLEDraftCudaGraphRunner, "__init__", fake_init)
    worker = types.SimpleNamespace()
    with pytest.raises(RuntimeError, match="no CUDA"):
        SampledTreeGraphRunner(worker, speculative_num_steps=3)
    assert seen == [(True, {"speculative_num_steps": 3})] and worker.hsd_capturing_tree is False


def test_sampled_round_returns_seven_outputs_while_capturing(plugin_loaded, monkeypatch):
    from sglang_hsd.sglang_plugin import draft_worker
    from sglang_hsd.sglang_plugin.tree_draft import DraftTree

    out = _tree_outputs()
    tree = DraftTree(out[3], out[4], out[5], out[6])
    monkeypatch.setattr(draft_worker, "draft_sampled_tree", lambda worker, fb: (out[:4], tree))
    batch = types.SimpleNamespace(forward_mode=types.SimpleNamespace(is_idle=lambda: False),
                                  sampling_info=types.SimpleNamespace(is_all_greedy=False))
    worker = types.SimpleNamespace(hsd_root_q=object(), hsd_tree=None, hsd_capturing_tree=True)
    captured = draft_worker.SampledTreeDraft._hsd_sampled_tree(worker, batch)
    assert len(captured) == 7 and worker.hsd_tree is None
    worker.hsd_capturing_tree = False
    assert draft_worker.SampledTreeDraft._hsd_sampled_tree(worker, batch) == out[:4]
    assert worker.hsd_tree is tree
    # A replay's outputs become the round's tree the same way.
    worker.hsd_tree = None
    four = draft_worker.SampledTreeDraft._hsd_graph_outputs(worker, out)
    assert len(four) == 4 and worker.hsd_tree.num_kept is out[6]


def test_sampled_trees_no_longer_need_disable_cuda_graph(plugin_loaded, monkeypatch):
    from sglang_hsd.sglang_plugin.server_args import _sampled_tree_problems

    monkeypatch.setenv("SGLANG_HSD_TREE_DRAFT", "sampled")
    args = args_namespace(device="cuda", disable_cuda_graph=False, speculative_num_steps=3,
                          speculative_eagle_topk=2, speculative_num_draft_tokens=6)
    assert _sampled_tree_problems(args) == []
