"""The HSD speculative worker: SGLang's EAGLE-3 V2 worker with HSD's verifier behind it.

SGLang builds its draft worker from what ``HSDSpecAlgo.create_worker`` returns: ``hsd_worker``
reads the ``--hsd-*`` configuration there, once per scheduler process, and passes it in.
``HSDWorker`` hands it on to what runs during verification:

* the verify hooks (``verify_hook.py``), installed bound to this worker's ``VerifyHookState``;
* with ``--hsd-exit-layer``, an ``ExitLevelVerifier`` (``exit_level.py``) that runs an
  intermediate early-exit level in every verify round;
* the draft worker SGLang built, re-classed to ``HSDDraftWorker`` (``draft_worker.py``: draft q
  on the target vocabulary) and, with exit sub-rounds, given a ``DraftContinuation``.

This module subclasses SGLang at import: ``spec_algo.py`` imports it only when SGLang builds the
HSD worker (after ``register()`` checked every signature).
"""

from __future__ import annotations

import functools

from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2, EagleDraftWorker

from sglang_hsd.sglang_plugin.config import ExitLevelConfig, PluginConfig
from sglang_hsd.sglang_plugin.draft_continuation import DraftContinuation
from sglang_hsd.sglang_plugin.draft_kind import MODEL, current_draft_kind
from sglang_hsd.sglang_plugin.draft_worker import HSDDraftWorker
from sglang_hsd.sglang_plugin.verify_step import HSDVerify, build_adaptive, build_exit_verifier
from sglang_hsd.sglang_plugin.worker_setup import (
    adopt_draft_worker, install_hsd_hooks, setup_sampled_trees)


def hsd_worker(server_args):
    """The worker SGLang builds for ``--speculative-algorithm HSD``: ``HSDWorker`` with the
    ``--hsd-*`` configuration read now, so bad options are refused before any model loads.

    SGLang calls the result with its four worker arguments (server_args, gpu_id, nccl_port,
    target_worker).
    """
    plugin_config = PluginConfig.from_env(server_args.speculative_eagle_topk or 1)
    # The exit level verifies chains; trees refuse it (server_args), so its default rule is only
    # inherited from a chain configuration.
    exit_config = (ExitLevelConfig.from_env() if plugin_config.is_tree
                   else ExitLevelConfig.from_env(plugin_config.verify_method))
    if current_draft_kind() == MODEL:
        from sglang_hsd.sglang_plugin.standalone_worker import HSDStandaloneWorker

        # An exit buffer > 1 was refused with the server arguments (draft_model_problems).
        return functools.partial(HSDStandaloneWorker, plugin_config=plugin_config,
                                 exit_config=exit_config)
    return functools.partial(HSDWorker, plugin_config=plugin_config, exit_config=exit_config)


class HSDWorker(HSDVerify, EAGLEWorkerV2):
    """EAGLE-3 V2 worker for ``--speculative-algorithm HSD`` (verification: verify_hook;
    with ``--hsd-exit-layer``, an early-exit level in every verify round: exit_level).

    Args (besides SGLang's four):
        plugin_config: the target level's chain verifier (``PluginConfig``).
        exit_config: the exit level (``ExitLevelConfig``; disabled without an exit layer).
    """

    def __init__(self, server_args, gpu_id, nccl_port, target_worker, *,
                 plugin_config: PluginConfig, exit_config: ExitLevelConfig):
        self.hsd_hooks = install_hsd_hooks(plugin_config)
        super().__init__(server_args, gpu_id, nccl_port, target_worker)
        self.hsd_exit = build_exit_verifier(target_worker, plugin_config, exit_config)
        self.hsd_adaptive = build_adaptive(self, plugin_config)
        self._adopt_draft_worker(target_worker)

    def _adopt_draft_worker(self, target_worker) -> None:
        """Re-class the draft worker as ``HSDDraftWorker`` and, with exit sub-rounds, give it the
        ``DraftContinuation`` the exit level drafts with."""
        draft = adopt_draft_worker(self, EagleDraftWorker, HSDDraftWorker)
        if draft is None:
            return
        setup_sampled_trees(draft, self.hsd_hooks.config)
        if self.hsd_exit is not None and self.hsd_exit.buffer > 1:
            draft.hsd_continuation = DraftContinuation(draft, target_worker.model_config.vocab_size)
            self.hsd_exit.drafter = draft.hsd_continuation
