"""A round that drafts nothing (``--hsd-adaptive`` chose length 0) draws its one token from p."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("sglang")


def test_empty_chain_draws_from_the_target_row():
    from sglang_hsd.sglang_plugin.verify_outputs import empty_chain_result

    p = torch.tensor([[0.1, 0.0, 0.6, 0.3], [0.0, 1.0, 0.0, 0.0]])
    grid = 10_000
    u = (torch.arange(grid, dtype=torch.float32) + 0.5) / grid  # a uniform grid of coins
    result = empty_chain_result(p.repeat_interleave(grid, 0), u.repeat(2))
    assert result.tokens.shape == (2 * grid, 1) and not result.num_accepted.any()
    for row in range(2):
        counts = torch.bincount(result.tokens[row * grid:(row + 1) * grid, 0], minlength=4)
        torch.testing.assert_close(counts / grid, p[row], atol=2 / grid, rtol=0)
