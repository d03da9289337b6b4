"""Layer groups: the unit of KV and hidden-state reuse between levels.

A hierarchy with exits L_0 < L_1 < ... < N over one target splits the target's layers into groups
[0, L_0), [L_0, L_1), ..., [L_{m-1}, N). Each group keeps its own cache length per request and
stores its output hidden state per position. ``advance(group, upto)`` brings a group (and,
recursively, the groups below it) up to date with the token sequence: every position runs through
every layer exactly once, however many levels look at it. A level's distribution at a position is
its exit head applied to its group's stored output there.

On a rejection, ``truncate_all`` rolls every group back to the last valid position; stale stored
hidden states beyond it are simply overwritten when the group advances again.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_hsd.runtime.kv_cache import KVCache
from sglang_hsd.runtime.model import CausalLM


@dataclass(eq=False)
class LayerGroup:
    """Layers [start, end) of ``model``, fed by ``source`` (or by ``model``'s embeddings).

    Fields:
        model, start, end: the layers this group runs.
        cache: KV cache these layers write (shared by all groups of one model when reusing).
        source: the group whose output feeds this one; ``None`` = token embeddings.
        hidden: float [B, max_len, D], this group's output at each processed position.
    """

    model: CausalLM
    start: int
    end: int
    cache: KVCache
    source: "LayerGroup | None"
    hidden: torch.Tensor

    @classmethod
    def create(cls, model, start, end, cache, source, batch_size, max_len) -> "LayerGroup":
        weight = model.embed_tokens.weight
        hidden = torch.zeros(batch_size, max_len, model.hidden_size, dtype=weight.dtype, device=weight.device)
        return cls(model, start, end, cache, source, hidden)

    def length(self) -> torch.Tensor:
        """Positions processed per request. int64 [B]."""
        return self.cache.lengths_for(self.start)


def advance(group: LayerGroup, tokens: torch.Tensor, upto: torch.Tensor) -> None:
    """Run ``group`` (and its sources) on every position < ``upto[b]`` it has not processed yet.

    Args:
        tokens: int64 [B, max_len], the token sequence of each request.
        upto: int64 [B]; rows already at or past it are left alone.
    """
    if group.source is not None:
        advance(group.source, tokens, upto)
    length = group.length()
    num_new = (upto - length).clamp_min(0)
    width = int(num_new.max())
    if width == 0:
        return
    offsets = torch.arange(width, device=tokens.device)
    positions = (length.unsqueeze(-1) + offsets).clamp(max=tokens.shape[1] - 1)  # [B, T]
    if group.source is None:
        inputs = group.model.embed(tokens.gather(1, positions))
    else:
        index = positions.unsqueeze(-1).expand(-1, -1, group.source.hidden.shape[-1])
        inputs = group.source.hidden.gather(1, index)
    out = group.model.forward_layers(inputs, group.start, group.end, group.cache, num_new=num_new)
    valid = offsets.unsqueeze(0) < num_new.unsqueeze(-1)
    rows = torch.arange(tokens.shape[0], device=tokens.device).unsqueeze(-1).expand_as(positions)
    group.hidden[rows[valid], positions[valid]] = out[valid]


def truncate_all(groups: list[LayerGroup], new_length: torch.Tensor) -> None:
    """Roll every group back so that at most ``new_length[b]`` positions stay processed."""
    for group in groups:
        keep = torch.minimum(group.length(), new_length)
        group.cache.truncate(keep, layers=range(group.start, group.end))


def build_groups(
    target: CausalLM,
    exit_layers: list[int],
    batch_size: int,
    max_len: int,
    reuse_kv: bool,
    capture_layers: list[int] = (),
) -> list[LayerGroup]:
    """Groups whose outputs are the target's hidden states at each boundary and at the last layer.

    Boundaries are the exit layers plus ``capture_layers`` (hidden states a drafter reads, e.g.
    an EAGLE-3 head's aux layers; they are not levels). Returns one group per boundary in
    increasing order plus one for the full depth, the last (``group.end`` tells which is which).
    With ``reuse_kv`` they chain over one shared cache; without it each boundary gets its own
    cache and runs from layer 0 (recomputing the shared layers).
    """
    bounds = sorted((set(exit_layers) | set(capture_layers)) - {target.num_layers}) + [target.num_layers]
    groups: list[LayerGroup] = []
    if reuse_kv:
        cache = target.new_cache(batch_size, max_len)
        start, source = 0, None
        for end in bounds:
            group = LayerGroup.create(target, start, end, cache, source, batch_size, max_len)
            groups.append(group)
            start, source = end, group
        return groups
    for end in bounds:
        cache = target.new_cache(batch_size, max_len)
        groups.append(LayerGroup.create(target, 0, end, cache, None, batch_size, max_len))
    return groups
