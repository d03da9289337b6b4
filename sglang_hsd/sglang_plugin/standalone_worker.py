"""The HSD worker with a separate draft language model (``--hsd-draft-kind model``).

Most models have no EAGLE-3 head; their users draft with a small model of the same family (same
tokenizer). SGLang's ``StandaloneWorkerV2`` runs that shape on top of the EAGLE V2 worker: the draft
model has its own embeddings, LM head and KV cache (a second pool indexed by the same slots as the
target's), drafts K tokens autoregressively per round and, after verification, re-runs the
accepted tokens (draft extend) so its cache holds exactly the accepted prefix.

``HSDStandaloneWorker`` subclasses it as ``HSDWorker`` subclasses ``EAGLEWorkerV2``: the same verify
hooks (``verify_hook.py``: sampled batches verified by ``verify_chain`` with the draft's real q),
and the draft worker re-classed to ``HSDStandaloneDraftWorker`` (q checked to be on the target
vocabulary). Drafts are sampled from the draft model's q under each request's temperature /
top-k / top-p (SGLang's rejection-sampling draft path, turned on by the server-argument
resolution); all-greedy batches draft and verify by argmax.

This module subclasses SGLang at import: ``worker.hsd_worker`` imports it only when SGLang builds
the HSD worker for a draft language model (after ``register()`` checked every signature).
"""

from __future__ import annotations

from sglang.srt.speculative.standalone_worker_v2 import StandaloneDraftWorker, StandaloneWorkerV2

from sglang_hsd.sglang_plugin.config import PluginConfig
from sglang_hsd.sglang_plugin.draft_worker import HSDStandaloneDraftWorker
from sglang_hsd.sglang_plugin.worker_setup import adopt_draft_worker, install_hsd_hooks


class HSDStandaloneWorker(StandaloneWorkerV2):
    """``StandaloneWorkerV2`` for ``--speculative-algorithm HSD`` with a draft language model.

    Args (besides SGLang's four):
        plugin_config: the chain verifier (``PluginConfig``).
    """

    def __init__(self, server_args, gpu_id, nccl_port, target_worker, *,
                 plugin_config: PluginConfig):
        self.hsd_hooks = install_hsd_hooks(plugin_config)
        super().__init__(server_args, gpu_id, nccl_port, target_worker)
        adopt_draft_worker(self, StandaloneDraftWorker, HSDStandaloneDraftWorker)
