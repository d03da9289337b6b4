"""The most any lossless verifier can accept at one node whose k children are drawn without
replacement from q, in float64.

A lossless verifier of one node emits a token Y with law p; it accepts a draft exactly when Y is
one of the node's k drafted children S. Whatever the rule, its acceptance is therefore at most the
best coupling of Y ~ p with the random set S ~ SWOR(q, k) (k draws without replacement, each
proportional to q over the tokens not yet drawn). By max-flow / min-cut on the bipartite graph
"set S -> tokens in S",

    alpha*(p, q, k) = min over token sets H of [ 1 - p(H) + P(S meets H) ],

and a verifier that follows the optimal transport plan (then samples the residual on rejection)
reaches it, so alpha* is the exact optimum of one node. Any family of sets H gives an upper bound;
this module evaluates two families: singletons summed (``sum_x min(p(x), pi(x))``, pi the
inclusion probabilities, valid because P(S meets H) <= sum_{x in H} pi(x)) and nested sets H_j
(the j tokens of largest p / pi), and reports the smaller. The deterministic top-k children of
SGLang's stock tree accept p(top-k of q), which no rule can improve for fixed children.

The probabilities come from the exponential race: draw E_x ~ Exp(q(x)) independently; the order of
arrival is a draw without replacement from q. Hence, with N_A(t) the arrivals among tokens A by t,

    pi(x)           = integral_0^inf q(x) e^{-q(x) t} P(N_{V - x}(t) <= k - 1) dt,
    P(S misses H)   = integral_0^inf q(H) e^{-q(H) t} P(N_{V - H}(t) >= k) dt,

where N counts are Poisson-binomial (a truncated pmf by dynamic programming over tokens, batched
over a logarithmic t grid). ``rest`` (the q mass outside the tokens passed in) arrives as one
Poisson stream of rate rest * t, accurate while each of those tokens is small.

``tests/verify/oracles/test_root_coupling.py`` checks the inclusion probabilities and miss
probabilities against exact enumeration of the draws and the bound against alpha* by enumerating
every H on tiny vocabularies.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch

GRID_POINTS = 400
T_MIN, T_MAX = 1e-5, 1e11


def _grid(dtype=torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-spaced t [G] and trapezoid weights [G] for integral f(t) dt = integral f(t) t dlog t."""
    log_t = torch.linspace(math.log(T_MIN), math.log(T_MAX), GRID_POINTS, dtype=dtype)
    step = float(log_t[1] - log_t[0])
    weights = torch.full((GRID_POINTS,), step, dtype=dtype)
    weights[0] = weights[-1] = step / 2
    t = log_t.exp()
    return t, weights * t


def _rest_pmf(rest: torch.Tensor, t: torch.Tensor, k: int) -> torch.Tensor:
    """Poisson(rest * t) pmf of counts 0 .. k - 1: [B, G, k] (rest [B], t [G])."""
    lam = rest[:, None] * t[None, :]
    counts = torch.arange(k, dtype=t.dtype)
    log_pmf = counts * torch.log(lam[..., None].clamp_min(1e-300)) - lam[..., None] - torch.lgamma(counts + 1)
    pmf = log_pmf.exp()
    pmf[..., 1:] = torch.where(lam[..., None] > 0, pmf[..., 1:], torch.zeros_like(pmf[..., 1:]))
    return pmf


def _add_token(pmf: torch.Tensor, arrived: torch.Tensor) -> torch.Tensor:
    """Truncated count pmf [B, G, k] after one more token that has arrived with probability
    ``arrived`` [B, G]."""
    out = pmf * (1 - arrived)[..., None]
    out[..., 1:] += pmf[..., :-1] * arrived[..., None]
    return out


def race_tables(q: torch.Tensor, rest: torch.Tensor, k: int, with_prefix: bool = True):
    """Prefix and suffix count pmfs of the exponential race (token-major, so each step of the
    dynamic programme writes one contiguous block).

    Args:
        q: float64 [B, n], q of the tokens in a fixed order; rest: float64 [B], q mass of all others.
        with_prefix: build the prefix table (the miss probabilities need only the suffix one).
    Returns:
        (t [G], weights [G], arrived [n, B, G], prefix [n + 1, B, G, k] or None, suffix [n + 1, B, G, k]):
        prefix[i, ..., c] = P(c arrivals among tokens 0 .. i - 1 by t); suffix[i, ..., c] =
        P(c arrivals among tokens i .. n - 1 and the rest by t); counts >= k are dropped.
    """
    batch, n = q.shape
    t, weights = _grid(q.dtype)
    arrived = -torch.expm1(-q.T[:, :, None] * t[None, None, :])  # [n, B, G]
    suffix = torch.zeros(n + 1, batch, t.numel(), k, dtype=q.dtype)
    suffix[n] = _rest_pmf(rest, t, k)
    for i in range(n - 1, -1, -1):
        suffix[i] = _add_token(suffix[i + 1], arrived[i])
    prefix = None
    if with_prefix:
        prefix = torch.zeros_like(suffix)
        prefix[0, :, :, 0] = 1.0
        for i in range(n):
            prefix[i + 1] = _add_token(prefix[i], arrived[i])
    return t, weights, arrived, prefix, suffix


def inclusion_probabilities(q: torch.Tensor, rest: torch.Tensor, k: int) -> torch.Tensor:
    """pi [B, n]: probability that each token is among k draws without replacement from q.

    ``q`` [B, n] and ``rest`` [B] as in ``race_tables``."""
    t, weights, arrived, prefix, suffix = race_tables(q, rest, k)
    # P(N_{others}(t) <= k - 1) = sum_{a + b <= k - 1} prefix_i[a] * suffix_{i+1}[b]
    below = torch.zeros(arrived.shape, dtype=q.dtype)  # [n, B, G]
    for a in range(k):
        below += prefix[:-1, ..., a] * suffix[1:, ..., : k - a].sum(-1)
    density = q.T[:, :, None] * (1 - arrived)  # q e^{-q t}
    head = -torch.expm1(-q * t[0])  # t < T_MIN: nothing else has arrived
    return head + (density * below * weights).sum(-1).T


def miss_probabilities(q: torch.Tensor, rest: torch.Tensor, k: int) -> torch.Tensor:
    """[B, n + 1]: column j = P(no draw among the first j tokens), j = 0 .. n (column 0 is 1)."""
    t, weights, _, _, suffix = race_tables(q, rest, k, with_prefix=False)
    mass = torch.cat([torch.zeros_like(q[:, :1]), q.cumsum(-1)], -1).T  # q(H_j) [n + 1, B]
    at_least_k = 1 - suffix.sum(-1)  # [n + 1, B, G]: k or more of tokens j.. and the rest by t
    density = mass[..., None] * torch.exp(-mass[..., None] * t)
    out = (density * at_least_k * weights).sum(-1).T.contiguous()
    out[:, 0] = 1.0
    return out


def restrict(p: torch.Tensor, q: torch.Tensor, support: int) -> tuple[torch.Tensor, torch.Tensor]:
    """p, q [B, V] on the union of their ``support`` largest tokens: float64 [B, W] each, W the
    widest union (columns past a row's union are 0)."""
    keep = min(support, p.shape[-1])
    rows = [torch.unique(torch.cat([p[b].topk(keep).indices, q[b].topk(keep).indices])) for b in range(p.shape[0])]
    width = max(len(r) for r in rows)
    ps = torch.zeros(p.shape[0], width, dtype=torch.float64)
    qs = torch.zeros_like(ps)
    for b, idx in enumerate(rows):
        ps[b, : len(idx)], qs[b, : len(idx)] = p[b, idx].double(), q[b, idx].double()
    return ps, qs


def node_bound(p: torch.Tensor, q: torch.Tensor, k: int, support: int = 512) -> dict[str, torch.Tensor]:
    """Acceptance at one node with k children: SGLang's deterministic top-k, and an upper bound on
    every lossless rule for children drawn without replacement from q.

    Args:
        p, q: [B, V] target and draft distributions (any float dtype; computed in float64).
        k: children per node.
        support: the union of the ``support`` largest tokens of p and of q is modelled token by
            token; q outside it arrives as one Poisson stream, p outside it is added to the bound.
    Returns:
        {"stock": [B], "bound": [B], "bound_singletons": [B], "bound_nested": [B]}.
    """
    if p.shape != q.shape or p.dim() != 2:
        raise ValueError(f"p and q must both be [B, V], got {tuple(p.shape)} and {tuple(q.shape)}")
    if not 1 <= k <= q.shape[-1]:
        raise ValueError(f"k must be in 1..{q.shape[-1]}, got {k}")
    p, q = p.double(), q.double()
    stock = p.gather(-1, q.topk(k, -1).indices).sum(-1)
    ps, qs = restrict(p, q, support)
    p_out = (1 - ps.sum(-1)).clamp_min(0.0)
    rest = (1 - qs.sum(-1)).clamp_min(0.0)
    pi = inclusion_probabilities(qs, rest, k)
    singletons = torch.minimum(ps, pi).sum(-1) + p_out
    order = torch.argsort(-(ps / pi.clamp_min(1e-300)), -1)  # nested H_j: largest p / pi first
    p_sorted, q_sorted = ps.gather(-1, order), qs.gather(-1, order)
    miss = miss_probabilities(q_sorted, rest, k)
    p_mass = torch.cat([torch.zeros_like(ps[:, :1]), p_sorted.cumsum(-1)], -1)
    nested = (1 - p_mass + (1 - miss)).min(-1).values + p_out
    return {"stock": stock, "bound": torch.minimum(singletons, nested).clamp_max(1.0),
            "bound_singletons": singletons, "bound_nested": nested}


# ---------------------------------------------------------------- exact references (tiny V)
def swor_set_law(q: np.ndarray, k: int) -> dict[frozenset, float]:
    """Exact law of the set of k draws without replacement from q (tiny V, every order enumerated)."""
    law: dict[frozenset, float] = {}
    for order in itertools.permutations(np.flatnonzero(q > 0).tolist(), k):
        prob, left = 1.0, 1.0
        for token in order:
            prob *= q[token] / left
            left -= q[token]
        law[frozenset(order)] = law.get(frozenset(order), 0.0) + prob
    return law


def exact_optimum(p: np.ndarray, q: np.ndarray, k: int) -> float:
    """alpha*(p, q, k) by enumerating every token set H (tiny V)."""
    law = swor_set_law(q, k)
    best = 1.0
    for size in range(1, len(p) + 1):
        for hit in itertools.combinations(range(len(p)), size):
            meets = sum(prob for s, prob in law.items() if s & set(hit))
            best = min(best, 1 - float(p[list(hit)].sum()) + meets)
    return best
