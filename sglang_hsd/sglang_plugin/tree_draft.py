"""Sampled draft trees in SGLang's EAGLE draft loop (``--speculative-eagle-topk`` > 1,
``--hsd-tree-draft sampled``).

SGLang's tree loop takes the deterministic top-k of a plain softmax at every step and prunes the
pool to the best path scores, which is lossy for sampled drafts; with its rejection-sampling
flag on it drafts a chain instead. ``draft_sampled_tree`` keeps SGLang's loop shape (D - 1 draft
forwards of k beams per request through the draft attention backend, the same per-step KV slots
and positions) and lets ``sglang_hsd.tree_draft.LevelDrafter`` choose the tokens:
children drawn without replacement from the drafter's real q, greedy rows (top_k == 1) taking
q's top-k. The tree comes back in SGLang's pool layout (its tree builder, attention mask and KV
bookkeeping run unchanged) plus what verification needs (``DraftTree``).

q is the drafter's distribution under the request's sampling parameters, computed by
``request_sampling.sampling_probs`` (``sglang_hsd.sampling.logits_to_probs``: temperature, top-k,
top-p, min-p, as the target rows HSD verifies against), on the draft vocabulary, then scattered to
the target vocabulary (``draft_probs.scatter_draft_probs``); ``--hsd-draft-temperature-scale`` S
runs that transform at temperature T * S (the verifier reads the same q). The root's q comes from
the draft extend that follows every verify (and prefill); ``RootQHook`` keeps it on the draft
input, which SGLang filters and merges with the batch.

This module imports SGLang at import: only ``draft_worker.py`` imports it.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch
from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
from sglang.srt.speculative.eagle_utils import per_step_draft_out_cache_loc

from sglang_hsd.sglang_plugin.draft_probs import scatter_draft_probs
from sglang_hsd.sglang_plugin.request_sampling import greedy_rows, sampling_probs
from sglang_hsd.tree_draft import CHILD_SAMPLERS, KeyedNoise, LevelDrafter, TargetKeyedNoise

# Seeded rounds draw children by Gumbel top-k on the target's keys (``TargetKeyedNoise``): the
# coupled rule verifies them, and the first child is then the draft's coupled draw.
COUPLED_CHILD_SAMPLER = "gumbel_topk"


@dataclass
class DraftTree:
    """What verification of one sampled tree round needs beyond SGLang's verify input.

    Fields:
        draft_probs: float [bs, N, Vt], verify-node order: row n = q node n's children were drawn
            from (target vocabulary), zeros for nodes never forwarded.
        retrive_next_token / retrive_next_sibling: int64 [bs, N], the drafted tree's links in
            verify order (rows whose q support ran out have unreachable filler nodes, which
            SGLang's tree builder may still attach; verification walks these links instead).
        num_kept: int64 [bs], drafted nodes per request (N - 1 unless q's support ran out; the
            columns after them are the filler, which validation accepts as such).
    """

    draft_probs: torch.Tensor
    retrive_next_token: torch.Tensor
    retrive_next_sibling: torch.Tensor
    num_kept: torch.Tensor


class RootQHook:
    """Keeps the root's q of the next round on the draft input.

    The draft extend (``_draft_extend_for_prefill`` / ``_draft_extend_for_decode``) computes the
    next root's draft distribution with the module-level ``renorm_draft_probs`` of
    ``eagle_worker_v2``; ``install`` wraps that name so the call also records ``sampling_probs``
    of the same logits, and ``run`` stores it as the draft input's ``draft_probs`` (draft
    vocabulary), which SGLang filters and merges with the batch.
    """

    def __init__(self, temperature_scale: float = 1.0):
        # None: outside a draft extend; False: inside one, nothing recorded yet; then the q
        self.pending: torch.Tensor | bool | None = None
        # ``PluginConfig.draft_temperature_scale``: the root's q is drawn from at T * S as well
        self.temperature_scale = temperature_scale

    def install(self, module) -> None:
        original = getattr(module.renorm_draft_probs, "__sglang_hsd_original__",
                           module.renorm_draft_probs)

        @functools.wraps(original)
        def renorm_draft_probs(next_token_logits, sampling_info, use_rejection_sampling):
            if self.pending is False:  # inside a hooked draft extend
                self.pending = sampling_probs(next_token_logits.float(), sampling_info,
                                              greedy_plain=True,
                                              temperature_scale=self.temperature_scale)
            return original(next_token_logits, sampling_info, use_rejection_sampling)

        renorm_draft_probs.__sglang_hsd_original__ = original
        module.renorm_draft_probs = renorm_draft_probs

    def run(self, extend, draft_input_of):
        """Run a draft extend (``extend()``) and attach the recorded root q to the draft input
        ``draft_input_of(result)`` it produced."""
        self.pending = False
        try:
            result = extend()
            q = self.pending
        finally:
            self.pending = None
        draft_input = draft_input_of(result)
        if draft_input is not None and isinstance(q, torch.Tensor):
            draft_input.draft_probs = q
        return result


def draft_sampled_tree(worker, forward_batch):
    """The draft loop of one round with sampled trees; replaces ``EagleDraftWorker.draft_forward``.

    Args:
        worker: the ``HSDDraftWorker`` (SGLang's draft worker: draft runner, attention backends,
            topk, speculative_num_steps / num_draft_tokens, hot_token_id; ``hsd_config``, the
            ``PluginConfig`` whose ``tree_rule`` and ``draft_temperature_scale`` apply;
            ``hsd_tree_plans``, the ``DraftPlan`` of each depth's budget;
            ``hsd_identity_token_map``, whether hot_token_id is the identity).
        forward_batch: the draft ``ForwardBatch`` SGLang prepared (spec_info carries the root's
            hidden states [bs, H] and q ``draft_probs`` [bs, Vd]).
    Returns:
        (parent_list, top_scores_index, draft_tokens (target ids), draft_probs [bs, N, Vt]) as
        SGLang's ``draft_forward`` returns them, and the ``DraftTree`` of the round.
    """
    spec_info, info = forward_batch.spec_info, forward_batch.sampling_info
    k, steps = worker.topk, worker.speculative_num_steps
    root_q = spec_info.draft_probs
    if root_q is None:
        raise RuntimeError("HSD sampled trees: the draft input carries no root q (draft extend "
                           "ran without RootQHook)")
    config = worker.hsd_config
    plan = worker.hsd_tree_plans[steps]  # this round's budget (--hsd-adaptive may shrink it)
    if plan.shape.num_draft_tokens != worker.speculative_num_draft_tokens:
        raise RuntimeError(f"HSD sampled tree: the runtime state has {worker.speculative_num_draft_tokens} "
                           f"draft tokens at depth {steps}, the tree plan {plan.shape}")
    to_target = _target_ids(worker)
    noise = round_noise(info, forward_batch.seq_lens)
    if info.sampling_seed is not None:  # a seeded round: children keyed as the target's draws
        plan = dataclasses.replace(plan, sampler=CHILD_SAMPLERS[COUPLED_CHILD_SAMPLER])
        draft_ids = torch.arange(root_q.shape[-1], device=root_q.device)
        noise = TargetKeyedNoise(info.sampling_seed.to(torch.int64), forward_batch.seq_lens.to(torch.int64),
                                 None if worker.hot_token_id is None else to_target(draft_ids))
    drafter = LevelDrafter(plan, root_q.float(), greedy_rows(info), noise, validate=False)
    out_cache_loc = per_step_draft_out_cache_loc(forward_batch.out_cache_loc,
                                                 forward_batch.batch_size, k, steps)
    hidden = spec_info.hidden_states
    step = drafter.first()
    for i in range(steps - 1):
        forward_batch.input_ids = to_target(step.input_ids)
        forward_batch.out_cache_loc = out_cache_loc[i]
        # EAGLE-3 heads read the parent's hidden state; a draft language model ignores it
        spec_info.hidden_states = None if hidden is None else hidden[step.hidden_rows]
        with forward_context(ForwardContext(attn_backend=worker.draft_attn_backend.attn_backends[i]),
                             forward_batch=forward_batch):
            logits_output = worker.draft_runner.forward(forward_batch).logits_output
        forward_batch.positions.add_(1)
        hidden = logits_output.hidden_states
        q_rows = sampling_probs(logits_output.next_token_logits.float(), info, k, greedy_plain=True,
                                temperature_scale=config.draft_temperature_scale)
        step = drafter.step(q_rows)
    tree = drafter.finish()
    vocab = worker.hsd_target_vocab_size
    q = tree.draft_probs
    if worker.hot_token_id is not None:
        q = scatter_draft_probs(q, worker.hot_token_id, vocab,
                                is_identity=worker.hsd_identity_token_map)
    draft_tree = DraftTree(q, tree.retrive_next_token, tree.retrive_next_sibling, tree.num_kept)
    return (tree.parent_list, tree.top_scores_index, to_target(tree.draft_tokens), q), draft_tree


def round_noise(sampling_info, seq_lens: torch.Tensor) -> KeyedNoise:
    """The round's tree noise, keyed by (stream seed, committed length ``seq_lens`` int [bs]):
    the request's sampling seed when SGLang carries one (``sampling_seed``), else a fresh
    per-round seed from torch's generator (on the device, so a captured graph replays a new one)."""
    seed = sampling_info.sampling_seed
    return KeyedNoise.fresh(seq_lens) if seed is None else KeyedNoise(seed, seq_lens)


def _target_ids(worker):
    """Draft-vocabulary ids -> target ids (``hot_token_id``; identity without a reduced vocab)."""
    hot = worker.hot_token_id
    if hot is None:
        return lambda ids: ids
    return lambda ids: hot[ids]
