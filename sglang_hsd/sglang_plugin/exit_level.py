"""The early-exit verifier level inside SGLang's EAGLE-3 V2 verify step.

``HSDWorker.verify`` hands SGLang's own ``run_eagle_verify`` an ``ExitLevelTarget`` instead of
the target worker. Its ``forward_batch_generation`` (the target-verify forward) runs the round of
``verify/window_round.py``:

1. layers [0, L) over the verify batch (root + K drafts per request; SGLang's TARGET_VERIFY
   ``ForwardBatch``, attention backend and KV slots) -> exit logits -> ``exit_round``;
1b. with exit buffer N_i > 1, exit sub-rounds (``window_round.exit_sub_rounds``): the EAGLE-3 head
   drafts after the exit's last provisional token (``draft_continuation.py``), layers [0, L) run
   on that token and the new drafts (an EXTEND batch over those window positions, re-writing their
   KV slots), the exit verifies them; until N_i tokens are provisional or the window is full;
2. layers [L, N) over positions s..s+n-1 only (root + all but the last of the n provisional
   tokens), as an EXTEND ``ForwardBatch`` built from the verify batch (same KV slots, prefix =
   committed tokens), resuming from the stored stream rows;
3. it rewrites the verify input in place to the exit's chain (``draft_token``, ``draft_probs`` =
   the exit's rows) and leaves an ``ExitRound`` in the worker's ``VerifyHookState`` for the rest of
   the verify call; SGLang's ``eagle_sample`` then computes the target probabilities from the
   returned logits exactly as for a stock round and calls the chain sampler, where ``verify_hook``
   finds the round and runs ``target_round``.

KV: the verify batch's slots are SGLang's (allocated before verify, one per verify position);
layers [0, L) write all of them (sub-rounds re-write the positions they re-run), layers [L, N)
the first n per request. Only the accepted
prefix's slots are kept by SGLang's bookkeeping (``new_seq_lens``); the rest are reused next round
or freed with the request, exactly as in a stock round, so no slot is allocated or freed here.

Logits rows the target did not compute (positions past s + n - 1) are filled with the exit's
logits: they are valid distributions for SGLang's probability transform and are never emitted.
EAGLE-3 aux hidden states (the draft head's input) are assembled from both ranges; rows past
s + n - 1 are zero and are not read for accepted positions.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from sglang_hsd.sampling import logits_to_probs
from sglang_hsd.sglang_plugin.exit_stats import ExitLevelStats
from sglang_hsd.sglang_plugin.forward_batches import window_extend_batch
from sglang_hsd.sglang_plugin.layer_range import (
    StreamState,
    finish_stack,
    lm_head_logits,
    override_forward,
    run_layer_range,
)
from sglang_hsd.sglang_plugin.request_sampling import batch_filters, batch_params
from sglang_hsd.sglang_plugin.seeds import EXIT_COIN_SEED_TAG, sub_round_seed
from sglang_hsd.verify import ChainUniforms
from sglang_hsd.verify.window_round import ExitProposal, exit_round, exit_sub_rounds

logger = logging.getLogger(__name__)


@dataclass
class ExitRound:
    """A verify round whose exit level has run and whose target level is pending.

    Fields:
        proposal: the exit's chain (``ExitProposal``).
        method: the target level's chain rule.
        greedy: the whole batch is greedy (verify by argmax at both levels).
        verifier: the ``ExitLevelVerifier`` that ran the exit level (records the statistics).
        output: the round's ``LogitsProcessorOutput``; its ``customized_info`` carries the
            per-request level statistics into each request's ``meta_info``.
    """

    proposal: ExitProposal
    method: str
    greedy: bool
    verifier: "ExitLevelVerifier"
    output: object = None


def probs_like_sglang_verify(logits: torch.Tensor, sampling_info, width: int,
                             requests: torch.Tensor | None = None) -> torch.Tensor:
    """float [A * width, V] -> [A, width, V]: the requests' sampling distribution of ``logits``
    (``request_sampling``: temperature, top-k, top-p and min-p, the law of the target rows HSD
    verifies against). ``requests``: int64 [A], which of the batch's requests the rows belong to
    (default: all of them, in order)."""
    params = batch_params(sampling_info, repeats=width, requests=requests)
    probs = logits_to_probs(logits, params, batch_filters(sampling_info))
    return probs.reshape(-1, width, probs.shape[-1])


def exit_uniforms(sampling_seed: torch.Tensor | None, seq_lens: torch.Tensor,
                  num_draft: int, sub_round: int = 0) -> ChainUniforms:
    """Coins of the exit level, independent of the target level's (SGLang's ``_verify_coins``).

    Seeded requests hash a domain-separated seed (``sub_round_seed``) with the window start
    ``seq_lens`` the way SGLang's verify does, so a seeded request is reproducible; unseeded ones
    draw from torch's generator.
    """
    batch = seq_lens.shape[0]
    if sampling_seed is None:
        return ChainUniforms(torch.rand(batch, num_draft, device=seq_lens.device),
                             torch.rand(batch, device=seq_lens.device))
    from sglang.srt.speculative.eagle_utils import _seeded_verify_coins

    coins, final = _seeded_verify_coins(
        sampling_seed=sub_round_seed(sampling_seed, EXIT_COIN_SEED_TAG, sub_round),
        seq_lens=seq_lens, draft_token_num=num_draft, device=seq_lens.device)
    return ChainUniforms(coins, final)


def finish_limits(reqs, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Per request: tokens it may still emit (int64 [B]) and the tokens that would finish it
    (int64 [B, S], -1 padding; none with ``ignore_eos``), as SGLang's ``Req`` checks them."""
    remaining, stops = [], []
    for req in reqs:
        params = req.sampling_params
        budget = params.max_new_tokens
        remaining.append(2**31 if budget is None else max(budget - len(req.output_ids), 0))
        ids = set()
        if not params.ignore_eos:
            ids |= set(params.stop_token_ids or ()) | set(req.eos_token_ids or ())
            tokenizer = getattr(req, "tokenizer", None)
            if tokenizer is not None:
                if tokenizer.eos_token_id is not None:
                    ids.add(tokenizer.eos_token_id)
                ids |= set(getattr(tokenizer, "additional_stop_token_ids", None) or ())
        stops.append(sorted(ids))
    width = max([len(s) for s in stops] + [1])
    stop_ids = torch.full((len(reqs), width), -1, dtype=torch.int64)
    for row, ids in enumerate(stops):
        stop_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.int64)
    return torch.tensor(remaining, dtype=torch.int64, device=device), stop_ids.to(device)


class ExitLevelVerifier:
    """Runs the exit level of every verify round of one ``HSDWorker``.

    Args:
        target_worker: SGLang's target ``TpModelWorker``.
        exit_layer: L, 1 <= L < N.
        head: ``ExitHead`` at layer L.
        exit_method / target_method: chain rules of the two levels ("hsd" or "tokenwise").
        check_split: also run SGLang's own full verify forward each round and record the largest
            difference of the target logits (a self-test; doubles the target cost).
        buffer: N_i; above 1 the worker sets ``drafter`` (a ``DraftContinuation``) for the exit
            sub-rounds after the first.
    """

    def __init__(self, target_worker, exit_layer: int, head, exit_method: str,
                 target_method: str, check_split: bool = False, validate: bool = False,
                 buffer: int = 1) -> None:
        self.target_worker = target_worker
        self.model_runner = target_worker.model_runner
        self.model = self.model_runner.model
        self.num_layers = len(self.model.model.layers)
        self.exit_layer = exit_layer
        self.head = head
        self.exit_method = exit_method
        self.target_method = target_method
        self.check_split = check_split
        self.validate = validate
        self.buffer = buffer
        self.drafter = None
        self.vocab_size = self.model_runner.model_config.vocab_size
        self.stats = ExitLevelStats()
        self.max_split_logit_diff = 0.0

    def _run(self, forward_batch, forward):
        with override_forward(self.model, forward):
            return self.model_runner.forward(forward_batch).logits_output

    def _lower(self, input_ids, positions, fb, **_):
        return run_layer_range(self.model, positions, fb, 0, self.exit_layer, input_ids=input_ids)

    @staticmethod
    def _exit_probs(exit_logits, sampling_info, width, greedy, requests=None):
        """Exit rows [A, W, V] of window rows [A * W, V]: the logits themselves for an all-greedy
        batch (verified by argmax), else the target's sampling transforms applied."""
        if greedy:
            return exit_logits.reshape(-1, width, exit_logits.shape[-1])
        return probs_like_sglang_verify(exit_logits, sampling_info, width, requests)

    def forward_verify(self, verify_batch, verify_input, sampling_info, reqs=None):
        """Both levels' forwards for one TARGET_VERIFY batch; returns (GenerationBatchResult,
        the ``ExitRound`` whose target level the chain sampler runs). ``reqs``: the batch's SGLang
        ``Req`` objects (token budgets and stop tokens end exit sub-rounds early; None: no early
        end)."""
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput
        from sglang.srt.managers.utils import GenerationBatchResult

        batch = verify_batch.batch_size
        width = verify_input.draft_token_num  # K + 1
        num_draft = width - 1
        L, N = self.exit_layer, self.num_layers

        clock = time.perf_counter()
        low: StreamState = self._run(verify_batch, self._lower)
        exit_logits = self.head(low.hidden())  # [B * W, V]
        clock = self._lap("lower_forward", clock)
        greedy = bool(sampling_info.is_all_greedy)
        candidates = verify_input.draft_token.reshape(batch, width)
        exit_probs = self._exit_probs(exit_logits, sampling_info, width, greedy)
        q = None if greedy else verify_input.draft_probs[:, :num_draft]
        method = "greedy" if greedy else self.exit_method
        proposal = exit_round(candidates[:, 1:].to(torch.int64), q, exit_probs, method,
                              exit_uniforms(sampling_info.sampling_seed, verify_batch.seq_lens,
                                            num_draft),
                              validate=self.validate)
        clock = self._lap("exit_verify", clock)
        window_tokens = verify_batch.input_ids
        if self.buffer > 1:
            proposal, window_tokens = self._more_sub_rounds(
                verify_batch, candidates, sampling_info, low, exit_logits, proposal, method, reqs)
            clock = time.perf_counter()

        upper_batch, rows = window_extend_batch(
            verify_batch, torch.arange(batch, device=candidates.device),
            torch.zeros_like(proposal.chain_len), proposal.chain_len)

        def upper(input_ids, positions, fb, **_):
            state = run_layer_range(self.model, positions, fb, L, N, state=low.select(rows))
            return finish_stack(self.model, state, fb), state.aux

        normed, upper_aux = self._run(upper_batch, upper)
        logits = exit_logits.clone()
        logits[rows] = lm_head_logits(self.model, normed, self.vocab_size)
        self._lap("upper_forward", clock)
        if self.check_split:
            self._check_against_full_forward(verify_batch, window_tokens, logits, rows)

        # The target now verifies the exit's chain: root, c_1..c_n, then padding.
        chain = proposal.chain_tokens.clamp_min(0)  # padding past the chain: token 0, unread
        candidates[:, 1:] = chain[:, :num_draft].to(candidates.dtype)
        if greedy:  # SGLang's sampling path needs a q; the exit's rows are the target's q
            proposal.chain_probs = probs_like_sglang_verify(exit_logits, sampling_info, width)
        verify_input.draft_probs = proposal.chain_probs[:, :num_draft]
        hidden = self._aux_hidden(low, upper_aux, rows, batch * width)
        output = LogitsProcessorOutput(next_token_logits=logits, hidden_states=hidden)
        round_ = ExitRound(proposal, "greedy" if greedy else self.target_method, greedy, self,
                           output)
        return GenerationBatchResult(logits_output=output, can_run_cuda_graph=False), round_

    def _more_sub_rounds(self, verify_batch, candidates, sampling_info, low: StreamState,
                         exit_logits, first: ExitProposal, method: str, reqs=None):
        """Exit sub-rounds after the first (``window_round.exit_sub_rounds``) with SGLang's draft
        model and layers [0, L) doing the work.

        Updates ``low`` and ``exit_logits`` (rows [B * W, V]) in place at the window rows it
        re-runs. Returns the round's whole ``ExitProposal`` (chain of n tokens per request) and
        the window's tokens as the last forwards saw them ([B * W]; positions s..s+n hold r and
        the chain).
        """
        batch, width = candidates.shape
        greedy = method == "greedy"
        tokens = candidates.to(torch.int64).flatten().clone()  # window row b * W + j: position s + j
        seed = sampling_info.sampling_seed

        def draft(reqs, last_token, last, counts, sub_round):
            clock = time.perf_counter()
            out = self.drafter.draft(reqs, last_token, last, counts, sampling_info, sub_round)
            self._lap("draft_continuation", clock)
            return out

        def exit_rows(reqs, last, run_tokens, counts):
            clock = time.perf_counter()
            span = torch.arange(run_tokens.shape[1], device=reqs.device).unsqueeze(0)
            in_run = span <= counts.unsqueeze(1)
            tokens[(reqs.unsqueeze(1) * width + last.unsqueeze(1) + span)[in_run]] = run_tokens[in_run]
            fb, rows = window_extend_batch(verify_batch, reqs, last, counts + 1, input_ids=tokens)
            part = self._run(fb, self._lower)
            low.overwrite(rows, part)
            exit_logits[rows] = self.head(part.hidden())
            window_logits = exit_logits.view(batch, width, -1)[reqs].flatten(0, 1)
            table = self._exit_probs(window_logits, sampling_info, width, greedy, reqs)
            self._lap("lower_forward", clock)
            return table

        def uniforms(reqs, sub_round, num_draft):
            # Columns of the whole window, cut to this sub-round's width: a request's coins must
            # not depend on which other requests share its batch (seeded reproducibility).
            coins = exit_uniforms(None if seed is None else seed[reqs], verify_batch.seq_lens[reqs],
                                  width - 1, sub_round)
            return ChainUniforms(coins.accept[:, :num_draft], coins.sample)

        remaining, stop_ids = finish_limits(reqs, candidates.device) if reqs else (None, None)
        proposal = exit_sub_rounds(first, self.buffer, method, draft, exit_rows, uniforms,
                                   validate=self.validate, remaining=remaining, stop_ids=stop_ids)
        return proposal, tokens.to(verify_batch.input_ids.dtype)

    def _lap(self, name: str, start: float) -> float:
        now = time.perf_counter()
        self.stats.seconds[name] = self.stats.seconds.get(name, 0.0) + now - start
        return now

    def _aux_hidden(self, low: StreamState, upper_aux: dict, rows, total: int):
        """EAGLE-3 draft input [B * W, n_aux * D] (None without captures), in layer order."""
        layers = sorted(set(low.aux) | set(upper_aux))
        if not layers:
            return None
        parts = []
        for layer in layers:
            if layer in low.aux:
                parts.append(low.aux[layer])
            else:
                full = upper_aux[layer].new_zeros(total, upper_aux[layer].shape[-1])
                full[rows] = upper_aux[layer]
                parts.append(full)
        return torch.cat(parts, dim=-1)

    def _check_against_full_forward(self, verify_batch, window_tokens, logits, rows) -> None:
        # SGLang's one-pass verify forward over the window as the split forwards last saw it (it
        # rewrites the window's KV slots with the same values, up to rounding).
        original = verify_batch.input_ids
        verify_batch.input_ids = window_tokens
        try:
            out = self.model_runner.forward(verify_batch).logits_output
        finally:
            verify_batch.input_ids = original
        diff = float((out.next_token_logits[rows].float() - logits[rows]).abs().max())
        self.max_split_logit_diff = max(self.max_split_logit_diff, diff)
        logger.info("sglang-hsd: split forward check: max |logit diff| %.3g (worst so far %.3g)",
                    diff, self.max_split_logit_diff)

    def record(self, round_: ExitRound, result, target_accepted) -> None:
        """Add a verified round to the statistics and to each request's ``meta_info``
        (``hsd_exit_accepted``: drafts the exit accepted, ``hsd_exit_sub_rounds``: the same per
        exit sub-round, ``hsd_target_accepted``: chain tokens the target accepted; one entry per
        round)."""
        proposal = round_.proposal
        num_draft = proposal.chain_tokens.shape[1] - 1
        self.stats.add_round(num_draft, self.exit_layer, self.num_layers, proposal, result,
                             target_accepted)
        if round_.output is not None:
            sub_rounds = [[a for a in row if a >= 0] for row in proposal.sub_accepted.tolist()]
            round_.output.customized_info = {
                "hsd_exit_accepted": proposal.exit_accepted.tolist(),
                "hsd_exit_sub_rounds": sub_rounds,
                "hsd_target_accepted": target_accepted.tolist(),
            }


class ExitLevelTarget:
    """Stands in for the target worker inside ``run_eagle_verify`` for one round: the verify
    forward goes to ``ExitLevelVerifier`` and leaves its ``ExitRound`` in ``hook_state`` (the
    worker's ``VerifyHookState``) for the chain sampler; everything else is the real worker's."""

    def __init__(self, target_worker, verifier: ExitLevelVerifier, hook_state, verify_input,
                 sampling_info, reqs=None):
        self._inner = target_worker
        self._verifier = verifier
        self._hook_state = hook_state
        self._verify_input = verify_input
        self._sampling_info = sampling_info
        self._reqs = reqs

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def forward_batch_generation(self, batch=None, forward_batch=None, pp_proxy_tensors=None,
                                 is_verify=False, **kwargs):
        if (not is_verify or forward_batch is None or forward_batch.forward_mode.is_idle()
                or pp_proxy_tensors is not None):
            return self._inner.forward_batch_generation(
                batch, forward_batch, pp_proxy_tensors=pp_proxy_tensors, is_verify=is_verify,
                **kwargs)
        result, exit_round = self._verifier.forward_verify(
            forward_batch, self._verify_input, self._sampling_info, self._reqs)
        self._hook_state.exit_round = exit_round
        return result
