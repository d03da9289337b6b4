"""What one drafter forward costs against its row count, per kernel variant of a separate drafter.

A drafting step at batch 1 is one row through every layer and the LM head; after each round the
drafter catches up on two rows (the last draft and the target's token), and its prompt is many
rows. This times one forward (embedding, all layers, LM head) of ``--rows`` new tokens on a warmed
KV cache of ``--context`` positions, median of ``--repeats`` after one untimed call, for

* ``fp32 mkl``: ``F.linear`` on the fp32 weights (torch's default);
* ``fp32 packed``: oneDNN pre-packed weights for two rows or more, and for single rows where they
  are measured faster (``kernel_paths.single_row_split``, as the runtime packs);
* ``packed + KIND rows`` for each weight copy KIND (bf16, fp16, int8, int4;
  ``runtime/weight_copies.py``): packed, and the kind's default row counts on the copy
  (``WeightCopyKind.rows``; ``CausalLM.set_weight_copy``, what ``--drafter-precision`` selects);
* ``KIND every row``: every row count on the copy, to see whether several rows gain from it too
  (AVX-512 BF16 dot products, the int4 kernel's tiles).

It also reports, per copy, how often the drafter's greedy token on a real prompt (teacher-forced,
every position on the copy) equals the fp32 drafter's: the copy changes the drafter's proposals,
never the output law.

    PYTHONPATH=. python benchmarks/bench_drafter_step.py --model qwen2.5-coder-0.5b --threads 2

Writes ``benchmarks/results/<name>.{json,md}`` (default ``drafter_step_<model>``).
"""

from __future__ import annotations

import statistics
import time

import torch

from benchmarks.common import RESULTS_DIR, add_standard_arguments, benchmark_parser, start_run, write_results
from sglang_hsd.runtime.kernel_paths import single_row_split
from sglang_hsd.runtime.layers import PackedRows
from sglang_hsd.runtime.loading import load_model, prompt_set_texts
from sglang_hsd.runtime.weight_copies import WEIGHT_COPIES

DEFAULT_ROWS = {f"packed + {kind} rows": kind for kind in WEIGHT_COPIES}
EVERY_ROW = {f"{kind} every row": kind for kind in WEIGHT_COPIES}
VARIANTS = ("fp32 mkl", "fp32 packed", *DEFAULT_ROWS, *EVERY_ROW)


def parse_args(argv: list[str] | None = None):
    parser = benchmark_parser(__doc__)
    add_standard_arguments(parser, model="qwen2.5-coder-0.5b", threads=2)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--context", type=int, default=128, help="positions already in the KV cache")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--prompt-set", default="humaneval", help="prompts of the agreement check")
    parser.add_argument("--num-prompts", type=int, default=2)
    parser.add_argument("--name")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.context < 1 or min(args.rows) < 1:
        raise ValueError(f"--repeats, --context and --rows must be >= 1, got {args.repeats}, {args.context}, "
                         f"{args.rows}")
    return args


def set_variant(model, variant: str) -> None:
    model.set_weight_copy(None)
    model.unpack_linears()
    if variant != "fp32 mkl":
        model.pack_linears(single_row_split(model))
    if variant in DEFAULT_ROWS:
        model.set_weight_copy(DEFAULT_ROWS[variant])
    if variant in EVERY_ROW:
        model.set_weight_copy(EVERY_ROW[variant], PackedRows(((1, None),)))


@torch.inference_mode()
def step_ms(model, rows: int, context: int, repeats: int, generator: torch.Generator) -> float:
    """Median ms of one forward of ``rows`` new tokens after ``context`` cached ones."""
    cache = model.new_cache(1, context + rows + 1)
    model.forward(torch.randint(0, model.vocab_size, (1, context), generator=generator), cache)
    base = cache.lengths[0].clone()
    times = []
    for i in range(repeats + 1):
        ids = torch.randint(0, model.vocab_size, (1, rows), generator=generator)
        start = time.perf_counter()
        model.forward(ids, cache)
        if i:  # the first call is the warm-up
            times.append((time.perf_counter() - start) * 1e3)
        cache.truncate(base)
    return statistics.median(times)


@torch.inference_mode()
def agreement(model, prompts: list[list[int]], kind: str) -> float:
    """Share of positions where the drafter's greedy token on a ``kind`` copy equals the fp32 one."""
    same = total = 0
    for ids in prompts:
        x = torch.tensor([ids])
        set_variant(model, "fp32 mkl")
        ref = model.forward(x, model.new_cache(1, len(ids))).argmax(-1)
        model.set_weight_copy(kind, PackedRows(((1, None),)))
        copy = model.forward(x, model.new_cache(1, len(ids))).argmax(-1)
        same, total = same + int((ref == copy).sum()), total + ref.numel()
    model.set_weight_copy(None)
    return same / total


def format_table(result: dict) -> str:
    rows = result["rows"]
    base = result["ms"]["fp32 mkl"][0]
    lines = [f"# Drafter step cost: {result['model']}, {result['threads']} thread(s), "
             f"{result['context']} cached positions", "",
             "ms per forward (ratio to one fp32 mkl row).", "",
             "| rows | " + " | ".join(VARIANTS) + " |", "|---" * (len(VARIANTS) + 1) + "|"]
    for i, n in enumerate(rows):
        cells = [f"{result['ms'][v][i]:.1f} ({result['ms'][v][i] / base:.2f}x)" for v in VARIANTS]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    lines += ["", "Greedy token equal to the fp32 drafter's, teacher-forced on "
              f"{result['num_prompts']} {result['prompt_set']} prompts ({result['positions']} positions): "
              + ", ".join(f"{k} {v:.1%}" for k, v in result["agreement"].items())]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    run = start_run(__file__, argv)
    torch.set_num_threads(args.threads)
    loaded = load_model(args.model)
    model, generator = loaded.model, torch.Generator().manual_seed(0)
    ms = {}
    for variant in VARIANTS:
        set_variant(model, variant)
        ms[variant] = [step_ms(model, n, args.context, args.repeats, generator) for n in args.rows]
        print(variant, [f"{t:.1f}" for t in ms[variant]], flush=True)
    prompts = [loaded.tokenizer(text)["input_ids"] for text in prompt_set_texts(args.prompt_set, args.num_prompts)]
    agree = {kind: agreement(model, prompts, kind) for kind in WEIGHT_COPIES}
    result = {"model": args.model, "threads": args.threads, "context": args.context, "rows": args.rows,
              "repeats": args.repeats, "ms": ms, "prompt_set": args.prompt_set, "num_prompts": args.num_prompts,
              "positions": sum(map(len, prompts)), "agreement": agree}
    table = format_table(result)
    write_results(RESULTS_DIR / (args.name or f"drafter_step_{args.model}"), result, table, run)
    print(table)


if __name__ == "__main__":
    main()
