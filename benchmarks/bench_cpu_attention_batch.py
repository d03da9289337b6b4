"""What a decode round's attention costs the CPU server: one batched call per layer against the
per-request loop it replaced (``sglang_plugin/cpu/batched_attention.py``).

A round of B requests runs the stand-ins of ``sglang_plugin/cpu/kernel_ops.py`` once per layer:
``decode_attention_cpu`` for plain decoding and draft steps, ``extend_attention_cpu`` for a verify
(one query row per request when the round drafted nothing, L + 1 for a chain of L). This times a
whole round (every layer, each with its own cache, as in a forward where one layer's keys evict
the previous one's) of each call, batched and looped (``BATCHED_MAX_SCORES = 0``), over requests
of random cached lengths around a mean, at Qwen2.5-Coder-1.5B's heads (12 query heads, 2 KV heads
of 128, 28 layers). Same inputs for both; the largest absolute difference of their outputs is
kept.

    PYTHONPATH=. python benchmarks/bench_cpu_attention_batch.py
    PYTHONPATH=. python benchmarks/bench_cpu_attention_batch.py --batches 2 --contexts 64 \\
        --repeats 1 --name cpu_attention_batch_smoke

Results: ``results/<name>.{json,md}`` (default ``cpu_attention_batch``) with the commit, the
command and the machine load (``benchmarks/common.py``): milliseconds per round (median of
``--repeats`` after one warm-up) and the ratio looped / batched. Timings mean something only on
an idle machine.
"""

from __future__ import annotations

from pathlib import Path

import torch

from benchmarks.bench_cpu_attention import median_ms
from benchmarks.common import RESULTS_DIR, benchmark_parser, start_run, write_results
from sglang_hsd.sglang_plugin.cpu import batched_attention
from sglang_hsd.sglang_plugin.cpu.kernel_ops import decode_attention_cpu, extend_attention_cpu

HEADS, KV_HEADS, HEAD_DIM, LAYERS = 12, 2, 128, 28  # Qwen2.5-Coder-1.5B
POOL = 8192  # the CPU server's KV pool (--max-total-tokens)


def round_calls(batch: int, context: int, queries: int, gen: torch.Generator, layers: int = LAYERS,
                pool: int = POOL):
    """A function running one round's attention over ``layers`` caches of ``pool`` slots: decode with
    ``queries == 0`` (one new token already in the cache), else an extend of ``queries`` rows per
    request; returns the last layer's output."""
    lengths = torch.randint(context // 2, context * 3 // 2 + 1, (batch,), generator=gen)
    pool = max(pool, int(lengths.sum()))  # every request's tokens in distinct slots
    caches = [torch.randn(2, pool, KV_HEADS, HEAD_DIM, generator=gen) for _ in range(layers)]
    slots = torch.randperm(pool, generator=gen)
    req_to_token = torch.zeros(batch, int(lengths.max()) + max(queries, 1), dtype=torch.int64)
    begin = 0
    for b, n in enumerate(lengths.tolist()):
        req_to_token[b, :n] = slots[begin : begin + n]
        begin += n
    pool_indices, scale = torch.arange(batch), HEAD_DIM ** -0.5
    rows = batch * max(queries, 1)
    q = torch.randn(rows, HEADS, HEAD_DIM, generator=gen)
    k_new, v_new = torch.randn(2, rows, KV_HEADS, HEAD_DIM, generator=gen)
    out = torch.empty(rows, HEADS, HEAD_DIM)

    def decode():
        for k_buffer, v_buffer in caches:
            decode_attention_cpu(q, k_buffer, v_buffer, 1.0, 1.0, out, None, None, None, None,
                                 req_to_token, pool_indices, lengths, scale, 0.0, False, 0, None, None)
        return out.clone()

    extend = torch.full((batch,), queries)

    def verify():
        for k_buffer, v_buffer in caches:
            extend_attention_cpu(q, k_new, v_new, out, k_buffer, v_buffer, 1.0, 1.0, req_to_token,
                                 pool_indices, lengths + queries, extend, extend.cumsum(0) - extend,
                                 queries, scale, 0.0, False, 0, None, None, None, True)
        return out.clone()

    return decode if queries == 0 else verify


def measure(batches: list[int], contexts: list[int], queries: list[int], repeats: int,
            seed: int = 0, layers: int = LAYERS, pool: int = POOL) -> list[dict]:
    """One row per (batch, mean cached length, query rows per request; 0 = decode)."""
    rows = []
    saved = batched_attention.BATCHED_MAX_SCORES
    for batch in batches:
        for context in contexts:
            for tq in queries:
                call = round_calls(batch, context, tq, torch.Generator().manual_seed(seed), layers, pool)
                try:
                    batched_out, batched = call(), median_ms(call, repeats)
                    batched_attention.BATCHED_MAX_SCORES = 0
                    looped_out, looped = call(), median_ms(call, repeats)
                finally:
                    batched_attention.BATCHED_MAX_SCORES = saved
                rows.append({"batch": batch, "context": context, "queries": tq,
                             "batched_ms": round(batched, 2), "looped_ms": round(looped, 2),
                             "ratio": round(looped / batched, 2),
                             "max_abs_diff": (batched_out - looped_out).abs().max().item()})
    return rows


def markdown(rows: list[dict], threads: int) -> str:
    lines = ["# CPU attention stand-ins: one batched call per layer vs the per-request loop", "",
             f"A round's attention over {LAYERS} layers (Qwen2.5-Coder-1.5B heads), ms (median), "
             f"torch threads {threads}; cached lengths uniform in [context / 2, 3 context / 2]; "
             "query rows 0 = decode, else a verify of that many rows per request.", "",
             "| batch | mean cached tokens | query rows | batched ms | looped ms | looped / batched "
             "| max abs diff |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['batch']} | {r['context']} | {r['queries'] or 'decode'} | "
                     f"{r['batched_ms']:.1f} | {r['looped_ms']:.1f} | {r['ratio']:.2f}x | "
                     f"{r['max_abs_diff']:.1e} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> list[dict]:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--contexts", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--queries", type=int, nargs="+", default=[0, 1, 5])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--name", default="cpu_attention_batch")
    parser.add_argument("--out-dir", default=RESULTS_DIR)
    args = parser.parse_args(argv)
    run = start_run(__file__, argv)
    rows = measure(args.batches, args.contexts, args.queries, args.repeats)
    table = markdown(rows, torch.get_num_threads())
    write_results(Path(args.out_dir) / args.name, {"threads": torch.get_num_threads(), "rows": rows},
                  table, run)
    print(table)
    return rows


if __name__ == "__main__":
    main()
