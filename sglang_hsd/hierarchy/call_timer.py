"""The timer behind the round planner's call tables (``round_costs.measure_round_costs``).

A call on n rows is timed as the runtime runs it, at batch 1 on a KV cache warmed to
``context_len`` positions and rolled back after each timing; every figure is the median of
``repeats`` calls after one untimed call (first calls on fresh packed weights page-fault).
"""

from __future__ import annotations

import time

import torch

from sglang_hsd.hierarchy.measure import draw_seconds
from sglang_hsd.hierarchy.tree_costs import tree_round_extra, tree_round_seconds
from sglang_hsd.runtime.model import CausalLM
from sglang_hsd.runtime.timing import median_seconds
from sglang_hsd.sampling import SamplingParams, logits_to_probs


class CallTimer:
    """Times calls of the runtime's shape on warmed KV caches of ``context_len`` positions."""

    def __init__(self, models: list[CausalLM], params: SamplingParams, context_len: int, max_rows: int,
                 repeats: int) -> None:
        self.params, self.repeats = params, repeats
        self.generator = torch.Generator().manual_seed(0)
        self.caches, self.bases = {}, {}
        for model in models:
            cache = model.new_cache(1, context_len + max_rows + 1)
            prompt = torch.randint(0, model.vocab_size, (1, context_len), generator=self.generator)
            model.forward_layers(model.embed(prompt), 0, model.num_layers, cache)
            self.caches[id(model)], self.bases[id(model)] = cache, cache.lengths[0].clone()

    def call(self, model: CausalLM, lo: int, hi: int, n: int, head=None, extra: tuple[int, int] | None = None) -> float:
        """Median seconds of layers [lo, hi) on n rows, the head and the transform on all n rows;
        ``extra``: also layers extra[0]..extra[1] on the last row (an exit drafter's catch-up)."""
        cache, base = self.caches[id(model)], self.bases[id(model)]
        hidden = torch.randn(1, n, model.hidden_size, generator=self.generator)

        def run():
            out = model.forward_layers(hidden, lo, hi, cache)
            if extra is not None:
                model.forward_layers(hidden[:, -1:], extra[0], extra[1], cache)
            logits_to_probs(model.exit_logits(out, head), self.params)
            cache.truncate(base)

        return self.median(run)

    def middle_calls(self, target: CausalLM, layers, heads, rows, chains) -> tuple[tuple, tuple]:
        """Per middle layer L, seconds on each of ``rows`` rows of the exit's call (layers [0, L),
        ``heads[L]`` or the lens) and of the target's call above it (layers [L, N), [0, L) on the
        last row), each plus ``chains`` (``verify_chain`` of n - 1 drafts, per row count)."""
        middle = tuple(tuple(self.call(target, 0, layer, n, heads.get(layer)) + c for n, c in zip(rows, chains))
                       for layer in layers)
        tail = tuple(tuple(self.call(target, layer, target.num_layers, n, extra=(0, layer)) + c
                           for n, c in zip(rows, chains)) for layer in layers)
        return middle, tail

    def prefill(self, model: CausalLM, n: int) -> float:
        """Seconds of one cold prefill of n positions on a fresh cache: every layer on n rows, the
        head and the transform on the last (module docstring)."""
        cache = model.new_cache(1, n)
        prompt = torch.randint(0, model.vocab_size, (1, n), generator=self.generator)
        start = time.perf_counter()
        hidden = model.forward_layers(model.embed(prompt), 0, model.num_layers, cache)
        logits_to_probs(model.exit_logits(hidden[:, -1:], None), self.params)
        return time.perf_counter() - start

    def verify_chain(self, vocab: int, n: int) -> float:
        """Median seconds of ``verify_chain`` on n - 1 drafts (0 for n = 1)."""
        from sglang_hsd.verify.chain import verify_chain

        if n == 1:
            return 0.0
        probs = torch.softmax(torch.randn(1, n, vocab, generator=self.generator), -1)
        tokens = torch.randint(0, vocab, (1, n - 1), generator=self.generator)
        return self.median(lambda: verify_chain(tokens, probs[:, : n - 1], probs, generator=self.generator,
                                                validate=False))

    def lookup(self, vocab: int, context_len: int, ngram: int) -> float:
        """Median seconds of a lookup over ``context_len`` random tokens that finds nothing."""
        from sglang_hsd.lookup_draft import lookup_continuation

        context = torch.randperm(max(vocab, context_len), generator=self.generator)[:context_len]
        return self.median(lambda: lookup_continuation(context, ngram, 1))

    def sample(self, vocab: int) -> float:
        """Median seconds of one draw over ``vocab`` tokens as the runtime draws (``draw_seconds``)."""
        return draw_seconds(vocab, self.generator, self.repeats, warmup=1)

    def median(self, fn) -> float:
        return median_seconds(fn, self.repeats, warmup=1)  # after one untimed call

    def tree_rounds(self, trees, vocab: int, sample_seconds: float) -> tuple[float, ...]:
        """``tree_costs.tree_round_extra`` of a round of each ``TreeShape`` in ``trees``."""
        return tuple(tree_round_extra(tree, tree_round_seconds(tree, vocab, self.params, self.median, self.generator),
                                      self.verify_chain(vocab, tree.num_draft_tokens), sample_seconds)
                     for tree in trees)

