"""The losslessness report behind ``sglang-hsd check``: every verifier against the exact oracle."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_hsd.verify import CHAIN_METHODS, LOSSLESS_CHAIN_METHODS
from sglang_hsd.verify.oracles import exact
from sglang_hsd.verify.oracles.simulate import simulate_chain, target_prefix_probs
from sglang_hsd.verify.oracles.stats import chi_square_p_value

# Exact enumeration in float64 reaches ~1e-16; a method above this is biased.
LOSSLESS_TV = 1e-12
# A correct sampler falls below this chi-square p-value once in 10^4 runs.
SAMPLER_P_VALUE_FLOOR = 1e-4


@dataclass
class MethodReport:
    """Worst TV over the worlds for each prefix length, and the mean expected acceptance."""

    method: str
    worst_tv: dict[int, float]
    mean_accepted: float
    sampler_p_value: float | None = None  # chi-square of the batched verify_chain, if run

    @property
    def lossless(self) -> bool:
        return max(self.worst_tv.values()) < LOSSLESS_TV

    @property
    def sampler_ok(self) -> bool:
        return self.sampler_p_value is None or self.sampler_p_value > SAMPLER_P_VALUE_FLOOR


def chain_report(
    vocab_size: int = 3,
    num_draft: int = 3,
    lengths: tuple[int, ...] = (2, 3, 4),
    num_worlds: int = 3,
    seed: int = 0,
    methods: tuple[str, ...] = tuple(CHAIN_METHODS),
    sampled_sequences: int = 0,
) -> list[MethodReport]:
    """Run the exact oracle for each method on ``num_worlds`` random context-dependent worlds.

    With ``sampled_sequences`` > 0, also run the batched ``verify_chain`` itself on the first world
    for that many sequences and test its 3-token prefix frequencies against the target (chi-square).
    """
    max_len = max(lengths) - 1 + num_draft
    worlds = [exact.random_world(vocab_size, max_len, seed=seed + i) for i in range(num_worlds)]
    reports = []
    for method in methods:
        worst = {n: max(exact.prefix_tv(w, method, num_draft, n) for w in worlds) for n in lengths}
        mean = sum(exact.expected_accepted(w, method, num_draft) for w in worlds) / num_worlds
        p_value = None
        if sampled_sequences and not CHAIN_METHODS[method].deterministic:
            p_value = sampled_p_value(worlds[0], method, num_draft, max(lengths), sampled_sequences)
        reports.append(MethodReport(method, worst, mean, p_value))
    return reports


def sampled_p_value(world: exact.TabularWorld, method: str, num_draft: int, length: int, num_sequences: int) -> float:
    """Chi-square p-value of the batched sampler's ``length``-token prefixes against the target."""
    result = simulate_chain(world, method, num_draft, length, num_sequences, torch.Generator().manual_seed(0))
    return chi_square_p_value(result.prefix_counts(world.vocab_size), target_prefix_probs(world, length))


def format_report(reports: list[MethodReport]) -> str:
    lengths = list(reports[0].worst_tv)
    header = ["method"] + [f"TV {n}-tok" for n in lengths]
    header += ["E[accepted]/round", "sampler chi2 p", "verdict", "claim"]
    rows = []
    for r in reports:
        claim = "lossless" if r.method in LOSSLESS_CHAIN_METHODS else "lossy"
        verdict = "lossless" if r.lossless else "LOSSY"
        if not r.sampler_ok:
            verdict += ", SAMPLER BIASED"
        sampled = "-" if r.sampler_p_value is None else f"{r.sampler_p_value:.3g}"
        tvs = [f"{r.worst_tv[n]:.2e}" for n in lengths]
        rows.append([r.method, *tvs, f"{r.mean_accepted:.4f}", sampled, verdict, claim])
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]

    def line(cells):
        return "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def report_is_consistent(reports: list[MethodReport]) -> bool:
    """True when every method claimed lossless is lossless and its sampler passes the chi-square test."""
    return all(r.lossless and r.sampler_ok for r in reports if r.method in LOSSLESS_CHAIN_METHODS)
