"""What the CPU server's attention stand-ins cost per call: fused grouped-query attention against
the explicit softmax that repeats the KV once per query head.

On CPU, every verify forward, draft step and draft extend of the speculative server attends
through ``sglang_plugin/cpu/kernel_ops.py`` (``extend_attention_cpu``: the verify window or the
extend rows; ``decode_attention_cpu``: one new token per row), once per request and layer. This
times one request's call of the stand-in (``fused``: torch's ``scaled_dot_product_attention`` with
grouped-query heads, what the stand-ins run) and of the explicit form they replaced (``repeated``:
the cached keys and values repeated for every query head, ``einsum`` scores, a causal mask, a
softmax), at a model's head shapes, for several cached lengths and query counts. Same inputs for
both; the largest absolute difference of their outputs is kept.

    PYTHONPATH=. python benchmarks/bench_cpu_attention.py                     # Qwen2.5-Coder shapes
    PYTHONPATH=. python benchmarks/bench_cpu_attention.py --contexts 64 --queries 1 --repeats 3 \\
        --name cpu_attention_smoke

Results: ``results/<name>.{json,md}`` (default ``cpu_attention``) with the commit, the command and
the machine load (``benchmarks/common.py``): milliseconds per call (median of ``--repeats`` after
one warm-up) and the ratio repeated / fused. Timings mean something only on an idle machine.
"""

from __future__ import annotations

from pathlib import Path

import torch

from benchmarks.common import RESULTS_DIR, benchmark_parser, start_run, write_results
from sglang_hsd.runtime.timing import median_seconds
from sglang_hsd.sglang_plugin.cpu.kernel_ops import extend_attention_cpu

# (name, query heads, KV heads, head dim): the two Qwen2.5-Coder models of the server benchmarks.
SHAPES = (("qwen2.5-coder-1.5b", 12, 2, 128), ("qwen2.5-coder-0.5b", 14, 2, 64))


def repeated_kv_attention(q, keys, values, scale, prefix):
    """The explicit form: q [Tq, Hq, D], keys/values [Tk, Hkv, D]; query i sees keys
    j <= prefix + i. The KV is repeated for each of the Hq / Hkv query heads of a KV head."""
    group = q.shape[1] // keys.shape[1]
    k = keys.repeat_interleave(group, dim=1)
    v = values.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    hidden = torch.arange(keys.shape[0]).unsqueeze(0) > prefix + torch.arange(q.shape[0]).unsqueeze(1)
    scores = scores.masked_fill(hidden.unsqueeze(0), float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v)


def fused_call(q, keys, values, scale, prefix):
    """One request through ``extend_attention_cpu``: ``prefix`` cached rows, ``Tq`` new ones."""
    tq = q.shape[0]
    out = torch.empty(tq, q.shape[1], values.shape[2])
    slots = torch.arange(prefix).unsqueeze(0)  # the cache rows are the first prefix slots
    extend_attention_cpu(q, keys[prefix:], values[prefix:], out, keys[:prefix], values[:prefix],
                         1.0, 1.0, slots, torch.tensor([0]), torch.tensor([prefix + tq]),
                         torch.tensor([tq]), torch.tensor([0]), tq, scale, 0.0, False, 0, None,
                         None, None, True)
    return out


def median_ms(fn, repeats: int) -> float:
    return 1000 * median_seconds(fn, repeats, warmup=1)


def measure(contexts: list[int], queries: list[int], repeats: int, seed: int = 0) -> list[dict]:
    """One row per (shape, cached length, query count)."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for name, hq, hkv, dim in SHAPES:
        scale = dim ** -0.5
        for context in contexts:
            for tq in queries:
                q = torch.randn(tq, hq, dim, generator=gen)
                keys = torch.randn(context + tq, hkv, dim, generator=gen)
                values = torch.randn(context + tq, hkv, dim, generator=gen)
                diff = (fused_call(q, keys, values, scale, context)
                        - repeated_kv_attention(q, keys, values, scale, context)).abs().max().item()
                fused = median_ms(lambda: fused_call(q, keys, values, scale, context), repeats)
                repeated = median_ms(lambda: repeated_kv_attention(q, keys, values, scale, context),
                                     repeats)
                rows.append({"model": name, "heads": [hq, hkv, dim], "context": context, "queries": tq,
                             "fused_ms": round(fused, 4), "repeated_ms": round(repeated, 4),
                             "ratio": round(repeated / fused, 2), "max_abs_diff": diff})
    return rows


def markdown(rows: list[dict], threads: int) -> str:
    lines = ["# CPU attention stand-ins: fused grouped-query attention vs the repeated-KV softmax",
             "", f"One request's call, ms (median), torch threads {threads}.", "",
             "| model (Hq, Hkv, D) | cached tokens | queries | fused ms | repeated ms | repeated / fused "
             "| max abs diff |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} {tuple(r['heads'])} | {r['context']} | {r['queries']} | "
                     f"{r['fused_ms']:.3f} | {r['repeated_ms']:.3f} | {r['ratio']:.2f}x | "
                     f"{r['max_abs_diff']:.1e} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> list[dict]:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--contexts", type=int, nargs="+", default=[200, 800, 2000])
    parser.add_argument("--queries", type=int, nargs="+", default=[1, 5])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--name", default="cpu_attention")
    parser.add_argument("--out-dir", default=RESULTS_DIR)
    args = parser.parse_args(argv)
    run = start_run(__file__, argv)
    rows = measure(args.contexts, args.queries, args.repeats)
    table = markdown(rows, torch.get_num_threads())
    write_results(Path(args.out_dir) / args.name, {"threads": torch.get_num_threads(), "rows": rows},
                  table, run)
    print(table)
    return rows


if __name__ == "__main__":
    main()
