"""Noise for drafting tree children: keyed, static-shape, free of host synchronisation.

Children are drawn without replacement (``children.py``), so that k draws t_1 .. t_k (t_1 from q,
t_2 from q without t_1 renormalised, ...) have the Plackett-Luce law
P(t_1..t_k) = prod_j q(t_j) / (1 - q(t_1) - ... - q(t_{j-1})). Two ways to feed it:

* uniforms, one per draw (``inverse_cdf``, the default): draw j inverts the cumulative mass of
  the tokens not drawn yet at u_j;
* Gumbel vectors, one value per vocabulary entry (``gumbel_topk``): with independent standard
  Gumbel g_v, the k largest log q_v + g_v, in decreasing order, have exactly that law.

A noise source gives the noise of one draft level, one entry per (forwarded node of the level,
draw): ``uniform(level, forwards, draws)`` -> float64 [B, F', S] in (0, 1), ``gumbel(level,
forwards, draws, vocab)`` -> float64 [B, F', S, V]. Level 0 is the root (F' = 1), level l >= 1 the
k beams of draft forward l - 1 (F' = k).

``KeyedNoise`` (the server and the runtime): u = murmur_hash32(seed', position, column) mapped to
(0, 1) (g = Gumbel of it) with seed' = the request's stream seed separated by ``TREE_NOISE_TAG``
and the level (``counter_rng.domain_seed``), position = the request's committed length at this
round (no two rounds of a request share it) and column = (forward, draw[, token]). The same seed
gives the same tree in any batch, on any device and on every tensor-parallel rank, and no
generator state is read, so the draw can be captured in a CUDA graph. ``TableNoise`` replays
given noise (the exact oracle drives the drafter with noise chosen to produce each outcome).
"""

from __future__ import annotations

from typing import Protocol

import torch

from sglang_hsd.counter_rng import (
    domain_seed,
    gumbel_from_hash,
    murmur_hash32,
    open_uniforms,
    seeded_sampler_gumbel,
)

TREE_NOISE_TAG = 0x7EE5_D4A7


class NoiseSource(Protocol):
    def uniform(self, level: int, forwards: int, draws: int) -> torch.Tensor:
        """float64 [B, forwards, draws] uniforms in (0, 1) for draft level ``level``."""

    def gumbel(self, level: int, forwards: int, draws: int, vocab: int) -> torch.Tensor:
        """float64 [B, forwards, draws, vocab] standard Gumbel noise for draft level ``level``."""


class KeyedNoise:
    """Counter-based noise of a batch of requests (see the module docstring).

    Args:
        seed: int64 [B], each request's stream seed (its sampling seed, or one drawn for it).
        position: int64 [B], each request's committed length at this round.
    """

    def __init__(self, seed: torch.Tensor, position: torch.Tensor):
        if seed.dim() != 1 or position.shape != seed.shape:
            raise ValueError(f"seed and position must be int tensors [B] of one shape, got "
                             f"{list(seed.shape)} and {list(position.shape)}")
        if seed.is_floating_point() or position.is_floating_point():
            raise ValueError("seed and position must be integer tensors")
        self.seed, self.position = seed, position

    @classmethod
    def fresh(cls, position: torch.Tensor, generator: torch.Generator | None = None) -> "KeyedNoise":
        """A new stream per request (seeds drawn from ``generator``, or torch's default one on
        ``position``'s device), for requests without a seed of their own."""
        device = generator.device if generator is not None else position.device
        seed = torch.randint(0, 2**62, position.shape, generator=generator, device=device)
        return cls(seed.to(position.device), position)

    def _hashed(self, level: int, columns: int) -> torch.Tensor:
        if columns > 2**32:
            raise ValueError(f"{columns} noise columns exceed the 2^32 columns of one key")
        return murmur_hash32(domain_seed(self.seed, TREE_NOISE_TAG, level), self.position,
                             torch.arange(columns, device=self.seed.device))

    def uniform(self, level: int, forwards: int, draws: int) -> torch.Tensor:
        return open_uniforms(self._hashed(level, forwards * draws)).view(-1, forwards, draws)

    def gumbel(self, level: int, forwards: int, draws: int, vocab: int) -> torch.Tensor:
        return gumbel_from_hash(self._hashed(level, forwards * draws * vocab)).view(-1, forwards, draws, vocab)


class TargetKeyedNoise:
    """Gumbel noise keyed as the target's seeded draws, for seeded requests (``verify/coupled.py``
    verifies them: any children serve, these agree most). The children of a level-l node take
    G(seed, root position + l, target token id), the key of the target's row at the node's depth,
    so a node's first child is the draft's coupled draw (the draw a coupled chain would make) and
    its later children the next best keyed scores, without replacement (``gumbel_topk``).

    Args:
        seed: int64 [B], each request's stream seed.
        root_position: int64 [B], the position of each request's root token (its verify key).
        target_ids: int64 [V] target token id of each draft vocabulary entry, or None (identity).
    """

    def __init__(self, seed: torch.Tensor, root_position: torch.Tensor, target_ids: torch.Tensor | None = None):
        if seed.dim() != 1 or root_position.shape != seed.shape:
            raise ValueError(f"seed and root_position must be int tensors [B] of one shape, got "
                             f"{list(seed.shape)} and {list(root_position.shape)}")
        self.seed, self.root_position, self.target_ids = seed, root_position, target_ids

    def uniform(self, level: int, forwards: int, draws: int) -> torch.Tensor:
        raise ValueError("TargetKeyedNoise feeds Gumbel child samplers only (gumbel_topk)")

    def gumbel(self, level: int, forwards: int, draws: int, vocab: int) -> torch.Tensor:
        columns = torch.arange(vocab, device=self.seed.device) if self.target_ids is None else self.target_ids
        noise = seeded_sampler_gumbel(murmur_hash32(self.seed, self.root_position + level, columns))
        return noise.view(-1, 1, 1, vocab).expand(-1, forwards, draws, vocab)


class TableNoise:
    """Given noise: ``table`` float64 [B, F, S] uniforms or [B, F, S, V] Gumbel values, F = 1 +
    k (D - 1) forwarded nodes; level l reads the rows of its forwards (``forward_slice``)."""

    def __init__(self, table: torch.Tensor, topk: int):
        if table.dim() not in (3, 4):
            raise ValueError(f"table must be [B, F, S] (uniforms) or [B, F, S, V] (Gumbel), got {list(table.shape)}")
        self.table, self.topk = table, topk

    def _rows(self, level: int, shape: tuple) -> torch.Tensor:
        rows = self.table[:, forward_slice(level, self.topk)]
        if tuple(rows.shape[1:]) != shape:
            raise ValueError(f"table rows of level {level} are {list(rows.shape[1:])}, the drafter needs {list(shape)}")
        return rows

    def uniform(self, level: int, forwards: int, draws: int) -> torch.Tensor:
        return self._rows(level, (forwards, draws))

    def gumbel(self, level: int, forwards: int, draws: int, vocab: int) -> torch.Tensor:
        return self._rows(level, (forwards, draws, vocab))


def forward_slice(level: int, topk: int) -> slice:
    """Forwarded-node indices f of draft level ``level`` (0: the root; l: beams of forward l - 1)."""
    return slice(0, 1) if level == 0 else slice(1 + (level - 1) * topk, 1 + level * topk)
