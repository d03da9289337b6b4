"""Sampled trees under SGLang's draft CUDA graph (``--hsd-tree-draft sampled`` without
``--disable-cuda-graph``).

SGLang captures the draft loop by calling the draft worker's ``draft_forward`` inside its
``EAGLEDraftCudaGraphRunner`` for every captured batch size (and, with rejection sampling, an
all-greedy variant). The sampled tree round (``tree_draft.draft_sampled_tree``) is a static-shape
tensor program without host synchronisation (``sglang_hsd/tree_draft/drafter.py``), so it is
captured as it is; what changes is how its tree reaches verification. Eagerly, the round leaves a
``DraftTree`` on the worker; a replay runs no Python, so the captured graph returns the tree as
outputs instead: ``SampledTreeGraphRunner`` captures with the worker's ``hsd_capturing_tree`` set
(``draft_forward`` then returns SGLang's four tensors plus the tree's verify-layout links and
``num_kept``), slices all seven to the real batch after a padded replay, and
``split_graph_outputs`` hands the first four to SGLang and builds the ``DraftTree``. All-greedy
batches replay SGLang's own top-k graph (four outputs, no sampled tree).

Inside the graph the round reads what SGLang's runner keeps in its static buffers: the root's q
(``draft_probs``, which the runner holds under rejection sampling, on for HSD), temperatures and
top-k (copied in under rejection sampling), the sequence lengths (the noise's position), and the
sampling seed when SGLang carries one (deterministic inference). The runner captures with top-p /
min-p off, so a replayed round drafts from q without those filters: still lossless, because the
verifier reads the very q rows the children were drawn from, but drafts the target's filters
rule out are then rejected. Unseeded requests key their noise by a seed drawn on the device
(``tree_draft.round_noise``), which a captured graph redraws at every replay. When SGLang also
replays the draft extend from a graph, ``RootQHook`` records nothing (a replay runs no Python) and
the next root's q is SGLang's own draft distribution, softmax(logits / T) (plain softmax for
greedy rows): again the q the root's children are drawn from and verified with, only without the
request's filters and ``--hsd-draft-temperature-scale``.

Has run on CPU only through its unit tests (``tests/sglang_plugin/test_tree_graph.py``): SGLang
captures no draft graph on CPU, and the GPU machine the project was checked on has no SGLang.
The round it captures has run in a CUDA graph on an H100 (``tests/gpu/test_draft_capture.py``).

This module imports SGLang at import: only ``draft_worker.py`` imports it.
"""

from __future__ import annotations

import contextlib

from sglang.srt.speculative import eagle_worker_v2
from sglang.srt.speculative.eagle_draft_cuda_graph_runner import EAGLEDraftCudaGraphRunner

from sglang_hsd.sglang_plugin.tree_draft import DraftTree

# SGLang's (parent_list, top_scores_index, draft_tokens, draft_probs), then the sampled tree's
# retrive_next_token, retrive_next_sibling [bs, N] and num_kept [bs].
TREE_GRAPH_OUTPUTS = 7


class SampledTreeGraphRunner(EAGLEDraftCudaGraphRunner):
    """SGLang's EAGLE draft graph runner, capturing sampled tree rounds with their tree as outputs."""

    def __init__(self, eagle_worker, **kwargs):
        eagle_worker.hsd_capturing_tree = True
        try:
            super().__init__(eagle_worker, **kwargs)
        finally:
            eagle_worker.hsd_capturing_tree = False

    def _postprocess_output_to_raw_bs(self, out, raw_bs):
        return tuple(t[:raw_bs] if t is not None else None for t in out)


@contextlib.contextmanager
def sampled_tree_graph_runner():
    """While SGLang captures the draft graphs, its EAGLE draft runner is ``SampledTreeGraphRunner``
    (``EagleDraftWorker._capture_cuda_graphs`` looks the class up in its module when it runs)."""
    original = eagle_worker_v2.EAGLEDraftCudaGraphRunner
    eagle_worker_v2.EAGLEDraftCudaGraphRunner = SampledTreeGraphRunner
    try:
        yield
    finally:
        eagle_worker_v2.EAGLEDraftCudaGraphRunner = original


def split_graph_outputs(out: tuple) -> tuple[tuple, DraftTree | None]:
    """SGLang's four draft outputs and the sampled ``DraftTree`` (None for a four-output replay,
    SGLang's own top-k round) of one graph replay."""
    if len(out) == TREE_GRAPH_OUTPUTS:
        return tuple(out[:4]), DraftTree(out[3], out[4], out[5], out[6])
    if len(out) != 4:
        raise RuntimeError(f"HSD: the draft graph returned {len(out)} outputs; expected 4 or {TREE_GRAPH_OUTPUTS}")
    return tuple(out), None
