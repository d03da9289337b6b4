"""Coupled verification: a seeded request's tokens do not depend on what was drafted.

A seeded request draws every token by the Gumbel-max trick with keyed noise: the token that follows
position t is ``y_t = argmax_v(log p_t(v) + G(seed, t, v))``, where p_t is the target's row (after
temperature, filters and penalties) given the tokens before it and G is standard Gumbel noise
hashed from (seed, t, v) (``keyed_gumbel``, SGLang's ``multinomial_with_seed`` mapping). Plain
decoding with the seed emits y_1, y_2, ...

The coupled rule verifies a draft (chain or tree) against those draws: at each verified node the
target's keyed draw y of the node's row is computed; the walk descends to the child whose token
equals y and stops at the first node with no such child, emitting y there. Every emitted token is
therefore the keyed draw of its row given the emitted prefix, so the emitted sequence is *pathwise*
the sequence plain seeded decoding emits: the same tokens for every noise, whatever the draft (its
length, its shape, the drafter, an exit level in between, a length chosen from timings). The law
is the target's (Gumbel-max samples its row); reproducibility needs only the seed.

Drafts cost nothing in correctness but decide the acceptance: a draft drawn with the same keys,
``argmax(log q_t + G(seed, t, ·))``, equals y_t with probability
``P(argmax(log q + G) = argmax(log p + G))`` (at least (1 - TV) / (1 + TV)); an independent draw
would agree far less. Below the optimum 1 - TV of rejection sampling, the price of being
reproducible whatever the speculation does.

The walk is the plain-torch reference and the batched implementation at once: a loop over depth of
vectorised gathers, no per-request loop.
"""

from __future__ import annotations

import torch

from sglang_hsd.counter_rng import murmur_hash32, seeded_sampler_gumbel
from sglang_hsd.verify.chain.types import ChainVerifyResult
from sglang_hsd.verify.common import PLACEHOLDER_TOKEN_ID, assemble_emitted
from sglang_hsd.verify.tree.layout import parents_from_links
from sglang_hsd.verify.tree.types import TreeVerifyResult


def keyed_gumbel(seed: torch.Tensor, position: torch.Tensor, columns: int | torch.Tensor) -> torch.Tensor:
    """float64 [R, C] standard Gumbel noise keyed by (seed [R], position [R], token id).

    ``columns``: the vocabulary size (token ids 0..C-1) or int [C] token ids. The mapping of
    SGLang's ``multinomial_with_seed``, so a keyed draw here equals SGLang's seeded draw of the
    same row, seed and position."""
    if isinstance(columns, int):
        columns = torch.arange(columns, device=seed.device)
    return seeded_sampler_gumbel(murmur_hash32(seed, position, columns))


def keyed_draw(probs: torch.Tensor, seed: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """The keyed Gumbel-max draw of each row: int64 [...].

    Args:
        probs: float [..., V], rows of a law (zeros allowed; a row needs one positive entry).
        seed: int [...] (the shape of ``probs`` without V), each row's stream seed.
        position: int [...], each row's key position (the position of the row's input token).
    """
    vocab = probs.shape[-1]
    flat = probs.reshape(-1, vocab)
    scores = keyed_gumbel(seed.reshape(-1), position.reshape(-1), vocab)
    scores.add_(flat.to(torch.float64).log())
    return scores.argmax(dim=-1).view(probs.shape[:-1])


def coupled_chain(drafts: torch.Tensor, keyed: torch.Tensor,
                  draft_lengths: torch.Tensor | None = None) -> ChainVerifyResult:
    """The coupled rule on chains.

    Args:
        drafts: int64 [B, K], the drafted tokens d_1..d_K.
        keyed: int64 [B, K + 1]; ``keyed[:, j]`` is the target's keyed draw of row j (the row
            after d_1..d_j).
        draft_lengths: int [B] or None; row b drafted only its first ``draft_lengths[b]`` tokens.
    Returns:
        ``ChainVerifyResult``: num_accepted = the longest prefix with d_{j+1} = keyed[:, j];
        tokens = the accepted drafts, then ``keyed`` at the first mismatch.
    """
    batch, num_draft = drafts.shape
    if keyed.shape != (batch, num_draft + 1):
        raise ValueError(f"keyed must be [B, K + 1] = {[batch, num_draft + 1]}, got {list(keyed.shape)}")
    match = drafts == keyed[:, :num_draft]
    if draft_lengths is not None:
        slot = torch.arange(num_draft, device=drafts.device).unsqueeze(0)
        match &= slot < draft_lengths.to(drafts.device).unsqueeze(1)
    num_accepted = match.to(torch.int64).cumprod(dim=1).sum(dim=1)
    final = keyed.gather(1, num_accepted.unsqueeze(1)).squeeze(1)
    return ChainVerifyResult(num_accepted, assemble_emitted(drafts, num_accepted, final))


def coupled_tree(candidates: torch.Tensor, next_token: torch.Tensor, next_sibling: torch.Tensor,
                 keyed: torch.Tensor, max_depth: int | None = None) -> TreeVerifyResult:
    """The coupled rule on trees (the links of ``tree/layout.py``; node 0 the root).

    Args:
        candidates: int64 [B, N], node tokens (column 0: the root's, not verified).
        next_token / next_sibling: int [B, N], first child / next sibling, -1 for none.
        keyed: int64 [B, N]; the target's keyed draw of each node's row.
        max_depth: the deepest path the result holds (default N - 1).
    Returns:
        ``TreeVerifyResult`` over [B, max_depth + 1]: the path of nodes whose token is the keyed
        draw of their parent's row (the first such child where siblings repeat a token), then
        the keyed draw of the path's last node.
    """
    batch, nodes = candidates.shape
    depth_limit = nodes - 1 if max_depth is None else max_depth
    parents = parents_from_links(next_token.to(torch.int64), next_sibling.to(torch.int64))
    # match[b, n]: node n carries the token its parent's row draws.
    match = candidates == keyed.gather(1, parents.clamp_min(0))
    match[:, 0] = False
    node = torch.zeros(batch, dtype=torch.int64, device=candidates.device)
    walking = torch.ones(batch, dtype=torch.bool, device=candidates.device)
    path = [node]
    for _ in range(depth_limit):
        child_matches = match & (parents == node.unsqueeze(1))
        found = child_matches.any(dim=1) & walking
        if not bool(found.any()):
            break
        walking = found
        node = torch.where(found, child_matches.to(torch.int8).argmax(dim=1), node)
        path.append(torch.where(found, node, -1))
    accept_index = torch.full((batch, depth_limit + 1), -1, dtype=torch.int64, device=candidates.device)
    accept_index[:, :len(path)] = torch.stack(path, dim=1)
    num_accepted = (accept_index[:, 1:] >= 0).sum(dim=1)
    last = accept_index.gather(1, num_accepted.unsqueeze(1)).squeeze(1)
    on_path = accept_index[:, 1:].clamp_min(0)
    tokens = torch.full_like(accept_index, PLACEHOLDER_TOKEN_ID)
    tokens[:, :-1] = torch.where(accept_index[:, 1:] >= 0, candidates.gather(1, on_path), PLACEHOLDER_TOKEN_ID)
    tokens.scatter_(1, num_accepted.unsqueeze(1), keyed.gather(1, last.unsqueeze(1)))
    return TreeVerifyResult(accept_index, num_accepted, tokens)
