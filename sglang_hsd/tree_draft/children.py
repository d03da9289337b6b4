"""How a forwarded node's k children are chosen from its q row: the child samplers.

Each takes the node's q row and its noise and returns k tokens in drawing order with a validity
flag; a row has fewer than k valid children only when q has fewer than k tokens of positive
probability (e.g. a request's top-k below the tree's k). Two noise kinds (``ChildSampler.noise``,
``noise.py``): ``"uniform"``, one uniform per draw (float64 [R, S]), and ``"gumbel"``, one Gumbel
vector over the vocabulary per draw (float64 [R, S, V]).

* ``inverse_cdf`` (``DEFAULT_CHILD_SAMPLER``, lossless): k sequential draws without replacement by
  inverse transform sampling: draw j maps its uniform through the cumulative mass of q without the
  j - 1 tokens already drawn (``sequential_draws``). The law is exactly the Plackett-Luce law of
  ``gumbel_topk`` (``noise.py`` states it), which traversal verification
  (``verify_tree(method="hsd")``, ``draft_mode="without-replacement"``) divides by, but it needs k
  uniforms per node instead of a hashed Gumbel value per vocabulary entry: at the server's size
  (8 requests x 4 beams x 151,936 tokens) a level's Gumbel noise alone cost 471 ms on a 2-core
  CPU, the drafter's round 2.25 s, against 8 ms and 101 ms here
  (``benchmarks/bench_tree_sampler.py``): this sampler's work per level is a top-k and a
  block-sum pass over the q rows.
* ``argmax_first_cdf`` (lossless): the first child is q's argmax (deterministic, as the stock
  tree's top-1 child), the later k - 1 sequential draws without replacement from q without it.
  Verified with ``draft_mode="argmax-first"`` (``verify/tree/reference.py``): each child is tested
  against its own proposal, one-hot for the first child, q without the earlier siblings for the
  others.
* ``gumbel_topk`` and ``argmax_first`` (lossless): the same two laws by Gumbel top-k: the k largest
  log q + g (with q's argmax's key set to +inf for ``argmax_first``); one top-k over the
  vocabulary, no loop. The samplers the GPU checks of the draft round ran with.
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

# (q float [R, V] (non-negative rows, any positive mass), noise (``ChildSampler.noise``: float64
# [R, S] uniforms in (0, 1) or [R, S, V] Gumbel), deterministic bool [R], k) -> (tokens int64
# [R, k], valid bool [R, k]); invalid entries hold an arbitrary token.
DrawChildren = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class ChildSampler:
    """One way to draw a node's children.

    Fields:
        name / description: key in ``CHILD_SAMPLERS`` and one line.
        noise_draws: k -> S, the noise draws a node needs.
        draw: see ``DrawChildren``.
        noise: ``"uniform"`` (one uniform per draw) or ``"gumbel"`` (one Gumbel vector over the
            vocabulary per draw): what ``NoiseSource`` method feeds ``draw``.
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
    noise: str = "gumbel"


# Block size of the two-level cumulative mass: a draw scans the R x V / BLOCK block masses and one
# block, not a cumulative sum over the whole vocabulary.
BLOCK = 1024
SUM_RUN = 64


def _block_masses(q: torch.Tensor) -> torch.Tensor:
    """float64 [R, ceil(V / BLOCK)]: each block's mass. Runs of ``SUM_RUN`` entries are summed in q's
    dtype, the runs in float64: float64 q (the exact tests' worlds) is followed to float64
    precision; for float32 q (the server's) a block's mass is off by at most a few 1e-7 relative,
    the precision of q's own rows and of the float32 verification that reads them, while a float64
    pass over the rows would cost twice this sampler's other work (measured at 8 x 4 x 151,936)."""
    rows, vocab = q.shape
    full = vocab // BLOCK
    parts = [q[:, : full * BLOCK].reshape(rows, full, BLOCK // SUM_RUN, SUM_RUN).sum(-1).double().sum(-1)]
    if vocab % BLOCK:
        parts.append(q[:, full * BLOCK :].sum(-1, keepdim=True, dtype=torch.float64))
    return torch.cat(parts, 1)


def _first_above(cumulative: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """int64 [R]: the first index whose cumulative mass exceeds x (float64 [R]), or the last index
    of positive mass when rounding put x at or past the total. Zero-mass entries never qualify."""
    index = torch.searchsorted(cumulative, x.unsqueeze(-1).contiguous(), right=True).squeeze(-1)
    last = torch.searchsorted(cumulative, cumulative[:, -1:].contiguous(), right=False).squeeze(-1)
    return torch.minimum(index, last)


def sequential_draws(q: torch.Tensor, uniforms: torch.Tensor, k: int, first: torch.Tensor | None = None) -> torch.Tensor:
    """k draws without replacement from each row of q by inverse transform sampling.

    Draw j takes the first token whose cumulative mass, over the tokens not drawn yet, exceeds
    u_j times their total; the cumulative mass is two-level (block masses, then the chosen block's
    entries), and a drawn token leaves by zeroing its entry in its block's mass. So draw j has law
    q without t_1 .. t_{j-1}, renormalised, and the k draws the Plackett-Luce law.

    Args:
        q: float [R, V], non-negative. uniforms: float64 [R, k] in (0, 1).
        first: int64 [R] or None: a given first token (``argmax_first_cdf``); uniform 0 is unused.
    Returns:
        int64 [R, k]; draws past q's support are arbitrary (callers mark them invalid).
    """
    rows, vocab = q.shape
    masses = _block_masses(q)  # [R, nb]
    offsets = torch.arange(BLOCK, device=q.device)
    drawn = torch.full((rows, k), -1, dtype=torch.long, device=q.device)
    for j in range(k):
        given = j == 0 and first is not None
        if given:
            token = first
            block = token // BLOCK
        else:
            x = uniforms[:, j] * masses.sum(-1)
            block_cum = torch.cumsum(masses, -1)
            block = _first_above(block_cum, x)
            start = block_cum.gather(1, block.unsqueeze(-1)) - masses.gather(1, block.unsqueeze(-1))
            # clamped: rounding must not reach the zero-mass entries before the block's first
            x = (x - start.squeeze(-1)).clamp_min(0.0)
        columns = block.unsqueeze(-1) * BLOCK + offsets  # [R, BLOCK]
        entries = torch.where(columns < vocab, q.gather(1, columns.clamp_max(vocab - 1)), 0).double()
        taken = (columns.unsqueeze(-1) == drawn.unsqueeze(1)).any(-1)  # tokens drawn already: no mass left
        entries = torch.where(taken, 0.0, entries)
        if not given:
            token = block * BLOCK + _first_above(torch.cumsum(entries, -1), x)
        drawn[:, j] = token
        remaining = torch.where(columns == token.unsqueeze(-1), 0.0, entries).sum(-1)
        masses = masses.scatter(1, block.unsqueeze(-1), remaining.unsqueeze(-1))
    return drawn


def _with_top_k(q: torch.Tensor, tokens: torch.Tensor, deterministic: torch.Tensor, k: int):
    """Deterministic rows take q's top k; validity: draw j exists when q has > j positive tokens."""
    top_values, top_tokens = torch.topk(q, k, dim=-1)
    return torch.where(deterministic.unsqueeze(-1), top_tokens, tokens), top_values > 0


def inverse_cdf(q: torch.Tensor, uniforms: torch.Tensor, deterministic: torch.Tensor, k: int):
    return _with_top_k(q, sequential_draws(q, uniforms, k), deterministic, k)


def argmax_first_cdf(q: torch.Tensor, uniforms: torch.Tensor, deterministic: torch.Tensor, k: int):
    tokens = sequential_draws(q, uniforms, k, first=q.argmax(-1))  # the first maximum, as torch's argmax
    return _with_top_k(q, tokens, deterministic, k)


def _log(q: torch.Tensor) -> torch.Tensor:
    return torch.log(q.double())


def gumbel_topk(q: torch.Tensor, noise: torch.Tensor, deterministic: torch.Tensor, k: int):
    log_q = _log(q)
    keys = torch.where(deterministic.unsqueeze(-1), log_q, log_q + noise[:, 0])
    values, tokens = torch.topk(keys, k, dim=-1)
    return tokens, torch.isfinite(values)


def argmax_first(q: torch.Tensor, noise: torch.Tensor, deterministic: torch.Tensor, k: int):
    log_q = _log(q)
    keys = torch.where(deterministic.unsqueeze(-1), log_q, log_q + noise[:, 0])
    keys = keys.scatter(1, log_q.argmax(-1, keepdim=True), math.inf)  # q's argmax first, always
    values, tokens = torch.topk(keys, k, dim=-1)
    return tokens, values > -math.inf


def with_replacement(q: torch.Tensor, noise: torch.Tensor, deterministic: torch.Tensor, k: int):
    log_q = _log(q)
    keys = torch.where(deterministic.view(-1, 1, 1), log_q.unsqueeze(1), log_q.unsqueeze(1) + noise)
    values, tokens = keys.max(-1)  # [R, k]: one argmax per draw
    top_values, top_tokens = torch.topk(log_q, k, dim=-1)  # deterministic rows: q's top k
    det = deterministic.unsqueeze(-1)
    return torch.where(det, top_tokens, tokens), torch.isfinite(torch.where(det, top_values, values))


CHILD_SAMPLERS: dict[str, ChildSampler] = {
    sampler.name: sampler
    for sampler in (
        ChildSampler("inverse_cdf", "k sequential draws without replacement by inverse transform sampling",
                     lambda k: k, inverse_cdf, noise="uniform"),
        ChildSampler("argmax_first_cdf", "q's argmax, then k - 1 sequential draws without it (without replacement)",
                     lambda k: k, argmax_first_cdf, draft_mode="argmax-first", noise="uniform"),
        ChildSampler("gumbel_topk", "the k largest log q + Gumbel: k draws without replacement",
                     lambda k: 1, gumbel_topk),
        ChildSampler("argmax_first", "q's argmax, then k - 1 Gumbel top-k draws without it (without replacement)",
                     lambda k: 1, argmax_first, draft_mode="argmax-first"),
        ChildSampler("with_replacement", "k independent Gumbel argmaxes, duplicates possible (lossy)",
                     lambda k: k, with_replacement, lossless=False),
    )
}
DEFAULT_CHILD_SAMPLER = "inverse_cdf"


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
