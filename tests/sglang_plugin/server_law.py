"""Law tests against a running server: a rejection is confirmed on a fresh, larger sample.

The library's statistical tests fix their seeds, so each is one deterministic draw. A server's
random streams are its own and its batches form by timing (concurrent requests), so a server law
test is a new draw on every run, and a single test at level alpha fails a correct server in a
fraction alpha of runs. ``confirmed_p_values`` tests a first sample at alpha and, only when that
sample rejects, draws ``confirm_factor`` times as many fresh samples and lets them decide:

* a correct server fails with probability alpha * alpha (both samples reject);
* a persistent bias that the first sample detects is detected again by the larger second one,
  which has more power (its p-value shrinks with the sample size).

What this gives up: a fault that shows in one sample and not in the next (an intermittent one)
passes. The first rejection is therefore reported as a warning, which appears in the run's
warnings summary, so a recurring one is seen.
"""

from __future__ import annotations

import warnings
from typing import Callable

ALPHA = 1e-3


def confirmed_p_values(p_value_of: Callable[[int], float], samples: int, what: str,
                       alpha: float = ALPHA, confirm_factor: int = 4) -> list[float]:
    """The p-values of a law test with a confirmed rejection.

    Args:
        p_value_of: n -> p-value of the law test on n fresh draws from the server.
        samples: size of the first sample.
        what: names the test in the warning.
        alpha: the level of each sample's test.
        confirm_factor: the confirming sample has ``confirm_factor * samples`` draws.
    Returns:
        [p_first] when the first sample does not reject, else [p_first, p_confirm]; the law is
        rejected when the last is <= alpha.
    """
    if samples < 1 or confirm_factor < 1:
        raise ValueError(f"samples and confirm_factor must be >= 1, got {samples}, {confirm_factor}")
    first = p_value_of(samples)
    if first > alpha:
        return [first]
    warnings.warn(f"{what}: the first sample of {samples} rejected the law (p = {first:.3g}); "
                  f"confirming on {confirm_factor * samples} fresh draws")
    return [first, p_value_of(confirm_factor * samples)]


def sglang_sampler_law(probs, top_ks, top_ps, min_ps):
    """The distribution SGLang's non-speculative torch sampler (``sampler.
    top_k_top_p_min_p_sampling_from_probs_torch``, the CPU server's) draws from.

    Args:
        probs: float [B, V], softmax(logits / T).
        top_ks: int [B] (2^30: off); top_ps, min_ps: float [B] (1 / 0: off).
    Returns:
        float [B, V], the filtered rows renormalised.
    """
    from sglang.srt.layers.sampler import top_k_top_p_min_p_sampling_from_probs_torch

    _, kept, order, _ = top_k_top_p_min_p_sampling_from_probs_torch(
        probs.clone(), top_ks, top_ps, min_ps, True, None, None, return_filtered_probs=True)
    law = probs.new_zeros(probs.shape).scatter_(1, order.long(), kept)
    return law / law.sum(-1, keepdim=True)
