"""Drafters and the target scorer of ``bench_verify.py``, with KV caches that follow a context.

Every object here keeps the token sequence its cache holds and, when asked about a new sequence,
keeps the longest common prefix and runs only the rest (a draft's tokens are dropped on the next
call the same way). One row, no batch: the benchmark walks prompts one round at a time, and the
per-token Python here is off any serving path.

Drafters (``propose(context, num_draft, params, generator)`` -> tokens int64 [K], q float [K, V]
over the target vocabulary, where q[j] is the exact law draft token j was sampled from):

* ``ExitDrafter``: the target's hidden state after ``layer`` layers -> a trained exit head or,
  without one, final norm + LM head (logit lens). transformers runs the whole target on each
  draft token, so the drafter's cache doubles as the scorer's (``ExitDrafter.lm``).
* ``ModelDrafter``: a separate model with the target's tokenizer.
* ``Eagle3Drafter``: an EAGLE-3 head reading the target's hidden states at its capture layers,
  fed as the runtime feeds it (``sglang_hsd/runtime/eagle3_drafter.py``): entries for committed
  positions read the target's fused aux hidden states, the first draft entry reads the target's
  features of the last committed position, later entries read the head's own previous output.
  Its q lives on the draft vocabulary and is scattered to target ids (``Eagle3Head.target_logits``).
"""

from __future__ import annotations

import torch

from sglang_hsd.runtime.eagle3 import Eagle3Head
from sglang_hsd.sampling import SamplingParams, logits_to_probs

# Head KV slots per context: prompts are capped well below this by ``bench_verify``.
EAGLE_MAX_ENTRIES = 4096


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class CachedLM:
    """A transformers causal LM with a ``DynamicCache`` that tracks one growing sequence.

    ``hidden_layers``: hidden states to keep per position (index L = output of the first L layers,
    0 = embeddings), stored for every cached position in ``hidden`` [n, len(hidden_layers), D].
    ``keep_logits``: keep the logits of positions already run (from ``logits_from`` on), so a
    drafter and the scorer can share one cache without running a position twice.
    """

    def __init__(self, hf, hidden_layers: tuple[int, ...] = (), keep_logits: bool = False) -> None:
        from transformers import DynamicCache

        self.hf = hf
        self.hidden_layers = tuple(hidden_layers)
        self.keep_logits = keep_logits
        self.cache = DynamicCache(config=hf.config)
        self.ids: list[int] = []
        self.hidden = torch.zeros(0, len(self.hidden_layers), hf.config.hidden_size)
        self.logits = torch.zeros(0, 0)  # [len(ids) - logits_from, V] when keep_logits
        self.logits_from = 1 << 62  # nothing stored yet

    @torch.inference_mode()
    def feed(self, ids: list[int], need_from: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Bring the cache to ``ids``; return outputs for positions ``need_from .. len(ids) - 1``.

        Returns:
            logits float [len(ids) - need_from, V] and hidden [len(ids) - need_from, H, D]
            (H = len(hidden_layers)).
        """
        if not 0 <= need_from < len(ids):
            raise ValueError(f"need_from must be in [0, {len(ids)}), got {need_from}")
        start = _common_prefix(self.ids, ids)
        stored = self.keep_logits and self.logits_from <= need_from
        if not stored:
            start = min(start, need_from)
        if start < len(self.ids):
            self.cache.crop(start)
            self.ids = self.ids[:start]
            self.hidden = self.hidden[:start]
            self.logits = self.logits[: max(0, start - self.logits_from)]
        if start < len(ids):
            first = start if stored else need_from  # first position whose logits are computed
            out = self.hf(input_ids=torch.tensor([ids[start:]]), past_key_values=self.cache, use_cache=True,
                          output_hidden_states=bool(self.hidden_layers), logits_to_keep=len(ids) - first)
            new_logits = out.logits[0].float()
            if self.hidden_layers:
                new = torch.stack([out.hidden_states[layer][0] for layer in self.hidden_layers], 1)
                self.hidden = torch.cat([self.hidden, new])
            self.ids = list(ids)
            if not self.keep_logits:
                return new_logits, self.hidden[need_from:]
            if stored and self.logits.shape[0] == first - self.logits_from:
                self.logits = torch.cat([self.logits, new_logits]) if self.logits.numel() else new_logits
            else:
                self.logits, self.logits_from = new_logits, first
        return self.logits[need_from - self.logits_from :], self.hidden[need_from:]


def _sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    return int(torch.multinomial(probs, 1, generator=generator))


class ExitDrafter:
    """Draft from the target's first ``layer`` layers (+ ``head``, or the logit lens)."""

    def __init__(self, hf, layer: int, head=None) -> None:
        if not 1 <= layer < hf.config.num_hidden_layers:
            raise ValueError(f"exit layer must be in [1, {hf.config.num_hidden_layers}), got {layer}")
        # The drafter runs the whole target on its draft tokens (transformers cannot stop at
        # layer L), so it shares its cache with the scorer: ``self.lm`` is the scorer too.
        self.lm = CachedLM(hf, hidden_layers=(layer,), keep_logits=True)
        self.head = head

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [T, D] -> logits [T, V]."""
        if self.head is not None:
            return self.head(hidden.unsqueeze(0))[0]
        return self.lm.hf.lm_head(self.lm.hf.model.norm(hidden))

    @torch.inference_mode()
    def propose(self, context, num_draft, params: SamplingParams, generator):
        draft, q_rows = [], []
        for _ in range(num_draft):
            ids = context + draft
            _, hidden = self.lm.feed(ids, len(ids) - 1)
            q_rows.append(logits_to_probs(self._logits(hidden[:, 0]).unsqueeze(0), params)[0, -1])
            draft.append(_sample(q_rows[-1], generator))
        return torch.tensor(draft), torch.stack(q_rows)


class ModelDrafter:
    """Draft from a separate causal LM (same tokenizer as the target)."""

    def __init__(self, hf) -> None:
        self.lm = CachedLM(hf)

    @torch.inference_mode()
    def propose(self, context, num_draft, params: SamplingParams, generator):
        draft, q_rows = [], []
        for _ in range(num_draft):
            ids = context + draft
            logits, _ = self.lm.feed(ids, len(ids) - 1)
            q_rows.append(logits_to_probs(logits.unsqueeze(0), params)[0, -1])
            draft.append(_sample(q_rows[-1], generator))
        return torch.tensor(draft), torch.stack(q_rows)


class Eagle3Drafter:
    """Draft with an EAGLE-3 head over ``target`` (a ``CachedLM`` built with the head's
    ``capture_layers`` as ``hidden_layers``, shared with the scorer so each target position runs
    once).

    Head entry e reads token ``seq[e + 1]`` and a hidden state for position e, and its output
    predicts position e + 2; ``self.seq`` is the committed sequence whose entries are cached.
    """

    def __init__(self, head: Eagle3Head, target: CachedLM) -> None:
        if tuple(head.capture_layers) != target.hidden_layers:
            raise ValueError(f"target must keep the head's capture layers {head.capture_layers}, "
                             f"keeps {target.hidden_layers}")
        self.head, self.target = head, target
        self.cache = head.new_cache(1, EAGLE_MAX_ENTRIES)
        self.seq: list[int] = []

    def _entries(self) -> int:
        return int(self.cache.lengths[0, 0])

    def _run(self, ids: list[int], hidden: torch.Tensor) -> torch.Tensor:
        """Append entries reading ``ids`` [T] with fed hidden [T, D]; returns outputs [T, D]."""
        if self._entries() + len(ids) > EAGLE_MAX_ENTRIES:
            raise ValueError(f"context too long for the EAGLE-3 bench cache ({EAGLE_MAX_ENTRIES} entries)")
        out = self.head.forward_cached(torch.tensor([ids]), hidden.unsqueeze(0), self.cache,
                                       torch.tensor([len(ids)]))
        return out[0]

    @torch.inference_mode()
    def propose(self, context, num_draft, params: SamplingParams, generator):
        n = len(context)
        if n < 2:
            raise ValueError("the EAGLE-3 drafter needs a context of at least 2 tokens")
        # The target's features for every committed position, the last one included.
        done = _common_prefix(self.target.ids, context)
        if done < n:
            self.target.feed(context, done)
        aux = self.target.hidden[:n].flatten(1)  # [n, 3 D]
        # Keep committed entries, but recompute entry n - 2: its output gives draft token 1.
        keep = min(_common_prefix(self.seq, context) - 1, n - 2)
        self.cache.truncate(torch.tensor([max(0, min(self._entries(), keep))]))
        start = self._entries()
        # Target-fed entries start .. n - 2 (committed), then entry n - 1 reading draft token 1.
        out = self._run(context[start + 1 : n], self.head.fuse(aux[start : n - 1]))[-1:]
        self.seq = list(context)
        draft, q_rows = [], []
        for j in range(num_draft):
            logits = self.head.target_logits(out[-1:])  # [1, V]
            q_rows.append(logits_to_probs(logits, params)[0])
            draft.append(_sample(q_rows[-1], generator))
            if j + 1 < num_draft:
                fed = self.head.fuse(aux[n - 1 : n]) if j == 0 else out[-1:]
                out = self._run([draft[-1]], fed)
        self.cache.truncate(torch.tensor([n - 1]))
        return torch.tensor(draft), torch.stack(q_rows)
