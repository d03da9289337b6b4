"""Draft q on the target vocabulary.

EAGLE-3 heads usually predict over a reduced draft vocabulary and map each draft id d to the
target id ``hot_token_id[d] = d + d2t[d]``. The verifier compares q with the target's p row by
row, so q must be indexed by target ids: ``scatter_draft_probs`` puts each draft id's mass at its
target id and 0 elsewhere, which is exactly the distribution the mapped draft token was drawn
from. Whether the map is the identity (q already indexed by target ids) is decided by its
content, not its width: a head may map a full-width draft vocabulary to a permutation of the
target's. ``is_identity_map`` decides it once, when the draft worker loads the map (one host
sync); the callers pass the answer in. Used by the draft workers (``draft_worker.py``), the sampled
tree loop (``tree_draft.py``) and exit sub-round drafting (``draft_continuation.py``).
"""

from __future__ import annotations

import torch


def is_identity_map(hot_token_id: torch.Tensor | None, target_vocab_size: int) -> bool:
    """Whether draft id d is target id d for every target id (no map: the draft has the target's
    vocabulary). One host sync: call it when the map is loaded, not per step.

    Args:
        hot_token_id: int [Vd], target id of each draft id, or None.
        target_vocab_size: Vt.
    """
    if hot_token_id is None:
        return True
    if hot_token_id.shape[0] != target_vocab_size:
        return False
    return bool(torch.equal(hot_token_id.to(torch.int64),
                            torch.arange(target_vocab_size, device=hot_token_id.device)))


def scatter_draft_probs(draft_probs: torch.Tensor, hot_token_id: torch.Tensor,
                        target_vocab_size: int, *, is_identity: bool) -> torch.Tensor:
    """Scatter q from the draft vocabulary into the target vocabulary.

    Args:
        draft_probs: float [..., Vd], rows of q over draft ids.
        hot_token_id: int [Vd], target id of each draft id (draft_id + d2t[draft_id]); distinct.
        target_vocab_size: Vt >= Vd.
        is_identity: ``is_identity_map(hot_token_id, target_vocab_size)``, decided when the map
            was loaded.
    Returns:
        float [..., Vt] with ``out[..., hot_token_id[d]] = draft_probs[..., d]`` and 0 elsewhere
        (``draft_probs`` itself for the identity map).
    """
    if is_identity:
        if draft_probs.shape[-1] != target_vocab_size:
            raise ValueError(f"is_identity: draft_probs has width {draft_probs.shape[-1]}, not the "
                             f"target vocabulary's {target_vocab_size}, so the map is not the identity")
        return draft_probs
    out = draft_probs.new_zeros(*draft_probs.shape[:-1], target_vocab_size)
    index = hot_token_id.to(device=draft_probs.device, dtype=torch.int64)
    return out.index_copy_(-1, index, draft_probs)
