"""Acceptance records for the round planner (``round_planner.py``): the target's own continuation
of each planning prompt (greedy, or sampled under the request's parameters), then both levels'
rows at every position of it, in one teacher-forced pass each; a separate drafter's rows once per
drafter precision the settings use (its weight copy changes its proposals, so each precision is
replayed with its own records), and optionally what a prompt lookup copies at each position and
how the target's own exits judge the drafter (an exit level between the drafter and the target).
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import torch

from sglang_hsd.hierarchy.lookup_record import lookup_record
from sglang_hsd.hierarchy.measure import target_continuation
from sglang_hsd.hierarchy.middle_record import check_middle_layers, middle_record
from sglang_hsd.hierarchy.replay import AcceptanceRecord
from sglang_hsd.hierarchy.round_costs import DrafterSpec
from sglang_hsd.runtime.kernel_setup import DRAFTER_PRECISIONS, parse_drafter_precision
from sglang_hsd.runtime.weight_copies import single_row_copy
from sglang_hsd.runtime.layers import PackedRows
from sglang_hsd.runtime.model import CausalLM
from sglang_hsd.sampling import SamplingParams, logits_to_probs

__all__ = ["record_acceptance"]


@torch.inference_mode()
def _logits_at(model: CausalLM, ids: list[int], start: int, end_layer: int | None = None, head=None) -> torch.Tensor:
    """Logits of ``model`` (or of its exit after ``end_layer`` with ``head``) predicting ids[start + 1:],
    i.e. at positions start .. len(ids) - 2. float [P, V]."""
    cache = model.new_cache(1, len(ids))
    end = model.num_layers if end_layer is None else end_layer
    hidden = model.forward_layers(model.embed(torch.tensor([ids])), 0, end, cache)
    return model.exit_logits(hidden[:, start:-1], head)[0]


@torch.inference_mode()
def _exit_logits_at(model: CausalLM, ids: list[int], start: int, layers, heads) -> tuple[torch.Tensor, dict]:
    """One pass of ``model`` over ``ids``: its final logits and those of its exit after each of
    ``layers`` (with ``heads[layer]``, or the final norm + LM head), at positions start ..
    len(ids) - 2. (float [P, V], {layer: float [P, V]}); layers lie in [1, depth)."""
    cache = model.new_cache(1, len(ids))
    hidden, lo, exits = model.embed(torch.tensor([ids])), 0, {}
    for layer in sorted(set(layers)):
        hidden = model.forward_layers(hidden, lo, layer, cache)
        exits[layer], lo = model.exit_logits(hidden[:, start:-1], heads.get(layer))[0], layer
    hidden = model.forward_layers(hidden, lo, model.num_layers, cache)
    return model.exit_logits(hidden[:, start:-1], None)[0], exits


def record_acceptance(
    target: CausalLM,
    drafter: DrafterSpec,
    prompts: Sequence[list[int]],
    params: SamplingParams,
    length: int,
    seed: int = 0,
    drafter_precisions: Sequence[str] = ("fp32",),
    lookup: tuple[int, int] | None = None,
    middle_layers: Sequence[int] = (),
    middle_heads: Mapping[int, torch.nn.Module] | None = None,
) -> dict[str, list[AcceptanceRecord]]:
    """Per drafter precision, one ``AcceptanceRecord`` of ``length`` positions per prompt (module
    docstring). The target's continuation is drawn once; a separate drafter's rows are computed
    on each precision's weight copy (every row on the copy, as its drafting steps run), an exit
    drafter's only in fp32 (the target's own weights). ``lookup``: (longest n-gram, most copies):
    also record what a prompt lookup copies (``lookup_replay.lookup_record``). ``middle_layers``: also
    record the target's exit at each of these layers (``middle_heads[layer]``, or the logit lens)
    between a separate drafter and the target (``middle_record.middle_record``), read in the
    target's own pass."""
    if length < 1:
        raise ValueError(f"length must be >= 1, got {length}")
    if lookup is not None and (lookup[0] < 1 or lookup[1] < 1):
        raise ValueError(f"lookup must be (ngram >= 1, copies >= 1), got {lookup}")
    for precision in drafter_precisions:
        parse_drafter_precision(precision, name="drafter_precisions")
    if drafter.model is None and tuple(drafter_precisions) != ("fp32",):
        raise ValueError(f"drafter_precisions: an exit drafter runs the target's own weights (fp32 only), "
                         f"got {tuple(drafter_precisions)}")
    middle_layers = check_middle_layers(middle_layers, target.num_layers, drafter.model is not None)
    generator = torch.Generator().manual_seed(seed)
    records: dict[str, list[AcceptanceRecord]] = {precision: [] for precision in drafter_precisions}
    try:
        for prompt in prompts:
            tail = target_continuation(target, list(prompt), length, params, generator)
            ids = list(prompt) + tail
            start = len(prompt) - 1
            final, exits = _exit_logits_at(target, ids, start, middle_layers, middle_heads or {})
            p = logits_to_probs(final[None], params)[0]
            exit_probs = {layer: logits_to_probs(rows[None], params)[0] for layer, rows in exits.items()}
            del final, exits
            made = {}  # the copy a drafting step reads -> its record (a mix shares its part's)
            for precision in drafter_precisions:
                kind = DRAFTER_PRECISIONS[precision]
                read = kind and single_row_copy(kind)
                if read in made:
                    records[precision].append(made[read])
                    continue
                if drafter.model is not None:
                    drafter.model.set_weight_copy(read, PackedRows(((1, None),)))  # every row on it
                    raw = _logits_at(drafter.model, ids, start)
                else:
                    raw = _logits_at(target, ids, start, drafter.layer, drafter.head)
                q = logits_to_probs(raw[None], params)[0]
                record = AcceptanceRecord.from_distributions(torch.tensor(tail), p, q, raw,
                                                             greedy=params.temperature == 0.0)
                if lookup is not None:
                    copies = lookup_record(torch.tensor(ids), len(prompt), p, q, *lookup)
                    record = dataclasses.replace(record, lookup=copies)
                if exit_probs:
                    middles = tuple(middle_record(layer, p, q, e) for layer, e in sorted(exit_probs.items()))
                    record = dataclasses.replace(record, middles=middles)
                made[read] = record
                records[precision].append(record)
    finally:
        if drafter.model is not None:
            drafter.model.set_weight_copy(None)
    return records
