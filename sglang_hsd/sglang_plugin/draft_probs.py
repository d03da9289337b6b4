"""Draft q on the target vocabulary.

EAGLE-3 heads usually predict over a reduced draft vocabulary and map each draft id d to the
target id ``hot_token_id[d] = d + d2t[d]``. The verifier compares q with the target's p row by
row, so q must have the target's width: ``scatter_draft_probs`` puts each draft id's mass at its
target id and 0 elsewhere, which is exactly the distribution the mapped draft token was drawn
from. Used by the draft worker (``draft_worker.py``) and by exit sub-round drafting
(``draft_continuation.py``).
"""

from __future__ import annotations

import torch


def scatter_draft_probs(draft_probs: torch.Tensor, hot_token_id: torch.Tensor,
                        target_vocab_size: int) -> torch.Tensor:
    """Scatter q from the draft vocabulary into the target vocabulary.

    Args:
        draft_probs: float [..., Vd], rows of q over draft ids.
        hot_token_id: int [Vd], target id of each draft id (draft_id + d2t[draft_id]); distinct.
        target_vocab_size: Vt >= Vd.
    Returns:
        float [..., Vt] with ``out[..., hot_token_id[d]] = draft_probs[..., d]`` and 0 elsewhere
        (``draft_probs`` itself when Vd == Vt).
    """
    if draft_probs.shape[-1] == target_vocab_size:
        return draft_probs
    out = draft_probs.new_zeros(*draft_probs.shape[:-1], target_vocab_size)
    index = hot_token_id.to(device=draft_probs.device, dtype=torch.int64)
    return out.index_copy_(-1, index, draft_probs)
