"""How a forwarded node's k children are chosen from its q row: the child samplers.

Both take the node's log q (float64, -inf where q = 0) and its Gumbel noise and return k tokens
in drawing order with a validity flag; a row has fewer than k valid children only when q has
fewer than k tokens of positive probability (e.g. a request's top-k below the tree's k).

* ``gumbel_topk`` (``DEFAULT_CHILD_SAMPLER``, lossless): the k largest log q + g. Their order is a
  draw of k tokens without replacement from q (``noise.py`` states the law), which is what
  traversal verification (``verify_tree(method="hsd")``, ``draft_mode="without-replacement"``)
  divides by. One top-k over the vocabulary, no loop, no host synchronisation.
* ``argmax_first`` (lossless): the first child is q's argmax (deterministic, as the stock tree's
  top-1 child), the later k - 1 the largest log q + g with the argmax left out: a draw without
  replacement from q without its argmax, renormalised. Verified with ``draft_mode="argmax-first"``
  (``verify/tree/reference.py``): each child is tested against its own proposal, one-hot for the
  first child, q without the earlier siblings for the others.
* ``with_replacement`` (``lossless=False``, the documented negative): each child an independent
  Gumbel argmax, duplicates possible; verified as if drawn without replacement it is biased
  (``tests/tree_draft/test_exact.py::test_with_replacement_sampler_is_lossy``).

The greedy-row rule, the same for the runtime and the server: a *deterministic* row (a greedy
request: temperature 0 / top_k 1) ignores the noise and takes q's k most likely tokens. Such a
tree has positive probability under the sampled law, so any lossless verifier returns the
target's argmax path on it; q there is the drafter's plain softmax (``greedy_draft_q``), since a
one-hot q would leave a single child per node.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

# (log_q float64 [R, V], noise float64 [R, S, V], deterministic bool [R], k) -> (tokens int64 [R, k],
# valid bool [R, k]); invalid entries hold an arbitrary token.
DrawChildren = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class ChildSampler:
    """One way to draw a node's children.

    Fields:
        name / description: key in ``CHILD_SAMPLERS`` and one line.
        noise_draws: k -> S, the Gumbel vectors a node needs.
        draw: see ``DrawChildren``.
        lossless: with the lossless rules and verifiers the round keeps the target's law.
        draft_mode: the ``verify_tree`` draft mode that describes the children's law (what the
            server and the runtime pass; ``with_replacement`` deliberately mismatches it).
    """

    name: str
    description: str
    noise_draws: Callable[[int], int]
    draw: DrawChildren
    lossless: bool = True
    draft_mode: str = "without-replacement"


def gumbel_topk(log_q: torch.Tensor, noise: torch.Tensor, deterministic: torch.Tensor, k: int):
    keys = torch.where(deterministic.unsqueeze(-1), log_q, log_q + noise[:, 0])
    values, tokens = torch.topk(keys, k, dim=-1)
    return tokens, torch.isfinite(values)


def argmax_first(log_q: torch.Tensor, noise: torch.Tensor, deterministic: torch.Tensor, k: int):
    keys = torch.where(deterministic.unsqueeze(-1), log_q, log_q + noise[:, 0])
    keys = keys.scatter(1, log_q.argmax(-1, keepdim=True), math.inf)  # q's argmax first, always
    values, tokens = torch.topk(keys, k, dim=-1)
    return tokens, values > -math.inf


def with_replacement(log_q: torch.Tensor, noise: torch.Tensor, deterministic: torch.Tensor, k: int):
    keys = torch.where(deterministic.view(-1, 1, 1), log_q.unsqueeze(1), log_q.unsqueeze(1) + noise)
    values, tokens = keys.max(-1)  # [R, k]: one argmax per draw
    top_values, top_tokens = torch.topk(log_q, k, dim=-1)  # deterministic rows: q's top k
    det = deterministic.unsqueeze(-1)
    return torch.where(det, top_tokens, tokens), torch.isfinite(torch.where(det, top_values, values))


CHILD_SAMPLERS: dict[str, ChildSampler] = {
    sampler.name: sampler
    for sampler in (
        ChildSampler("gumbel_topk", "the k largest log q + Gumbel: k draws without replacement",
                     lambda k: 1, gumbel_topk),
        ChildSampler("argmax_first", "q's argmax, then k - 1 Gumbel top-k draws without it (without replacement)",
                     lambda k: 1, argmax_first, draft_mode="argmax-first"),
        ChildSampler("with_replacement", "k independent Gumbel argmaxes, duplicates possible (lossy)",
                     lambda k: k, with_replacement, lossless=False),
    )
}
DEFAULT_CHILD_SAMPLER = "gumbel_topk"


def greedy_draft_q(sampled_q: torch.Tensor, logits: torch.Tensor, deterministic: torch.Tensor) -> torch.Tensor:
    """The q rows the drafter draws from: the request's sampling distribution, but the plain
    softmax (temperature 1) for deterministic rows (see the module docstring).

    Args:
        sampled_q: float [R, V], the drafter's logits under the request's sampling parameters.
        logits: float [R, V], the drafter's logits.
        deterministic: bool [R].
    Returns:
        float [R, V].
    """
    return torch.where(deterministic.unsqueeze(-1), torch.softmax(logits.float(), -1).to(sampled_q.dtype), sampled_q)
