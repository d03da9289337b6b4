"""Measure what the planner needs: pairwise acceptance of candidate exits, and per-level costs.

Acceptance: one teacher-forced pass of the target over each prompt plus a short greedy
continuation, keeping the hidden state at every candidate exit; each exit's distribution is its
exit head (final norm + LM head by default, or a trained head) under the request's sampling
parameters (``logits_to_probs``, as every runtime level does). alpha_{i,j} is the mean over the
continuation's positions of sum_v min(p_i(v), p_j(v)) = 1 - TV(p_i, p_j): the probability that
level j accepts a token level i sampled (for temperature 0 the rows are one-hot and alpha is
the argmax agreement rate, which is what greedy verification accepts).

Costs: decode-like timings on this machine (batch 1, a KV cache of ``context_len`` positions),
medians over repeats; see ``costs.py`` for how they compose.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from sglang_hsd.hierarchy.costs import LayerCosts
from sglang_hsd.runtime.model import CausalLM
from sglang_hsd.runtime.timing import median_seconds
from sglang_hsd.sampling import SamplingParams, logits_to_probs
from sglang_hsd.verify.common import inverse_cdf_sample


@torch.inference_mode()
def target_continuation(
    model: CausalLM,
    prompt: list[int],
    num_tokens: int,
    params: SamplingParams = SamplingParams(0.0),
    generator: torch.Generator | None = None,
) -> list[int]:
    """``num_tokens`` tokens of the target after ``prompt`` (prompt excluded): greedy at
    temperature 0, else drawn from its distribution under ``params`` with ``generator``."""
    cache = model.new_cache(1, len(prompt) + num_tokens + 1)
    ids = torch.tensor([prompt])
    out = []
    for _ in range(num_tokens):
        logits = model.forward(ids, cache)[:, -1]
        if params.temperature == 0.0:
            ids = logits.argmax(-1, keepdim=True)
        else:
            ids = torch.multinomial(logits_to_probs(logits, params), 1, generator=generator)
        out.append(int(ids))
    return out


@torch.inference_mode()
def exit_probs(
    model: CausalLM,
    ids: list[int],
    exits: Sequence[int],
    positions: slice,
    params: SamplingParams,
    exit_heads: dict | None = None,
) -> torch.Tensor:
    """Distributions of every exit (and the target, last) at ``positions`` of one sequence.

    One pass: layers run group by group between consecutive exits over the whole sequence.
    Returns float32 [len(exits) + 1, P, V].
    """
    heads = exit_heads or {}
    cache = model.new_cache(1, len(ids))
    hidden = model.embed(torch.tensor([ids]))
    bounds = list(exits) + [model.num_layers]
    rows, start = [], 0
    for end in bounds:
        hidden = model.forward_layers(hidden, start, end, cache)
        head = heads.get(end) if end < model.num_layers else None
        logits = model.exit_logits(hidden[:, positions], head)
        rows.append(logits_to_probs(logits, params)[0])
        start = end
    return torch.stack(rows)


def pairwise_acceptance(probs: torch.Tensor) -> tuple[np.ndarray, int]:
    """Sum over positions of 1 - TV for every level pair.

    Args:
        probs: float [K + 1, P, V].
    Returns:
        (float64 [K + 1, K + 1] sums, upper triangle filled (i < j), P).
    """
    num = probs.shape[0]
    sums = np.zeros((num, num))
    for i in range(num):
        overlap = torch.minimum(probs[i : i + 1], probs[i + 1 :]).sum(-1)  # [K - i, P]
        sums[i, i + 1 :] = overlap.double().sum(-1).numpy()
    return sums, probs.shape[1]


def measure_acceptance(
    model: CausalLM,
    prompts: Sequence[list[int]],
    exits: Sequence[int],
    params: SamplingParams = SamplingParams(0.0),
    continuation: int = 32,
    exit_heads: dict | None = None,
) -> np.ndarray:
    """Mean alpha_{i,j} = 1 - TV(p_i, p_j) over the continuation positions of every prompt.

    Args:
        prompts: token id lists.
        exits: candidate exit layers, increasing, each in [1, N).
        continuation: greedy tokens generated after each prompt; alpha is averaged over the
            positions predicting them (the prompt itself is not decoded, so it is skipped).
    Returns:
        float64 [len(exits) + 1, len(exits) + 1], upper triangle; id len(exits) is the target.
    """
    exits = list(exits)
    if exits != sorted(set(exits)) or not all(1 <= e < model.num_layers for e in exits):
        raise ValueError(f"exits must increase strictly inside [1, {model.num_layers}), got {exits}")
    total, count = np.zeros((len(exits) + 1, len(exits) + 1)), 0
    for prompt in prompts:
        tail = target_continuation(model, prompt, continuation)
        ids = list(prompt) + tail
        probs = exit_probs(model, ids, exits, slice(len(prompt) - 1, len(ids) - 1), params, exit_heads)
        sums, positions = pairwise_acceptance(probs)
        total += sums
        count += positions
    return total / count


def draw_seconds(vocab: int, generator: torch.Generator, repeats: int, warmup: int = 2) -> float:
    """Median seconds of one token drawn from a [1, vocab] distribution as the runtime draws it
    (``Engine._sample``: inverse CDF with one uniform). ``torch.multinomial`` costs about 3x as much
    over 152k tokens, so timing it would overprice every drafted token."""
    q = torch.softmax(torch.randn(1, vocab, generator=generator), -1)
    return median_seconds(lambda: inverse_cdf_sample(q, torch.rand(1, generator=generator)), repeats, warmup=warmup)


@torch.inference_mode()
def measure_costs(
    model: CausalLM,
    exits: Sequence[int],
    context_len: int = 128,
    token_counts: Sequence[int] = (1, 2, 4, 8, 12, 17, 24, 33),
    repeats: int = 9,
    params: SamplingParams = SamplingParams(0.0),
    exit_head=None,
) -> tuple[LayerCosts, dict[int, float]]:
    """Time the runtime's pieces at batch 1 with a ``context_len``-position KV cache.

    Returns:
        (``LayerCosts``, seconds of a forward of layers [0, L) on 1 token for each exit L and
        for N).
    """
    from sglang_hsd.verify.chain import verify_chain

    hidden_size, vocab = model.hidden_size, model.vocab_size
    cache = model.new_cache(1, context_len + max(token_counts) + 1)
    model.forward_layers(model.embed(torch.randint(0, vocab, (1, context_len))), 0, model.num_layers, cache)
    base = cache.lengths[0].clone()
    generator = torch.Generator().manual_seed(0)

    def forward(lo: int, hi: int, n: int) -> float:
        hidden = torch.randn(1, n, hidden_size, generator=generator)

        def run():
            model.forward_layers(hidden, lo, hi, cache)
            cache.truncate(base, layers=range(lo, hi))

        return median_seconds(run, repeats)

    prefix = {end: forward(0, end, 1) for end in list(exits) + [model.num_layers]}
    layer_s, call_s, head_s, verify_s = [], [], [], []
    for n in token_counts:
        one = forward(0, 1, n)
        full = prefix[model.num_layers] if n == 1 else forward(0, model.num_layers, n)
        per_layer = max((full - one) / (model.num_layers - 1), 0.0)
        layer_s.append(per_layer)
        call_s.append(max(one - per_layer, 0.0))
        hidden = torch.randn(1, n, hidden_size, generator=generator)
        head_s.append(median_seconds(lambda: logits_to_probs(model.exit_logits(hidden, exit_head), params), repeats))
        probs = torch.softmax(torch.randn(1, n + 1, vocab, generator=generator), -1)
        draft = torch.randint(0, vocab, (1, n), generator=generator)
        verify_s.append(median_seconds(
            lambda: verify_chain(draft, probs[:, :n], probs, generator=generator, validate=False), repeats
        ))
    sample = draw_seconds(vocab, generator, repeats)
    # More tokens never cost less; on a shared machine single medians can say otherwise.
    monotone = [tuple(np.maximum.accumulate(v).tolist()) for v in (layer_s, call_s, head_s, verify_s)]
    costs = LayerCosts(tuple(exits), model.num_layers, tuple(token_counts), *monotone, sample)
    return costs, prefix
