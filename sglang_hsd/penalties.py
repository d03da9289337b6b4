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

Vectorised over requests, rows and vocabulary: the path counts are one scatter-add of the draft
tokens through the tree's ancestor mask ([B, N, V] floats; only for batches with a penalty).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_hsd.verify.tree.layout import parents_from_links
from sglang_hsd.verify.tree.mask import tree_attention_mask


@dataclass
class RequestPenalties:
    """The penalties of a batch of requests and the output each has committed.

    Fields (B requests, vocabulary V):
        frequency: float [B], subtracted once per occurrence (0: off).
        presence: float [B], subtracted once for every token seen (0: off).
        repetition: float [B] > 0, scaling of seen tokens' logits (1: off).
        min_new_tokens: int64 [B], stop tokens forbidden while the output is shorter (0: off).
        stop_tokens: bool [B, V], the tokens ``min_new_tokens`` forbids.
        output_counts: float [B, V], occurrences of each token in the committed output.
        output_len: int64 [B], committed output tokens.
    """

    frequency: torch.Tensor
    presence: torch.Tensor
    repetition: torch.Tensor
    min_new_tokens: torch.Tensor
    stop_tokens: torch.Tensor
    output_counts: torch.Tensor
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
        counts = torch.zeros(len(outputs), vocab_size, dtype=dtype)
        stops = torch.zeros(len(outputs), vocab_size, dtype=torch.bool)
        for b, (tokens, stop) in enumerate(zip(outputs, stop_tokens)):
            counts[b].index_add_(0, torch.tensor(tokens, dtype=torch.int64), torch.ones(len(tokens), dtype=dtype))
            stops[b, list(stop)] = True
        return cls(torch.tensor(frequency, dtype=dtype, device=device),
                   torch.tensor(presence, dtype=dtype, device=device),
                   torch.tensor(repetition, dtype=dtype, device=device),
                   torch.tensor(min_new_tokens, dtype=torch.int64, device=device),
                   stops.to(device), counts.to(device),
                   torch.tensor([len(t) for t in outputs], dtype=torch.int64, device=device))


def path_token_counts(tokens: torch.Tensor, next_token: torch.Tensor, next_sibling: torch.Tensor,
                      vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Occurrences of each token on the path from the root to every node of a draft tree.

    Args:
        tokens: int64 [B, N], node tokens (column 0 the root, which is committed output already).
        next_token / next_sibling: int [B, N], SGLang's first-child / next-sibling links (-1 none;
            a chain is the tree whose node n's first child is n + 1).
        vocab_size: V.
    Returns:
        counts float32 [B, N, V] (the root's token not counted) and depth int64 [B, N] (drafted
        tokens on the path: 0 for the root). Nodes no link reaches get empty paths.
    """
    parents = parents_from_links(next_token.long(), next_sibling.long())
    on_path = tree_attention_mask(parents)[..., 1:]  # [B, N, N - 1]: drafted ancestors-or-self
    batch, num_nodes = tokens.shape
    drafted = tokens[:, 1:].long().unsqueeze(1).expand(batch, num_nodes, num_nodes - 1)
    counts = torch.zeros(batch, num_nodes, vocab_size, device=tokens.device)
    counts.scatter_add_(2, drafted, on_path.float())
    return counts, on_path.sum(-1)


def penalise_rows(logits: torch.Tensor, penalties: RequestPenalties, path_counts: torch.Tensor,
                  depth: torch.Tensor) -> torch.Tensor:
    """Each row's logits penalised with its own output so far: the committed output plus its path.

    Args:
        logits: float [B, N, V], the target's raw logits of the round's N rows per request.
        penalties: the batch's ``RequestPenalties``.
        path_counts / depth: ``path_token_counts`` of the round's tree.
    Returns:
        float [B, N, V] with the dtype of ``logits``: additive penalties (frequency, presence,
        min_new_tokens) first, then the repetition scaling, as SGLang's non-speculative sampler.
    """
    counts = penalties.output_counts.unsqueeze(1) + path_counts  # [B, N, V]
    seen = counts > 0
    per_row = lambda values: values.view(-1, 1, 1).to(logits.dtype)  # noqa: E731
    # One additive term added to the logits, summed in SGLang's order (frequency, min_new_tokens,
    # presence), so the rows round as the non-speculative sampler's do.
    additive = -(per_row(penalties.frequency) * counts)
    too_short = (penalties.output_len.unsqueeze(1) + depth) < penalties.min_new_tokens.unsqueeze(1)
    additive = additive.masked_fill(too_short.unsqueeze(-1) & penalties.stop_tokens.unsqueeze(1), float("-inf"))
    out = logits + (additive - per_row(penalties.presence) * seen)
    scale = torch.where(seen, per_row(penalties.repetition), 1.0)
    return torch.where(out < 0, out * scale, out / scale)
