"""HSD's verifier inside SGLang's own verify entry point.

SGLang 0.5.23 verifies EAGLE drafts in ``eagle_utils.eagle_sample``. With rejection sampling on
(which HSD always turns on), a batch that is not all-greedy goes to the module-level name
``chain_speculative_sampling_triton`` with SGLang's tree tensors, its target probabilities
(temperature / top-k / top-p applied, [bs, K + 1, V]), the draft q [bs, K, V] and its coins.
We replace that name with ``hsd_chain_sampling`` (same signature, same in-place outputs) which
calls ``sglang_hsd.verify.verify_chain`` when the running algorithm is HSD and SGLang's kernel
otherwise, so a server started with ``--speculative-algorithm EAGLE3`` is untouched.

With an exit level (``exit_level.py``) the round's forward leaves a pending ``ExitRound``; the
replacement then verifies the exit's chain against the target (``window_round.target_round``), for
greedy batches too (one-hot rows, method ``greedy``).

All-greedy batches keep SGLang's argmax path (``verify_tree_greedy_func``). On CPU SGLang forces
that argmax path for every batch (``_verify_uses_greedy`` returns True for ``is_cpu``), which would
silently ignore temperature; for HSD we let sampled batches through.

Random draws: the coins are SGLang's (``_verify_coins``: per-request murmur hash of the sampling
seed when ``sampling_seed`` is set, ``torch.rand`` otherwise), used as our ``ChainUniforms``:
``coins[:, k]`` is the coin of draft position k + 1 and ``coins_for_final_sampling`` drives the
single residual / bonus draw. Under tensor parallelism ``eagle_sample`` broadcasts ``predict``,
``accept_index`` and ``num_correct_drafts`` from rank 0 right after this call, so every rank emits
rank 0's tokens by construction. (TP cannot be run on this CPU-only machine.)
"""

from __future__ import annotations

import functools
import logging

import torch

from sglang_hsd.sglang_plugin import exit_level
from sglang_hsd.sglang_plugin.config import ALGORITHM_NAME, PluginConfig
from sglang_hsd.verify.chain import verify_chain
from sglang_hsd.verify.common import ChainUniforms
from sglang_hsd.verify.window_round import target_round

logger = logging.getLogger(__name__)
# Counters for tests and logs (per process).
STATS = {"hsd_calls": 0, "fallback_calls": 0}


def hsd_is_active() -> bool:
    """True when the published server config runs ``--speculative-algorithm HSD``."""
    try:
        from sglang.srt.runtime_context import get_spec

        algorithm = get_spec().speculative_algorithm
    except Exception:
        return False
    return (algorithm or "").upper() == ALGORITHM_NAME


def write_chain_result(predicts, accept_index, accept_token_num, retrive_index, result) -> None:
    """Store a ``ChainVerifyResult`` in SGLang's verify outputs, as its chain kernel does.

    Args:
        predicts: int32 [bs * (K + 1)]; ``predicts[retrive_index[b, j]]`` receives the token that
            follows node j of request b (j = 0 is the root) for j <= num_accepted[b].
        accept_index: int32 [bs, >= K + 1]; global node indices of the root and accepted drafts,
            -1 after them.
        accept_token_num: int32 [bs]; accepted draft tokens (bonus excluded).
        retrive_index: int [bs, K + 1]; global node index of each chain slot.
        result: ``ChainVerifyResult`` with num_accepted [bs] and tokens [bs, K + 1].
    """
    width = result.tokens.shape[1]
    num_accepted = result.num_accepted.to(torch.int64)
    slot = torch.arange(width, device=num_accepted.device).unsqueeze(0)
    emitted = slot <= num_accepted.unsqueeze(1)
    chain_index = retrive_index[:, :width].to(torch.int64)
    accept_index[:, :width] = torch.where(emitted, chain_index, -1).to(accept_index.dtype)
    predicts[chain_index[emitted]] = result.tokens[emitted].to(predicts.dtype)
    accept_token_num.copy_(num_accepted.to(accept_token_num.dtype))


def make_hsd_chain_sampling(original, config_provider=PluginConfig.from_env):
    """Build the replacement for ``eagle_utils.chain_speculative_sampling_triton``."""

    @functools.wraps(original)
    def hsd_chain_sampling(
        predicts, accept_index, accept_token_num, candidates, retrive_index,
        retrive_next_token, retrive_next_sibling, uniform_samples,
        uniform_samples_for_final_sampling, target_probs, draft_probs, threshold_single,
        threshold_acc, deterministic, *, block_verification=False,
    ):
        if not hsd_is_active():
            STATS["fallback_calls"] += 1
            return original(
                predicts, accept_index, accept_token_num, candidates, retrive_index,
                retrive_next_token, retrive_next_sibling, uniform_samples,
                uniform_samples_for_final_sampling, target_probs, draft_probs,
                threshold_single, threshold_acc, deterministic,
                block_verification=block_verification,
            )
        STATS["hsd_calls"] += 1
        config = config_provider()
        exit_pending = exit_level.pending_round()
        if exit_pending is not None:  # the exit level ran in this round: verify its chain
            exit_level.clear_pending()
            result, target_accepted = target_round(
                exit_pending.proposal, target_probs, exit_pending.method,
                ChainUniforms(accept=uniform_samples.float(),
                              sample=uniform_samples_for_final_sampling.float()),
                validate=config.validate,
            )
            write_chain_result(predicts, accept_index, accept_token_num, retrive_index, result)
            exit_pending.verifier.record(exit_pending, result, target_accepted)
            return
        if STATS["hsd_calls"] == 1:
            logger.info("sglang-hsd: verifying chains with verify_chain(method=%r)",
                        config.verify_method)
        num_draft = candidates.shape[1] - 1
        result = verify_chain(
            candidates[:, 1:].to(torch.int64),
            draft_probs[:, :num_draft],
            target_probs,
            method=config.verify_method,
            uniforms=ChainUniforms(
                accept=uniform_samples[:, :num_draft].float(),
                sample=uniform_samples_for_final_sampling.float(),
            ),
            validate=config.validate,
        )
        write_chain_result(predicts, accept_index, accept_token_num, retrive_index, result)

    hsd_chain_sampling.__sglang_hsd_original__ = original
    return hsd_chain_sampling


def make_verify_uses_greedy(original):
    """Replacement for ``eagle_utils._verify_uses_greedy``: under HSD only an all-greedy batch
    takes the argmax path, on every device (SGLang forces argmax on CPU / XPU)."""

    @functools.wraps(original)
    def verify_uses_greedy(*, is_all_greedy, is_cpu, is_hip, is_xpu, use_rejection_sampling):
        if exit_level.pending_round() is not None:
            return False  # the exit round's chain is verified by hsd_chain_sampling, greedy or not
        if use_rejection_sampling and hsd_is_active():
            return bool(is_all_greedy)
        return original(is_all_greedy=is_all_greedy, is_cpu=is_cpu, is_hip=is_hip,
                        is_xpu=is_xpu, use_rejection_sampling=use_rejection_sampling)

    verify_uses_greedy.__sglang_hsd_original__ = original
    return verify_uses_greedy


def torch_row_argmax(x: torch.Tensor) -> torch.Tensor:
    """CPU stand-in for SGLang's Triton ``row_argmax`` (int64 [rows] argmax of float32 [rows, n])."""
    return x.argmax(dim=-1)
