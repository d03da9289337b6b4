"""The exit level's counters (``ExitLevelStats``) on one hand-checked greedy round."""

import torch

from sglang_hsd.sglang_plugin.exit_stats import ExitLevelStats
from sglang_hsd.verify import ChainUniforms
from sglang_hsd.verify.window_round import exit_round, target_round


def test_counters_of_a_greedy_round():
    V, K = 5, 3
    eye = torch.eye(V, dtype=torch.float64)
    drafts = torch.tensor([[1, 2, 3], [1, 2, 3]])
    exit_argmax = torch.tensor([[1, 2, 4, 0], [1, 2, 3, 4]])  # row 0: exit rejects d_3
    target_argmax = torch.tensor([[1, 0, 0, 0], [1, 2, 3, 4]])  # row 0: target rejects c_2
    proposal = exit_round(drafts, eye[drafts], eye[exit_argmax], "hsd",
                          ChainUniforms(torch.full((2, K), 0.5), torch.full((2,), 0.5)))
    result, target_accepted = target_round(
        proposal, eye[target_argmax], "hsd",
        ChainUniforms(torch.full((2, K + 1), 0.5), torch.full((2,), 0.5)))
    stats = ExitLevelStats()
    stats.add_round(K, 2, 6, proposal, result, target_accepted)
    # Emitted: row 0 keeps c_1 and the target's token, row 1 the whole chain (no bonus).
    # Layer forwards: 2 x 4 window positions through layers [0, 2), 3 + 4 chain positions
    # through layers [2, 6).
    assert stats.emitted == 2 + 4 and stats.layer_forwards == 2 * 4 * 2 + 7 * 4
    assert stats.as_dict()["exit_accept_rate"] == (2 + 3) / (2 * K)
