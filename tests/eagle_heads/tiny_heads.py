"""Head-training inputs shared by the head tests: random-token features of a tiny target and an
EAGLE-3 head initialised from it."""

from __future__ import annotations

import torch

from eagle_heads.data import FeatureSet, target_hidden_states
from eagle_heads.eagle3 import Eagle3HeadConfig
from eagle_heads.eagle3_train import init_head_from_target, select_draft_vocab
from sglang_hsd.runtime.eagle3 import Eagle3Head

CAPTURES = [1, 3, 5]  # EAGLE-3 capture points of the 6-layer target: after 1, 3 and 5 layers
PROMPT_LEN = 4  # every sequence's first 4 tokens count as its prompt


def random_features(target, boundaries=CAPTURES, num_seqs=10, length=24, seed=0) -> FeatureSet:
    """``num_seqs`` uniformly random token sequences of ``length`` tokens and the target's hidden
    states after each of ``boundaries`` layers (and the last layer)."""
    gen = torch.Generator().manual_seed(seed)
    tokens, hidden = [], {b: [] for b in (*boundaries, target.num_layers)}
    for _ in range(num_seqs):
        seq = torch.randint(target.vocab_size, (length,), generator=gen).tolist()
        states = target_hidden_states(target, seq, list(boundaries))
        tokens.append(torch.tensor(seq))
        for b in hidden:
            hidden[b].append(states[b])
    return FeatureSet(torch.cat(tokens), torch.arange(num_seqs + 1) * length, torch.full((num_seqs,), PROMPT_LEN),
                      {b: torch.cat(v) for b, v in hidden.items()}, {})


def make_eagle3_head(target, features: FeatureSet, draft_vocab=32, seed=0) -> tuple[Eagle3Head, Eagle3HeadConfig]:
    """A target-initialised EAGLE-3 head over ``CAPTURES`` (eval mode) and its config."""
    kept = select_draft_vocab(target, features, draft_vocab)
    config = Eagle3HeadConfig.for_target(target.config, len(kept), aux_layer_ids=[c - 1 for c in CAPTURES])
    head = Eagle3Head(config.to_hf_dict(), target)
    init_head_from_target(head, target, kept, seed, std=0.2)
    return head.eval(), config
