"""Pearson chi-square tests for the distribution checks of the verifiers and the runtime.

One implementation for every statistical test (package oracles, test suites, benchmarks):
goodness of fit against exact probabilities, and two samples against each other. Both pool
categories whose expected count is too small for the chi-square approximation.
"""

from __future__ import annotations

import torch

# Cells expected to hold fewer counts than this are pooled: the chi-square approximation of the
# statistic's law fails for tiny expected counts (one stray count in a 0.8-expected cell alone
# would read as p ~ 1e-6).
MIN_EXPECTED_COUNT = 5.0


def chi_square_p_value(observed: torch.Tensor, expected_probs: torch.Tensor) -> float:
    """Pearson chi-square goodness-of-fit p-value, pooling cells with small expected counts.

    Args:
        observed: counts [C]; expected_probs: probabilities [C] summing to 1.
    Returns:
        The p-value (small: the counts were not drawn from ``expected_probs``).
    """
    observed = observed.double()
    expected = expected_probs.double() * observed.sum()
    small = expected < MIN_EXPECTED_COUNT
    if bool(small.any()):
        observed = torch.cat([observed[~small], observed[small].sum().view(1)])
        expected = torch.cat([expected[~small], expected[small].sum().view(1)])
    keep = expected > 0
    stat = (((observed - expected) ** 2)[keep] / expected[keep]).sum()
    dof = torch.tensor(float(int(keep.sum()) - 1), dtype=torch.float64)
    return float(torch.special.gammaincc(dof / 2, stat / 2))


def two_sample_p_value(counts_a: torch.Tensor, counts_b: torch.Tensor) -> float:
    """Pearson chi-square p-value that two samples of counts [C] come from one distribution
    (2 x C contingency table; categories with an expected count below ``MIN_EXPECTED_COUNT`` in
    either sample are pooled)."""
    table = torch.stack([counts_a.double(), counts_b.double()])
    expected = table.sum(1, keepdim=True) * table.sum(0, keepdim=True) / table.sum()
    small = (expected < MIN_EXPECTED_COUNT).any(0)
    if bool(small.any()):
        table = torch.cat([table[:, ~small], table[:, small].sum(1, keepdim=True)], 1)
        expected = torch.cat([expected[:, ~small], expected[:, small].sum(1, keepdim=True)], 1)
    keep = expected.sum(0) > 0
    table, expected = table[:, keep], expected[:, keep]
    if table.shape[1] < 2:
        return 1.0
    stat = ((table - expected) ** 2 / expected).sum()
    dof = torch.tensor(float(table.shape[1] - 1), dtype=torch.float64)
    return float(torch.special.gammaincc(dof / 2, stat / 2))
