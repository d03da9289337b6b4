"""HSD's verifier inside SGLang's own verify entry point.

SGLang 0.5.23 verifies EAGLE drafts in ``eagle_utils.eagle_sample``. With rejection sampling on
(which HSD always turns on), a batch that is not all-greedy goes to the module-level name
``chain_speculative_sampling_triton`` with SGLang's tree tensors, its target probabilities
(temperature / top-k / top-p applied, [bs, K + 1, V]), the draft q [bs, K, V] and its coins.
``install_verify_hooks`` replaces that name with ``hsd_chain_sampling`` (same signature, same
in-place outputs) which calls ``sglang_hsd.verify.verify_chain`` when the running algorithm is HSD
and SGLang's kernel otherwise, so a server started with ``--speculative-algorithm EAGLE3`` is
untouched.

Target rows: ``eagle_sample`` builds them as softmax(logits / T), then ``top_k_renorm_prob``,
then ``top_p_renorm_prob`` (on the row renormalised after top-k), without min-p: not the law of
its non-speculative sampler when a request combines top-k with top-p or asks for min-p. Inside an
HSD verify call (``VerifyHookState.verify_call``) the hooks make those two module-level names pass
the rows through (``make_deferred_renorm``), and both HSD samplers build their rows with
``VerifyHookState.target_rows``: ``sampling.filter_probs``, the one transform every level uses,
with the non-speculative sampler's semantics. Outside HSD verify calls SGLang's functions run.

Penalties: inside an HSD verify call ``eagle_worker_common.eagle_sample`` (the name SGLang's
``run_eagle_verify`` calls) penalises each verify row with the committed output plus its own
path's drafts and runs SGLang's ``eagle_sample`` without its relaxed per-request penalties
(``make_verify_entry``, ``request_penalties.py``).

State: the hooks receive only tensors and flags from SGLang, so ``HSDWorker`` builds a
``VerifyHookState`` (its configuration, read once when the worker was built) and installs the
hooks bound to it. Each ``HSDWorker.verify`` call leaves the batch's ``SamplingBatchInfo`` there
for its duration (``VerifyHookState.verify_call``); with an exit level (``exit_level.py``) the
round's forward leaves an ``ExitRound`` there too, and the chain sampler then verifies the exit's
chain against the target (``window_round.target_round``), for greedy batches too (one-hot rows,
method ``greedy``).

All-greedy batches keep SGLang's argmax path (``verify_tree_greedy_func``). On CPU SGLang forces
that argmax path for every batch (``_verify_uses_greedy`` returns True for ``is_cpu``), which would
silently ignore temperature; for HSD we let sampled batches through.

Seeded batches (``sampling_seed`` set: ``request_seeds.py``): every row is verified by the coupled
rule (``verify/coupled.py``): the target's keyed Gumbel-max draw of each verify row, keyed by
(seed, the row's verify position), decides; the emitted tokens are those of plain seeded decoding
whatever was drafted, so a seeded request's text does not depend on the draft lengths the adaptive
controller chooses, on its batch-mates or on the levels in between. ``eagle_sample`` (the wrapper
``make_verify_entry``) leaves the rows' keys (``SeededKeys``) for the samplers of the call.

Random draws of unseeded batches: the coins are SGLang's (``_verify_coins``: per-request murmur hash of the sampling
seed when ``sampling_seed`` is set, ``torch.rand`` otherwise), used as our ``ChainUniforms``:
``coins[:, k]`` is the coin of draft position k + 1 and ``coins_for_final_sampling`` drives the
single residual / bonus draw. Under tensor parallelism ``eagle_sample`` broadcasts ``predict``,
``accept_index`` and ``num_correct_drafts`` from rank 0 right after this call, so every rank emits
rank 0's tokens by construction. (TP cannot be run on this CPU-only machine.)
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from sglang_hsd.sglang_plugin.config import ALGORITHM_NAME, PluginConfig
from sglang_hsd.sglang_plugin.request_penalties import (
    batch_penalties,
    has_penalties,
    penalise_verify_logits,
)
from sglang_hsd.sglang_plugin.request_sampling import filter_target_rows
from sglang_hsd.sglang_plugin.verify_outputs import (
    empty_chain_result,
    plain_round_tree,
    write_chain_result,
    write_tree_result,
)
from sglang_hsd.tree_draft import CHILD_SAMPLERS
from sglang_hsd.verify import ChainUniforms, TREE_METHODS, TreeUniforms, verify_chain, verify_tree
from sglang_hsd.verify.coupled import coupled_chain, coupled_tree, keyed_draw
from sglang_hsd.verify.window_round import target_round

if TYPE_CHECKING:
    from sglang_hsd.sglang_plugin.exit_level import ExitRound
    from sglang_hsd.sglang_plugin.tree_draft import DraftTree

logger = logging.getLogger(__name__)


@dataclass
class SeededKeys:
    """The keys of a seeded verify call's rows (``verify/coupled.py``).

    Fields:
        seed: int64 [bs], each request's stream seed (SGLang's ``sampling_seed``).
        position: int64 [bs, N], each verify node's position (SGLang's ``verify_input.positions``):
            the key of the row that draws the token after it, as SGLang's seeded sampler keys a
            decode row by its input token's position.
    """

    seed: torch.Tensor
    position: torch.Tensor

    def draws(self, target_probs: torch.Tensor) -> torch.Tensor:
        """int64 [bs, N]: the keyed draw of every row of ``target_probs`` (float [bs, N, V])."""
        if self.position.shape != target_probs.shape[:2]:
            raise RuntimeError(f"seeded verify: {list(self.position.shape)} node positions for "
                               f"target rows {list(target_probs.shape[:2])}")
        return keyed_draw(target_probs, self.seed.unsqueeze(1).expand_as(self.position), self.position)


@dataclass
class VerifyHookState:
    """What the verify hooks of one ``HSDWorker`` read; the worker builds it and installs the
    hooks bound to it (``install_verify_hooks``).

    Fields:
        config: the target level's chain verifier, read once when the worker was built.
        exit_round: the ``ExitRound`` the exit level's forward left for the chain sampler of the
            same ``HSDWorker.verify`` call; None outside such a call.
        hsd_calls / fallback_calls: chain-sampler calls that ran our verifier / SGLang's kernel
            (another algorithm is running); for tests and logs.
        tree: the round's sampled tree (``tree_draft.DraftTree``) during a verify call.
        sampling_info: the verified batch's ``SamplingBatchInfo`` during a verify call (its
            top-k, top-p and min-p shape the target rows, ``target_rows``); None outside one.
        keys: the rows' ``SeededKeys`` while ``eagle_sample`` verifies a seeded batch; None
            otherwise (the samplers then verify with the configured method).
    """

    config: PluginConfig
    exit_round: ExitRound | None = None
    hsd_calls: int = 0
    fallback_calls: int = 0
    tree: DraftTree | None = None
    sampling_info: object = None
    keys: SeededKeys | None = None

    @contextlib.contextmanager
    def verify_call(self, sampling_info, tree: DraftTree | None = None):
        """The scope of one worker verify call of a batch with ``sampling_info`` (SGLang's
        ``SamplingBatchInfo``): the exit round it leaves, the round's sampled tree
        (``tree_draft.DraftTree``: q and links in verify order; None when the tree was not
        sampled) and the batch's sampling parameters end with it (also when the call raises), so
        no later verify can see them."""
        self.exit_round = None
        self.tree = tree
        self.sampling_info = sampling_info
        try:
            yield self
        finally:
            self.exit_round = None
            self.tree = None
            self.sampling_info = None
            self.keys = None

    def target_rows(self, target_probs: torch.Tensor) -> torch.Tensor:
        """The law the non-speculative sampler draws from: ``target_probs`` (float [bs, N, V],
        softmax(logits / T), SGLang's renormalisations deferred) under the batch's top-k, top-p
        and min-p (``request_sampling.filter_target_rows``). Refuses outside a verify call, where
        the parameters are unknown."""
        if self.sampling_info is None:
            raise RuntimeError("HSD verify outside a worker verify call: the batch's sampling "
                               "parameters (top_k, top_p, min_p) are unknown, so the target rows "
                               "cannot honour them")
        return filter_target_rows(target_probs, self.sampling_info)

    @property
    def defers_renorm(self) -> bool:
        """True inside an HSD verify call: SGLang's top-k / top-p renormalisations pass the rows
        through and ``target_rows`` filters them (module docstring)."""
        return self.sampling_info is not None and hsd_is_active()


def install_verify_hooks(state: VerifyHookState) -> None:
    """Replace ``eagle_utils.chain_speculative_sampling_triton``, ``_verify_uses_greedy``,
    ``tree_speculative_sampling_target_only``, ``top_k_renorm_prob``, ``top_p_renorm_prob`` and
    ``eagle_worker_common.eagle_sample`` with hooks bound to ``state``. Replaces earlier hooks
    rather than stacking on them (each wraps SGLang's original), so the last worker built in a
    process owns them."""
    from sglang.srt.speculative import eagle_utils, eagle_worker_common

    eagle_worker_common.eagle_sample = make_verify_entry(
        _sglang_original(eagle_worker_common.eagle_sample), state)
    for name in ("top_k_renorm_prob", "top_p_renorm_prob"):
        setattr(eagle_utils, name, make_deferred_renorm(_sglang_original(getattr(eagle_utils, name)), state))
    eagle_utils.chain_speculative_sampling_triton = make_hsd_chain_sampling(
        _sglang_original(eagle_utils.chain_speculative_sampling_triton), state)
    eagle_utils._verify_uses_greedy = make_verify_uses_greedy(
        _sglang_original(eagle_utils._verify_uses_greedy), state)
    eagle_utils.tree_speculative_sampling_target_only = make_hsd_tree_sampling(
        _sglang_original(eagle_utils.tree_speculative_sampling_target_only), state)


def make_deferred_renorm(original, state: VerifyHookState):
    """``eagle_utils.top_k_renorm_prob`` / ``top_p_renorm_prob`` that return the rows unchanged
    inside an HSD verify call (``state.defers_renorm``; ``target_rows`` applies the joint filter
    instead) and call SGLang's ``original(probs, thresholds)`` everywhere else."""

    def deferred_renorm(probs, thresholds):
        if state.defers_renorm:
            return probs
        return original(probs, thresholds)

    deferred_renorm.__sglang_hsd_original__ = original
    return deferred_renorm


def make_verify_entry(original, state: VerifyHookState):
    """Replacement for ``eagle_worker_common.eagle_sample``. Inside an HSD verify call: a seeded
    batch leaves its rows' keys for the samplers (``state.keys``, for the call's duration); a batch
    with penalties has its verify logits penalised row by row along each row's path
    (``request_penalties``) and SGLang's ``original`` runs on a copy of the batch without its
    accumulated penalties. Everything else goes to ``original`` unchanged."""

    @functools.wraps(original)
    def eagle_sample(verify_input, batch, logits_output, *args, **kwargs):
        info = batch.sampling_info
        if batch.forward_mode.is_idle() or not state.defers_renorm:
            return original(verify_input, batch, logits_output, *args, **kwargs)
        if has_penalties(info):
            logits = logits_output.next_token_logits
            candidates = verify_input.draft_token.reshape(len(batch.seq_lens), -1)
            tree = state.tree  # a sampled tree's drafted links (SGLang's may attach filler nodes)
            links = ((tree.retrive_next_token, tree.retrive_next_sibling) if tree is not None else
                     (verify_input.retrieve_next_token, verify_input.retrieve_next_sibling))
            penalise_verify_logits(logits, candidates, *links,
                                   batch_penalties(batch.reqs, logits.shape[-1], logits.device, logits.dtype))
            unpenalised = copy.copy(info)
            unpenalised.acc_additive_penalties = unpenalised.acc_scaling_penalties = None
            batch = copy.copy(batch)
            batch.sampling_info = unpenalised
        if info.sampling_seed is not None:
            state.keys = SeededKeys(info.sampling_seed.to(torch.int64),
                                    verify_input.positions.to(torch.int64).view(len(batch.seq_lens), -1))
        try:
            return original(verify_input, batch, logits_output, *args, **kwargs)
        finally:
            state.keys = None

    eagle_sample.__sglang_hsd_original__ = original
    return eagle_sample


def _sglang_original(fn):
    return getattr(fn, "__sglang_hsd_original__", fn)


def hsd_is_active() -> bool:
    """True when the published server config runs ``--speculative-algorithm HSD``."""
    try:
        from sglang.srt.runtime_context import get_spec

        algorithm = get_spec().speculative_algorithm
    except Exception:
        return False
    return (algorithm or "").upper() == ALGORITHM_NAME


def make_hsd_chain_sampling(original, state: VerifyHookState):
    """Build the replacement for ``eagle_utils.chain_speculative_sampling_triton``."""

    @functools.wraps(original)
    def hsd_chain_sampling(
        predicts, accept_index, accept_token_num, candidates, retrive_index,
        retrive_next_token, retrive_next_sibling, uniform_samples,
        uniform_samples_for_final_sampling, target_probs, draft_probs, threshold_single,
        threshold_acc, deterministic, *, block_verification=False,
    ):
        if not hsd_is_active():
            state.fallback_calls += 1
            return original(
                predicts, accept_index, accept_token_num, candidates, retrive_index,
                retrive_next_token, retrive_next_sibling, uniform_samples,
                uniform_samples_for_final_sampling, target_probs, draft_probs,
                threshold_single, threshold_acc, deterministic,
                block_verification=block_verification,
            )
        state.hsd_calls += 1
        if state.hsd_calls == 1:  # whichever path the first call takes (seeded, exit, drafts)
            logger.info("sglang-hsd: verifying chains with verify_chain(method=%r)",
                        state.config.verify_method)
        target_probs = state.target_rows(target_probs)
        uniforms = ChainUniforms(accept=uniform_samples.float(),
                                 sample=uniform_samples_for_final_sampling.float())
        keyed = state.keys.draws(target_probs) if state.keys is not None else None
        if state.exit_round is not None:  # the exit level ran in this round: verify its chain
            result = _verify_exit_chain(state, target_probs, uniforms, keyed)
        elif keyed is not None:
            result = coupled_chain(candidates[:, 1:].to(torch.int64), keyed)
        else:
            result = _verify_drafts(state, candidates, draft_probs, target_probs, uniforms)
        write_chain_result(predicts, accept_index, accept_token_num, retrive_index, result)

    hsd_chain_sampling.__sglang_hsd_original__ = original
    return hsd_chain_sampling


def _verify_exit_chain(state: VerifyHookState, target_probs, uniforms: ChainUniforms,
                       keyed: torch.Tensor | None = None):
    """The target level of an exit round: ``target_round`` on the exit's chain (the coupled rule
    with ``keyed`` draws [bs, K + 1] of a seeded batch); the round's statistics go to the exit
    level that ran it."""
    exit_round = state.exit_round
    result, target_accepted = target_round(exit_round.proposal, target_probs, exit_round.method,
                                           uniforms, validate=state.config.validate, keyed=keyed)
    exit_round.verifier.record(exit_round, result, target_accepted)
    return result


def _verify_drafts(state: VerifyHookState, candidates, draft_probs, target_probs,
                   uniforms: ChainUniforms):
    """A two-level round: ``verify_chain`` on the drafts ``candidates[:, 1:]`` (column 0 is the
    root) with q ``draft_probs`` [bs, >= K, V] and SGLang's coins."""
    config = state.config
    num_draft = candidates.shape[1] - 1
    if num_draft == 0:  # --hsd-adaptive chose plain decoding: the token is drawn from p
        return empty_chain_result(target_probs[:, 0], uniforms.sample)
    return verify_chain(
        candidates[:, 1:].to(torch.int64),
        draft_probs[:, :num_draft],
        target_probs,
        method=config.verify_method,
        uniforms=ChainUniforms(accept=uniforms.accept[:, :num_draft], sample=uniforms.sample),
        validate=config.validate,
    )


def make_verify_uses_greedy(original, state: VerifyHookState):
    """Replacement for ``eagle_utils._verify_uses_greedy``: under HSD only an all-greedy batch
    takes the argmax path, on every device (SGLang forces argmax on CPU / XPU)."""

    @functools.wraps(original)
    def verify_uses_greedy(*, is_all_greedy, is_cpu, is_hip, is_xpu, use_rejection_sampling):
        if state.exit_round is not None:
            return False  # the exit round's chain is verified by hsd_chain_sampling, greedy or not
        if (use_rejection_sampling or state.config.is_tree) and hsd_is_active():
            return bool(is_all_greedy)
        return original(is_all_greedy=is_all_greedy, is_cpu=is_cpu, is_hip=is_hip,
                        is_xpu=is_xpu, use_rejection_sampling=use_rejection_sampling)

    verify_uses_greedy.__sglang_hsd_original__ = original
    return verify_uses_greedy


def make_hsd_tree_sampling(original, state: VerifyHookState):
    """Build the replacement for ``eagle_utils.tree_speculative_sampling_target_only`` (SGLang's
    tree sampler, reached by a non-greedy tree batch): under HSD, ``verify_tree`` with the
    configured tree method, SGLang's coins and the round's tree q; SGLang's kernel otherwise."""

    @functools.wraps(original)
    def hsd_tree_sampling(predicts, accept_index, accept_token_num, candidates, retrive_index,
                          retrive_next_token, retrive_next_sibling, uniform_samples,
                          uniform_samples_for_final_sampling, target_probs, draft_probs,
                          threshold_single=1.0, threshold_acc=1.0, deterministic=True):
        if not hsd_is_active():
            state.fallback_calls += 1
            return original(predicts, accept_index, accept_token_num, candidates, retrive_index,
                            retrive_next_token, retrive_next_sibling, uniform_samples,
                            uniform_samples_for_final_sampling, target_probs, draft_probs,
                            threshold_single, threshold_acc, deterministic)
        state.hsd_calls += 1
        method, tree = state.config.verify_method, state.tree
        if tree is None and candidates.shape[1] == 1:
            tree = plain_round_tree(draft_probs)
        if TREE_METHODS[method].reads_q and tree is None:
            raise RuntimeError(f"HSD tree verify ({method!r}) without the round's sampled tree")
        if state.hsd_calls == 1:
            logger.info("sglang-hsd: verifying trees with verify_tree(method=%r)", method)
        target_probs = state.target_rows(target_probs)
        if tree is not None:  # the drafted links: SGLang's builder may attach unreachable filler
            retrive_next_token, retrive_next_sibling = (tree.retrive_next_token,
                                                        tree.retrive_next_sibling)
        if state.keys is not None:
            result = coupled_tree(candidates.to(torch.int64), retrive_next_token, retrive_next_sibling,
                                  state.keys.draws(target_probs), max_depth=accept_index.shape[1] - 1)
            write_tree_result(predicts, accept_index, accept_token_num, retrive_index, result)
            return
        result = verify_tree(
            candidates.to(torch.int64), retrive_next_token, retrive_next_sibling,
            tree.draft_probs if tree is not None else None, target_probs, method=method,
            uniforms=TreeUniforms(accept=uniform_samples.float(),
                                  sample=uniform_samples_for_final_sampling.float()),
            validate=state.config.validate, draft_mode=CHILD_SAMPLERS[state.config.child_sampler].draft_mode,
            max_depth=accept_index.shape[1] - 1, num_kept=tree.num_kept if tree is not None else None)
        write_tree_result(predicts, accept_index, accept_token_num, retrive_index, result)

    hsd_tree_sampling.__sglang_hsd_original__ = original
    return hsd_tree_sampling
