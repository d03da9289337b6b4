"""Frequency, presence and repetition penalties and min_new_tokens on a verify round's rows, exactly
as the server without speculation applies them at each row's position.

Plain decoding penalises the logits of step t with the output generated so far: frequency
subtracts ``frequency_penalty`` times each token's count, presence subtracts ``presence_penalty``
once for every token seen, repetition divides a seen token's positive logit by
``repetition_penalty`` and multiplies a negative one by it, and ``min_new_tokens`` forbids the stop
tokens while the output is shorter than that (SGLang's penalizers: the additive ones first, then
the scaling one; prompt tokens do not count). A verify round scores N rows at once: row j is the
distribution of the token after node j of the draft, whose output so far is the committed output
**plus the drafted tokens on the path from the root to node j**. SGLang's speculative verify
penalises every row of a request with one committed state (and that state counts only the last
token of each round): ``eagle_utils.eagle_sample`` calls it "a relaxed version of penalties", and
it changes greedy text (``frequency_penalty`` 1.0 on a code prompt). ``penalise_rows`` gives each
row its own path, so the verified law is the non-speculative one.

Vectorised over requests and rows, and sparse over the vocabulary: a penalty only touches tokens
already seen or drafted (and the stop tokens), so ``penalise_rows`` gathers those ids from the rows,
penalises them with their counts (the committed output's, plus the tree's ancestor mask times
the drafts) and scatters them back; its cost grows with the output length, not with V.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch

from sglang_hsd.verify.tree.layout import parents_from_links
from sglang_hsd.verify.tree.mask import tree_attention_mask


@dataclass
class RequestPenalties:
    """The penalties of a batch of requests and the output each has committed, sparse: a penalty
    touches only tokens already seen (and the stop tokens), so rows are penalised on those ids
    only, never on the whole vocabulary.

    Fields (B requests; M0 distinct output tokens and S stop tokens at most per request; -1 pads):
        frequency: float [B], subtracted once per occurrence (0: off).
        presence: float [B], subtracted once for every token seen (0: off).
        repetition: float [B] > 0, scaling of seen tokens' logits (1: off).
        min_new_tokens: int64 [B], stop tokens forbidden while the output is shorter (0: off).
        seen_ids: int64 [B, M0], the distinct tokens of the committed output.
        seen_counts: float [B, M0], how often each occurs there.
        stop_ids: int64 [B, S], the tokens ``min_new_tokens`` forbids.
        output_len: int64 [B], committed output tokens.
    """

    frequency: torch.Tensor
    presence: torch.Tensor
    repetition: torch.Tensor
    min_new_tokens: torch.Tensor
    seen_ids: torch.Tensor
    seen_counts: torch.Tensor
    stop_ids: torch.Tensor
    output_len: torch.Tensor

    @classmethod
    def build(cls, outputs: list[list[int]], vocab_size: int, *, frequency: list[float],
              presence: list[float], repetition: list[float], min_new_tokens: list[int],
              stop_tokens: list[set[int]], device: torch.device | str = "cpu",
              dtype: torch.dtype = torch.float32) -> "RequestPenalties":
        """From per-request Python values: ``outputs[b]`` the committed output token ids of request
        b, ``stop_tokens[b]`` the ids ``min_new_tokens[b]`` forbids; float fields in ``dtype``
        (the logits'). Raises ValueError naming the field for a token id outside [0, vocab_size)
        or a repetition penalty <= 0."""
        if any(r <= 0 for r in repetition):
            raise ValueError(f"repetition_penalty must be > 0, got {repetition}")
        ids = [token for tokens in (*outputs, *stop_tokens) for token in tokens]
        if ids and not 0 <= min(ids) <= max(ids) < vocab_size:
            raise ValueError(f"output / stop token ids must be in [0, {vocab_size}), got {min(ids)}..{max(ids)}")
        seen = [Counter(tokens) for tokens in outputs]
        seen_ids = _padded([list(counter) for counter in seen], torch.int64, -1)
        seen_counts = _padded([list(counter.values()) for counter in seen], dtype, 0)
        floats = lambda values: torch.tensor(values, dtype=dtype, device=device)  # noqa: E731
        return cls(floats(frequency), floats(presence), floats(repetition),
                   torch.tensor(min_new_tokens, dtype=torch.int64, device=device), seen_ids.to(device),
                   seen_counts.to(device), _padded([sorted(stop) for stop in stop_tokens], torch.int64, -1).to(device),
                   torch.tensor([len(t) for t in outputs], dtype=torch.int64, device=device))


def _padded(rows: list[list], dtype: torch.dtype, pad) -> torch.Tensor:
    """[len(rows), max(1, longest)] tensor of ``rows`` right-padded with ``pad``."""
    out = torch.full((len(rows), max([1, *map(len, rows)])), pad, dtype=dtype)
    for b, row in enumerate(rows):
        out[b, :len(row)] = torch.tensor(row, dtype=dtype)
    return out


def tree_paths(next_token: torch.Tensor, next_sibling: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Which drafted nodes lie on the path from the root to each node of a draft tree.

    Args:
        next_token / next_sibling: int [B, N], SGLang's first-child / next-sibling links (-1 none;
            a chain is the tree whose node n's first child is n + 1).
    Returns:
        on_path bool [B, N, N - 1] (``on_path[b, j, i]``: drafted node i + 1 is node j or one of
        its ancestors; the root, committed already, is not a drafted node) and depth int64 [B, N]
        (drafted tokens on the path: 0 for the root). Nodes no link reaches get empty paths.
    """
    parents = parents_from_links(next_token.long(), next_sibling.long())
    on_path = tree_attention_mask(parents)[..., 1:]
    return on_path, on_path.sum(-1)


def penalise_rows(logits: torch.Tensor, penalties: RequestPenalties, tokens: torch.Tensor,
                  next_token: torch.Tensor, next_sibling: torch.Tensor, *, inplace: bool = False) -> torch.Tensor:
    """Each row's logits penalised with its own output so far: the committed output plus its path.

    Works on the ids a penalty can touch (the committed output's, the drafts', the stop tokens),
    [B, N, M] with M = M0 + N - 1 + S, gathered from the rows and scattered back; their counts
    and stop flags come from [B, V + 1] tables.

    Args:
        logits: float [B, N, V], the target's raw logits of the round's N rows per request.
        penalties: the batch's ``RequestPenalties``.
        tokens: int [B, N], the round's node tokens (column 0 the root).
        next_token / next_sibling: int [B, N], the tree's links (``tree_paths``).
        inplace: write into ``logits`` (the server's verify logits) instead of a copy (a copy of
            [B, N, V] is most of the cost at batch 16).
    Returns:
        float [B, N, V] with the dtype of ``logits``: additive penalties (frequency, presence,
        min_new_tokens) first, then the repetition scaling, as SGLang's non-speculative sampler.
    """
    batch, width, vocab = logits.shape
    on_path, depth = tree_paths(next_token, next_sibling)
    drafted = tokens[:, 1:].long()
    ids = torch.cat([penalties.seen_ids, drafted, penalties.stop_ids], 1)  # [B, M]
    # Pads take the root's id; every entry's values are computed from its id alone, so an id
    # listed twice is written twice with the same value.
    ids = torch.where(ids >= 0, ids, tokens[:, :1].long())
    # The committed counts and the stop flags of the listed ids, read through [B, V + 1] tables
    # (column V takes the pads): linear in the output length, where comparing every listed id
    # with every seen one would be quadratic.
    committed = _table(penalties.seen_ids, penalties.seen_counts.to(logits.dtype), vocab).gather(1, ids)
    stops = penalties.stop_ids.ge(0).to(logits.dtype)
    is_stop = _table(penalties.stop_ids, stops, vocab).gather(1, ids) > 0  # [B, M]
    on_drafted = (drafted.unsqueeze(1) == ids.unsqueeze(2)).to(logits.dtype)  # [B, M, N - 1]
    counts = committed.unsqueeze(1) + torch.bmm(on_path.to(logits.dtype), on_drafted.transpose(1, 2))
    index = ids.unsqueeze(1).expand(batch, width, ids.shape[1])
    values = _penalised(logits.gather(2, index), counts, penalties, depth, is_stop)
    return logits.scatter_(2, index, values) if inplace else logits.scatter(2, index, values)


def _table(ids: torch.Tensor, values: torch.Tensor, vocab: int) -> torch.Tensor:
    """float [B, V + 1]: ``values`` [B, K] summed at ``ids`` [B, K] (-1 pads go to column V)."""
    table = values.new_zeros(ids.shape[0], vocab + 1)
    return table.scatter_add_(1, torch.where(ids >= 0, ids, vocab), values)


def _penalised(values: torch.Tensor, counts: torch.Tensor, penalties: RequestPenalties,
               depth: torch.Tensor, is_stop: torch.Tensor) -> torch.Tensor:
    """The penalised logits ``values`` [B, N, M] of tokens seen ``counts`` [B, N, M] times."""
    seen = counts > 0
    per_row = lambda field: field.view(-1, 1, 1).to(values.dtype)  # noqa: E731
    # One additive term added to the logits, summed in SGLang's order (frequency, min_new_tokens,
    # presence), so the rows round as the non-speculative sampler's do.
    additive = -(per_row(penalties.frequency) * counts)
    too_short = (penalties.output_len.unsqueeze(1) + depth) < penalties.min_new_tokens.unsqueeze(1)
    additive = additive.masked_fill(too_short.unsqueeze(-1) & is_stop.unsqueeze(1), float("-inf"))
    out = values + (additive - per_row(penalties.presence) * seen)
    scale = torch.where(seen, per_row(penalties.repetition), 1.0)
    return torch.where(out < 0, out * scale, out / scale)
