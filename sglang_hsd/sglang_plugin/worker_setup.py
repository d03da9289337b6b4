"""Steps every HSD speculative worker shares (``worker.HSDWorker`` on SGLang's EAGLE-3 V2 worker,
``standalone_worker.HSDStandaloneWorker`` on its STANDALONE V2 worker): the verify hooks bound to the
worker's state, the draft worker SGLang built re-classed to the HSD subclass, and that draft
worker set up for sampled trees.
"""

from __future__ import annotations

from sglang_hsd.sglang_plugin.config import PluginConfig
from sglang_hsd.sglang_plugin.verify_hook import VerifyHookState, install_verify_hooks


def install_hsd_hooks(plugin_config: PluginConfig) -> VerifyHookState:
    """The verify hooks of this process, bound to a fresh ``VerifyHookState`` (one HSD worker
    per scheduler process: the hooks read that worker's state)."""
    state = VerifyHookState(plugin_config)
    install_verify_hooks(state)
    return state


def adopt_draft_worker(worker, sglang_cls: type, hsd_cls: type):
    """Re-class the draft worker SGLang's V2 worker ``__init__`` built (``worker._draft_worker``,
    exactly a ``sglang_cls``) as ``hsd_cls``, so no SGLang constructor code is copied.

    Returns the draft worker, or None on pipeline stages that have none.
    """
    draft = getattr(worker, "_draft_worker", "missing")
    if draft == "missing":
        raise RuntimeError(
            f"HSD: {type(worker).__mro__[1].__name__} no longer keeps its draft worker in "
            "`_draft_worker`; sglang-hsd supports sglang==0.5.23")
    if draft is None:  # non-last pipeline stages have none
        return None
    if type(draft) is not sglang_cls:
        raise RuntimeError(f"HSD: expected a {sglang_cls.__name__}, got {type(draft).__name__}")
    draft.__class__ = hsd_cls
    return draft


def setup_sampled_trees(draft, config: PluginConfig) -> None:
    """With ``--hsd-tree-draft sampled`` or ``argmax-first`` trees (topk > 1), give the HSD draft worker ``draft``
    (a ``draft_worker.SampledTreeDraft``) the configuration its tree loop reads, one ``DraftPlan``
    per tree budget (``hsd_tree_plans``, keyed by depth: the configured shape at its depth, the
    smaller budgets ``--hsd-adaptive`` may choose below it) and the ``RootQHook`` that records each
    draft extend's next-root q; nothing for chains or top-k trees.
    """
    if draft is None or not config.sampled_tree:
        return
    from sglang.srt.speculative import eagle_worker_v2

    from sglang_hsd.sglang_plugin.tree_draft import RootQHook
    from sglang_hsd.tree_draft import DraftPlan, TreeShape, budget_shapes

    draft.hsd_config = config
    shape = TreeShape(draft.speculative_num_steps, draft.topk, draft.speculative_num_draft_tokens)
    budgets = budget_shapes(shape, config.tree_rule)
    budgets[shape.depth] = shape  # as configured (DraftPlan.build refuses a shape the rule cannot keep)
    draft.hsd_tree_plans = {depth: DraftPlan.build(budget, config.tree_rule, draft.device, config.child_sampler)
                            for depth, budget in budgets.items()}
    draft.hsd_root_q = RootQHook(config.draft_temperature_scale)
    draft.hsd_root_q.install(eagle_worker_v2)


def setup_draft_copies(worker) -> dict | None:
    """On CPU, give a separate draft language model's own layers the ``--hsd-draft-precision``
    weight copy (``cpu.draft_copies``) and log the choice; returns the report for
    ``/server_info``, or None off CPU or without a draft model on this rank."""
    draft = getattr(worker, "_draft_worker", None)
    if draft is None or str(worker.device) != "cpu":
        return None
    from sglang_hsd.sglang_plugin.cpu.draft_copies import (
        DRAFT_PRECISION_FLAG, DraftPrecisionConfig, attach_draft_copies, log_report)
    from sglang_hsd.sglang_plugin.cpu.linear_path import refuse_weight_updates, release_unpacked_weights

    report = attach_draft_copies(draft.draft_runner.model, worker.target_worker.model_runner.model,
                                 DraftPrecisionConfig.from_env())
    release_unpacked_weights(draft.draft_runner.model)  # the copies are built: packed layers only
    log_report(report)
    if report.layers:
        refuse_weight_updates(f"{DRAFT_PRECISION_FLAG} {report.precision}: the draft model's weight "
                              "copies cannot follow a weight update; restart the server with the new "
                              f"weights (or pass {DRAFT_PRECISION_FLAG} fp32)")
    return report.as_dict()


def setup_lean_decode(worker):
    """On CPU, put the lean forward (``cpu.lean_decode``, ``--hsd-draft-forward``) in front of a
    separate draft model's decoder; returns its ``LeanDecodeStats`` (for ``/server_info``), or
    None off CPU or without a draft model on this rank."""
    draft = getattr(worker, "_draft_worker", None)
    if draft is None or str(worker.device) != "cpu":
        return None
    from sglang_hsd.sglang_plugin.cpu.lean_decode import DraftForwardConfig, install_lean_decode

    return install_lean_decode(draft.draft_runner.model, DraftForwardConfig.from_env())
