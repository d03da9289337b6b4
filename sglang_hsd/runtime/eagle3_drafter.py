"""Level 0 of the engine as an EAGLE-3 head reading the target's hidden states.

The head's entry t reads token x_{t+1} and a hidden state for position t (``eagle3.py``); the
draft for sequence position s is sampled from entry s - 2's output. Before drafting,
``propose``

1. advances the target's capture groups (layers up to the deepest capture layer) over the
   *committed* tokens, which the target processes anyway, so the head sees real target features
   up to the last committed token;
2. drops head entries that were fed the head's own output at positions where target features
   now exist (EAGLE re-runs its head over accepted tokens the same way);
3. appends entries fed by the fused aux hidden states in one batched call, then entries fed by
   the head's own previous output one position at a time (drafting beyond the target).

Losslessness does not depend on any of this: the engine records the exact distribution each
draft token was sampled from as its q, whatever state produced it. ``truncate`` rolls the head
back with the target (an entry reading a rejected token is dropped).

Shapes: ``B`` rows, ``S = max_len`` positions, ``D`` hidden size, ``V`` target vocabulary.
"""

from __future__ import annotations

import torch

from sglang_hsd.runtime.eagle3 import Eagle3Head
from sglang_hsd.runtime.groups import LayerGroup, advance


class Eagle3Drafter:
    """Per-``generate`` state of an EAGLE-3 drafter.

    Fields:
        head: the ``Eagle3Head``.
        captures: the target groups whose outputs are the head's aux hidden states, in the head's
            ``capture_layers`` order.
        cache: the head's one-layer KV cache; ``cache.lengths[0]`` [B] = entries per row.
        out: float [B, S, D], the head's output at each entry.
        self_fed_from: int64 [B], first entry fed by the head's own output (S if none).
    """

    def __init__(self, head: Eagle3Head, captures: list[LayerGroup], batch_size: int, max_len: int) -> None:
        self.head = head
        self.captures = captures
        self.cache = head.new_cache(batch_size, max_len)
        weight = head.fc.weight
        self.out = torch.zeros(batch_size, max_len, head.fc.out_features, dtype=weight.dtype, device=weight.device)
        self.max_len = max_len
        self.self_fed_from = torch.full((batch_size,), max_len, dtype=torch.long, device=weight.device)

    def length(self) -> torch.Tensor:
        return self.cache.lengths[0]

    def truncate(self, seq_keep: torch.Tensor) -> None:
        """The sequence keeps positions < ``seq_keep[b]``: keep entries t with t + 1 < seq_keep."""
        keep = torch.minimum(self.length(), (seq_keep - 1).clamp_min(0))
        self.cache.truncate(keep)
        self.self_fed_from = torch.where(self.self_fed_from >= keep, self.max_len, self.self_fed_from)

    def propose(self, idx: torch.Tensor, tokens: torch.Tensor, seq_len: torch.Tensor, committed: torch.Tensor) -> torch.Tensor:
        """Logits of the next token of rows ``idx`` (float [R, V], before any sampling transform:
        the caller applies the request's parameters and reads the drafter's confidence from them).

        Args:
            tokens: int64 [B, S]; seq_len: int64 [B] tokens per row; committed: int64 [B],
                committed tokens per row (positions the target will keep processing).
        """
        for group in self.captures:  # one call does all of them when they share a cache chain
            advance(group, tokens, committed)
        rows = torch.zeros_like(seq_len, dtype=torch.bool)
        rows[idx] = True
        need = torch.where(rows, seq_len - 1, 0)  # entries 0 .. seq_len - 2
        aux_len = torch.stack([group.length() for group in self.captures]).amin(0)
        # Entries fed by the head itself where target features now exist: recompute them.
        stale = rows & (self.self_fed_from < torch.minimum(aux_len, need))
        if bool(stale.any()):
            self.truncate(torch.where(stale, self.self_fed_from + 1, self.max_len + 1))
        self._extend_from_target(tokens, torch.minimum(aux_len, need))
        self._extend_from_self(tokens, need)
        last = (seq_len[idx] - 2).clamp_min(0)  # a one-token prompt has no entry: any q is lossless
        return self.head.target_logits(self.out[idx, last].unsqueeze(1))[:, 0]

    def _extend_from_target(self, tokens: torch.Tensor, upto: torch.Tensor) -> None:
        length = self.length().clone()
        num_new = (upto - length).clamp_min(0)
        width = int(num_new.max())
        if width == 0:
            return
        positions = (length.unsqueeze(-1) + torch.arange(width, device=tokens.device)).clamp(max=self.max_len - 1)
        aux = torch.cat([_gather(group.hidden, positions) for group in self.captures], -1)
        ids = tokens.gather(1, (positions + 1).clamp(max=tokens.shape[1] - 1))
        out = self.head.forward_cached(ids, self.head.fuse(aux), self.cache, num_new)
        self._store(positions, num_new, out)

    def _extend_from_self(self, tokens: torch.Tensor, need: torch.Tensor) -> None:
        while True:
            length = self.length().clone()
            num_new = (need > length).long()
            if not bool(num_new.any()):
                return
            positions = length.unsqueeze(-1).clamp(max=self.max_len - 1)
            hidden = _gather(self.out, (positions - 1).clamp_min(0))
            ids = tokens.gather(1, (positions + 1).clamp(max=tokens.shape[1] - 1))
            self.self_fed_from = torch.where((num_new > 0) & (self.self_fed_from > length), length, self.self_fed_from)
            out = self.head.forward_cached(ids, hidden, self.cache, num_new)
            self._store(positions, num_new, out)

    def _store(self, positions: torch.Tensor, num_new: torch.Tensor, out: torch.Tensor) -> None:
        valid = torch.arange(positions.shape[1], device=positions.device).unsqueeze(0) < num_new.unsqueeze(-1)
        rows = torch.arange(positions.shape[0], device=positions.device).unsqueeze(-1).expand_as(positions)
        self.out[rows[valid], positions[valid]] = out[valid]


def _gather(hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """hidden [B, S, D] at positions int64 [B, T] -> [B, T, D]."""
    return hidden.gather(1, positions.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
