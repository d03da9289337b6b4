"""EAGLE-3 drafts after a provisional token, inside the round's verify window.

An exit sub-round after the first needs drafts that continue the exit level's provisional chain
c_1..c_n (positions s+1..s+n) rather than the drafts SGLang proposed. The EAGLE-3 draft model's
entry at position t reads token x_{t+1} and the hidden output of entry t - 1 (SGLang's
``draft_forward``: entry s reads d_1 with the hidden state ``draft_extend`` left for entry
s - 1). So drafting k tokens after c_n runs k one-token DECODE forwards of the draft model:
entry s+n-1 reads c_n with the output of entry s+n-2, and entry s+n-1+t reads e_t; each output
gives the next draft's distribution q.

What the first sub-round's drafting computed is reused: ``HSDDraftWorker.draft_forward`` records
the hidden output of every entry it ran (``DraftRecord``), and those entries read exactly the
accepted drafts c_1..c_a. Continuation entries write the draft KV of their window positions
(slots SGLang allocated for the round; verify and draft share slot indices), overwriting entries
that read rejected drafts; ``draft_extend`` rewrites the draft KV of every kept position after
the round, as in a stock round.

q is what SGLang's own draft sampler returns (``sample_draft_proposal``: softmax(logits / T);
greedy rows take the argmax), scattered to the target vocabulary, so each draft carries the
exact distribution it was drawn from. Seeded requests draw from SGLang's seeded stream keyed by
(a sub-round seed, the round's window start s, the draft's step in the sub-round): no other draw
of the request shares that key (``seeds.sub_round_seed``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_hsd.sglang_plugin.draft_probs import scatter_draft_probs
from sglang_hsd.sglang_plugin.forward_batches import draft_decode_batch
from sglang_hsd.sglang_plugin.seeds import CONTINUATION_SEED_TAG, sub_round_seed


@dataclass
class DraftRecord:
    """What one round's ``draft_forward`` left for continuations.

    Fields:
        batch: the draft-decode ``ForwardBatch`` (a template for one-token draft forwards).
        req_pool_indices: int [B]; seq_lens: int [B], committed lengths s.
        hidden: [B, W, D]; ``hidden[:, j]`` is the output of draft entry s + j - 1 (j = 0: the
            ``draft_extend`` state the round started from; j = 1..K-1: draft steps), filled
            further by continuations (W = K + 1 window positions).
    """

    batch: object
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    hidden: torch.Tensor


class DraftContinuation:
    """Draft after provisional tokens with the round's EAGLE-3 draft worker.

    Args:
        draft_worker: the ``HSDDraftWorker`` (its ``draft_runner``, ``hot_token_id``,
            ``hsd_identity_token_map``, ``req_to_token_pool``).
        target_vocab_size: V of the target (q is scattered to it).
    """

    def __init__(self, draft_worker, target_vocab_size: int) -> None:
        self.worker = draft_worker
        self.vocab_size = target_vocab_size
        self.record: DraftRecord | None = None

    def begin_round(self, forward_batch, first_hidden: torch.Tensor, num_steps: int) -> list:
        """Called by ``draft_forward`` before SGLang drafts; returns the list the step outputs
        (hidden [B, D] each) are appended to."""
        batch = forward_batch.batch_size
        width = num_steps + 1
        hidden = first_hidden.new_zeros(batch, width, first_hidden.shape[-1])
        hidden[:, 0] = first_hidden
        self.record = DraftRecord(forward_batch, forward_batch.req_pool_indices.clone(),
                                  forward_batch.seq_lens.clone(), hidden)
        return []

    def end_round(self, step_hidden: list) -> None:
        for step, value in enumerate(step_hidden):
            self.record.hidden[:, step + 1] = value

    @torch.no_grad()
    def draft(self, requests: torch.Tensor, last_tokens: torch.Tensor, last_index: torch.Tensor,
              counts: torch.Tensor, sampling_info, sub_round: int):
        """Draft ``counts[i]`` tokens after the provisional token ``last_tokens[i]`` at window
        index ``last_index[i]`` (position s + last_index) of request ``requests[i]``.

        Args:
            requests, last_tokens, last_index, counts: int64 [A]; last_index >= 1, counts >= 1,
                last_index + counts <= K.
            sampling_info: the round's ``SamplingBatchInfo`` (B requests).
            sub_round: index of the exit sub-round (domain of seeded draws).
        Returns:
            (int64 [A, k_max] drafts (padding -1 past counts), float [A, k_max, V] q or None
            for an all-greedy batch).
        """
        from sglang.srt.speculative.spec_utils import sample_draft_proposal

        record, worker = self.record, self.worker
        runner = worker.draft_runner
        greedy = bool(sampling_info.is_all_greedy)
        k_max = int(counts.max())
        tokens = torch.full((requests.shape[0], k_max), -1, dtype=torch.int64,
                            device=requests.device)
        q = None if greedy else torch.zeros(requests.shape[0], k_max, self.vocab_size,
                                            device=requests.device)
        current = last_tokens.to(torch.int64)
        req_to_token = worker.req_to_token_pool.req_to_token
        for step in range(k_max):
            live = (step < counts).nonzero().squeeze(-1)
            reqs = requests[live]
            entry = last_index[live] - 1 + step  # window index of the entry's position
            positions = record.seq_lens[reqs].to(torch.int64) + entry
            slots = req_to_token[record.req_pool_indices[reqs].to(torch.int64), positions]
            fb = draft_decode_batch(record.batch, reqs, current[live], positions,
                                    slots.to(torch.int64), record.hidden[reqs, entry])
            out = runner.forward(fb).logits_output
            record.hidden[reqs, entry + 1] = out.hidden_states
            logits = out.next_token_logits
            if greedy:
                ids = logits.argmax(dim=-1)
            else:
                seed = sampling_info.sampling_seed
                if seed is not None:
                    seed = sub_round_seed(seed[reqs], CONTINUATION_SEED_TAG, sub_round)
                probs, _, ids = sample_draft_proposal(
                    logits, sampling_info.temperatures[reqs], sampling_info.top_ks[reqs],
                    sampling_seed=seed, positions=record.seq_lens[reqs].to(torch.int64),
                    draft_step=step)
                ids = ids.squeeze(-1)
                if worker.hot_token_id is not None:
                    probs = scatter_draft_probs(probs, worker.hot_token_id, self.vocab_size,
                                                is_identity=worker.hsd_identity_token_map)
                q[live, step] = probs.to(q.dtype)
            if worker.hot_token_id is not None:
                ids = worker.hot_token_id[ids]
            tokens[live, step] = ids.to(torch.int64)
            current = current.clone()
            current[live] = ids.to(torch.int64)
        return tokens, q
