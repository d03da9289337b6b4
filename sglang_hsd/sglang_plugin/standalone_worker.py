"""The HSD worker with a separate draft language model (``--hsd-draft-kind model``).

Most models have no EAGLE-3 head; their users draft with a small model of the same family (same
tokenizer). SGLang's ``StandaloneWorkerV2`` runs that shape on top of the EAGLE V2 worker: the draft
model has its own embeddings, LM head and KV cache (a second pool indexed by the same slots as the
target's), drafts K tokens autoregressively per round and, after verification, re-runs the
accepted tokens (draft extend) so its cache holds exactly the accepted prefix.

``HSDStandaloneWorker`` subclasses it as ``HSDWorker`` subclasses ``EAGLEWorkerV2``: the same verify
hooks (``verify_hook.py``: sampled batches verified by ``verify_chain`` with the draft's real q,
sampled trees by ``verify_tree``), and the draft worker re-classed to ``HSDStandaloneDraftWorker``
(q checked to be on the target vocabulary; sampled trees drafted as for EAGLE-3 heads). Chain
drafts are sampled from the draft model's q under each request's temperature / top-k / top-p
(SGLang's rejection-sampling draft path, turned on by the server-argument resolution); trees
(``--speculative-eagle-topk`` > 1) draw each node's children without replacement from that q
(``tree_draft.draft_sampled_tree``); all-greedy batches draft and verify by argmax.

With ``--hsd-draft-lookup N`` prompt-lookup copies form a level below the draft model
(``draft_lookup.py``): one draft forward reads the last draft and the copies, and hands up
several drafts where the draft model's draws match them.

On CPU the draft model's own layers draft on the weight copy of ``--hsd-draft-precision``
(``cpu/draft_copies.py``; ``auto``, the default, measures the fastest at start-up).

With ``--hsd-exit-layer`` (buffer 1) the early-exit level of ``exit_level.py`` runs in every
round, as with an EAGLE-3 head: the target's first L layers plus an exit head verify the draft
model's chain, and the remaining layers run only for what the exit kept.

This module subclasses SGLang at import: ``worker.hsd_worker`` imports it only when SGLang builds
the HSD worker for a draft language model (after ``register()`` checked every signature).
"""

from __future__ import annotations

from sglang.srt.speculative.standalone_worker_v2 import StandaloneDraftWorker, StandaloneWorkerV2

from sglang_hsd.sglang_plugin.config import ExitLevelConfig, PluginConfig
from sglang_hsd.sglang_plugin.draft_catch_up import build_catch_up
from sglang_hsd.sglang_plugin.draft_catch_up_setting import CatchUpSetting
from sglang_hsd.sglang_plugin.draft_lookup import build_lookup
from sglang_hsd.sglang_plugin.draft_lookup_setting import LookupSetting
from sglang_hsd.sglang_plugin.draft_worker import HSDStandaloneDraftWorker
from sglang_hsd.sglang_plugin.verify_step import HSDVerify, build_adaptive, build_exit_verifier
from sglang_hsd.sglang_plugin.worker_setup import (
    adopt_draft_worker, install_hsd_hooks, setup_draft_copies, setup_lean_decode, setup_sampled_trees)


class HSDStandaloneWorker(HSDVerify, StandaloneWorkerV2):
    """``StandaloneWorkerV2`` for ``--speculative-algorithm HSD`` with a draft language model
    (verification as ``HSDWorker``'s, ``verify_step.HSDVerify``: chains, sampled trees, and with
    ``--hsd-exit-layer`` an early-exit level verifying the draft model's chain first).

    Args (besides SGLang's four):
        plugin_config: the target level's verifier (``PluginConfig``).
        exit_config: the exit level (``ExitLevelConfig``; disabled without an exit layer; buffer
            1: exit sub-rounds draft from an EAGLE-3 head's hidden states).
    """

    def __init__(self, server_args, gpu_id, nccl_port, target_worker, *,
                 plugin_config: PluginConfig, exit_config: ExitLevelConfig = ExitLevelConfig()):
        self.hsd_hooks = install_hsd_hooks(plugin_config)
        super().__init__(server_args, gpu_id, nccl_port, target_worker)
        self.hsd_exit = build_exit_verifier(target_worker, plugin_config, exit_config)
        self.hsd_adaptive = build_adaptive(self, plugin_config)
        self.hsd_catch_up = build_catch_up(self, CatchUpSetting.from_env(),
                                           adaptive=self.hsd_adaptive is not None)
        draft = adopt_draft_worker(self, StandaloneDraftWorker, HSDStandaloneDraftWorker)
        draft.hsd_catch_up = self.hsd_catch_up
        draft.hsd_lookup = self.hsd_lookup = build_lookup(LookupSetting.from_env())
        setup_sampled_trees(draft, plugin_config)
        # Only the drafter's numbers change (the verifier reads the q the copy produced).
        self.hsd_draft_copies = setup_draft_copies(self)
        self.hsd_draft_step = setup_lean_decode(self)
