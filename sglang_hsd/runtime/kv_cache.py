"""Per-layer KV cache with independent per-layer lengths.

Hierarchical speculative decoding runs the target's first ``L_i`` layers (the early-exit
verifier) ahead of the remaining layers: layers ``[0, L_i)`` may have cached more positions
than layers ``[L_i, N)``, and the late layers later catch up on those positions from saved
hidden states. The cache therefore tracks one length per (layer, row) instead of one per row.

Layout conventions (used throughout this module):

* ``N`` layers, ``B`` rows, ``H_kv`` key/value heads, ``Dh`` head dim, ``S = max_len`` slots.
* Slot ``s`` of a row holds the token at sequence position ``s`` once decoded as a chain;
  while a draft tree is being verified, the tree's nodes occupy consecutive slots from the
  row's old length (see :meth:`KVCache.keep`).
* ``lengths[l, b]``: number of valid slots of row ``b`` in layer ``l``. Slots ``>= length``
  hold stale data and are never attended to.
* Physical storage has one extra *scratch* slot (index ``S``) per row: writes of right-padding
  tokens are routed there, so ragged writes need no boolean indexing (no host sync) and can
  never clobber a valid slot, even when a row's cache is exactly full.
"""

from __future__ import annotations

import torch

__all__ = ["KVCache"]


class KVCache:
    """Static K/V buffers for ``num_layers`` layers and ``batch_size`` rows.

    Attributes:
        lengths: ``LongTensor[N, B]``, valid slots per layer and row.
        max_len: usable slots per row (``S``).
    """

    def __init__(
        self,
        num_layers: int,
        batch_size: int,
        num_kv_heads: int,
        head_dim: int,
        max_len: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        for name, value in (
            ("num_layers", num_layers),
            ("batch_size", batch_size),
            ("num_kv_heads", num_kv_heads),
            ("head_dim", head_dim),
            ("max_len", max_len),
        ):
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        self.num_layers = num_layers
        self.batch_size = batch_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.max_len = max_len
        shape = (num_layers, batch_size, num_kv_heads, max_len + 1, head_dim)
        # Zero-filled (not empty) so that stale or scratch slots are always finite.
        self._k = torch.zeros(shape, dtype=dtype, device=device)
        self._v = torch.zeros(shape, dtype=dtype, device=device)
        self.lengths = torch.zeros(num_layers, batch_size, dtype=torch.long, device=device)

    # ------------------------------------------------------------------ views
    @property
    def scratch_slot(self) -> int:
        """Index of the per-row slot that absorbs writes of padding tokens."""
        return self.max_len

    @property
    def dtype(self) -> torch.dtype:
        return self._k.dtype

    @property
    def device(self) -> torch.device:
        return self._k.device

    def keys(self, layer: int) -> torch.Tensor:
        """K buffer of ``layer``: ``[B, H_kv, S, Dh]`` (a view, scratch slot excluded)."""
        self._check_layer(layer)
        return self._k[layer, :, :, : self.max_len]

    def values(self, layer: int) -> torch.Tensor:
        """V buffer of ``layer``: ``[B, H_kv, S, Dh]`` (a view, scratch slot excluded)."""
        self._check_layer(layer)
        return self._v[layer, :, :, : self.max_len]

    def lengths_for(self, layer: int) -> torch.Tensor:
        """Valid slots per row of ``layer``: ``LongTensor[B]`` (a view)."""
        self._check_layer(layer)
        return self.lengths[layer]

    # ------------------------------------------------------------ write path
    def write(self, layer: int, key: torch.Tensor, value: torch.Tensor, slots: torch.Tensor) -> None:
        """Store new K/V of one layer at explicit slots (lengths are NOT advanced).

        Args:
            key, value: ``[B, T, H_kv, Dh]`` for the new tokens.
            slots: ``LongTensor[B, T]``; slot per token, ``scratch_slot`` for padding tokens.
        """
        rows = torch.arange(self.batch_size, device=slots.device)[:, None].expand_as(slots)
        # Advanced indices around a slice put the indexed dims first: target is [B, T, H_kv, Dh].
        self._k[layer][rows, :, slots] = key.to(self.dtype)
        self._v[layer][rows, :, slots] = value.to(self.dtype)

    def window(self, layer: int, kv_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of ``layer`` over slots ``[0, kv_len)``: two ``[B, H_kv, kv_len, Dh]`` views."""
        return self._k[layer, :, :, :kv_len], self._v[layer, :, :, :kv_len]

    # ------------------------------------------------------------- rollback
    def truncate(self, new_lengths: torch.Tensor, layers: range | None = None) -> None:
        """Roll back rejected positions: set ``lengths[l] = new_lengths`` for ``l in layers``.

        Args:
            new_lengths: ``LongTensor[B]``; must not exceed the current length of any layer
                in ``layers`` (lengths may only shrink) and must be ``>= 0``.
            layers: layer range to roll back; default all layers.

        Raises:
            ValueError: on a shape mismatch, a negative length, or an attempt to grow.
        """
        layers = self._check_range("layers", layers)
        new_lengths = self._check_rows("new_lengths", new_lengths)
        current = self.lengths[layers.start : layers.stop]
        if bool((new_lengths < 0).any()):
            raise ValueError(f"new_lengths must be >= 0, got {new_lengths.tolist()}")
        if bool((new_lengths[None, :] > current).any()):
            raise ValueError(
                "new_lengths may only shrink the cache: got "
                f"{new_lengths.tolist()} but layers {layers} hold {current.tolist()}"
            )
        current.copy_(new_lengths[None, :].expand_as(current))

    def keep(
        self,
        layer_range: range,
        start: torch.Tensor,
        keep_index: torch.Tensor,
        keep_len: torch.Tensor,
    ) -> None:
        """Keep an accepted subset of a verified draft tree and compact it.

        The tree's ``T`` nodes were written at slots ``start[b] + i`` (node ``i``). Afterwards,
        node ``keep_index[b, j]`` sits at slot ``start[b] + j`` for ``j < keep_len[b]`` and
        ``lengths[l, b] = start[b] + keep_len[b]`` for every ``l`` in ``layer_range``.

        Args:
            layer_range: layers to compact.
            start: ``LongTensor[B]``, slot of node 0 (the row's length before the tree).
            keep_index: ``LongTensor[B, K]``, node indices relative to ``start`` in the order
                they are to be kept; entries at ``j >= keep_len[b]`` are ignored.
            keep_len: ``LongTensor[B]``, number of kept nodes per row, ``0 <= keep_len <= K``.

        Raises:
            ValueError: on a shape mismatch or indices outside the written tree.
        """
        layer_range = self._check_range("layer_range", layer_range)
        start = self._check_rows("start", start)
        keep_len = self._check_rows("keep_len", keep_len)
        if keep_index.dim() != 2 or keep_index.shape[0] != self.batch_size:
            raise ValueError(
                f"keep_index must be [B={self.batch_size}, K], got {tuple(keep_index.shape)}"
            )
        keep_index = keep_index.to(device=self.device, dtype=torch.long)
        num_keep = keep_index.shape[1]
        used = torch.arange(num_keep, device=self.device)[None, :] < keep_len[:, None]  # [B, K]
        src = start[:, None] + keep_index  # [B, K]
        self._check_keep_bounds(layer_range, start, src, used, keep_len, num_keep)

        src = torch.where(used, src, self.scratch_slot)
        dst = torch.where(used, start[:, None] + torch.arange(num_keep, device=self.device), self.scratch_slot)
        rows = torch.arange(self.batch_size, device=self.device)[:, None].expand_as(src)
        for buffer in (self._k, self._v):
            layers = buffer[layer_range.start : layer_range.stop]  # [n, B, H_kv, S+1, Dh]
            # Gather first (a copy), then scatter: safe even when source and target slots overlap.
            kept = layers[:, rows, :, src]  # [B, K, n, H_kv, Dh]
            layers[:, rows, :, dst] = kept
        self.lengths[layer_range.start : layer_range.stop] = (start + keep_len)[None, :]

    # ------------------------------------------------------------ validation
    def _check_layer(self, layer: int) -> None:
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer must be in [0, {self.num_layers}), got {layer}")

    def _check_range(self, name: str, layers: range | None) -> range:
        if layers is None:
            return range(self.num_layers)
        if not isinstance(layers, range) or layers.step != 1:
            raise ValueError(f"{name} must be a range with step 1, got {layers!r}")
        if not 0 <= layers.start < layers.stop <= self.num_layers:
            raise ValueError(f"{name} must lie within [0, {self.num_layers}) and be non-empty, got {layers!r}")
        return layers

    def _check_rows(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        if not isinstance(tensor, torch.Tensor) or tensor.shape != (self.batch_size,):
            shape = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise ValueError(f"{name} must be a LongTensor of shape [B={self.batch_size}], got {shape}")
        return tensor.to(device=self.device, dtype=torch.long)

    def _check_keep_bounds(
        self,
        layer_range: range,
        start: torch.Tensor,
        src: torch.Tensor,
        used: torch.Tensor,
        keep_len: torch.Tensor,
        num_keep: int,
    ) -> None:
        """One host sync: keep() runs once per verification step, not per layer."""
        lengths = self.lengths[layer_range.start : layer_range.stop]
        bad_len = (keep_len < 0) | (keep_len > num_keep)
        bad_start = (start < 0) | (start[None, :] > lengths).any(0)
        bad_src = used & ((src < start[:, None]) | (src >= lengths.min(0).values[:, None]))
        if bool(bad_len.any()):
            raise ValueError(f"keep_len must be in [0, {num_keep}], got {keep_len.tolist()}")
        if bool(bad_start.any()):
            raise ValueError(f"start must be in [0, lengths] of layers {layer_range}, got {start.tolist()}")
        if bool(bad_src.any()):
            raise ValueError(
                "keep_index must point at written tree nodes (start + keep_index < length of every "
                f"layer in {layer_range}); got keep_index rows with out-of-range entries"
            )
