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
  (``WeightCopyKind.rows``; ``CausalLM.set_weight_copy``, what ``--drafter-precision`` selects), and
  each ``COPY_MIXES`` mix (``int4+w8a8``: int4 up to 3 rows, w8a8 from 4);
* ``KIND every row``: every row count on the copy, to see whether several rows gain from it too
  (AVX-512 BF16 dot products, the int4 kernel's tiles).

It also reports, per copy, how often the drafter's greedy token on a real prompt (teacher-forced,
every position on the copy) equals the fp32 drafter's: the copy changes the drafter's proposals,
never the output law. With ``--target``, what that costs in acceptance: teacher-forced on the
target's own greedy continuation (``--continuation`` tokens) of each prompt, per copy (every
row on it) and fp32, the mean per-token acceptance of the drafter's proposal by the target at
T = 1 (``sum_x min(p, q)``, the chance that one drafted token passes a lossless token-level
check) and at T = 0 (argmax equal to the target's).

    PYTHONPATH=. python benchmarks/bench_drafter_step.py --model qwen2.5-coder-0.5b --threads 2
    PYTHONPATH=. python benchmarks/bench_drafter_step.py --rows 1 9 64 256 --target qwen2.5-coder-1.5b \
        --prompt-set sharegpt --num-prompts 6 --name drafter_step_qwen2.5-coder-0.5b_sharegpt

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
from sglang_hsd.runtime.weight_copies import COPY_MIXES, WEIGHT_COPIES

DEFAULT_ROWS = {f"packed + {kind} rows": kind for kind in (*WEIGHT_COPIES, *COPY_MIXES)}
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
    parser.add_argument("--target", help="a target model: also measure each copy's acceptance by it")
    parser.add_argument("--continuation", type=int, default=48,
                        help="with --target: greedy target tokens per prompt the acceptance is measured on")
    parser.add_argument("--name")
    args = parser.parse_args(argv)
    if args.continuation < 1:
        raise ValueError(f"--continuation must be >= 1, got {args.continuation}")
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


@torch.inference_mode()
def greedy_continuation(target, ids: list[int], tokens: int) -> list[int]:
    """``ids`` followed by the target's ``tokens`` greedy tokens."""
    cache = target.new_cache(1, len(ids) + tokens + 1)
    logits = target.forward(torch.tensor([ids]), cache)
    out = list(ids)
    for _ in range(tokens):
        out.append(int(logits[0, -1].argmax()))
        logits = target.forward(torch.tensor([[out[-1]]]), cache)
    return out


@torch.inference_mode()
def target_acceptance(model, target, sequences: list[tuple[list[int], int]]) -> dict[str, dict[str, float]]:
    """Per variant (``fp32`` and every copy kind, every row on it): the mean over the
    continuation positions of ``sum min(p, q)`` (``t1``) and of ``argmax q == argmax p`` (``t0``),
    p the target's and q the drafter's next-token distribution. ``sequences``: (tokens, prompt
    length), the continuation being ``tokens[prompt length:]``."""
    if model.vocab_size != target.vocab_size:
        raise ValueError(f"the drafter's vocabulary ({model.vocab_size}) differs from the target's "
                         f"({target.vocab_size})")

    def probs(m, ids, start):
        logits = m.forward(torch.tensor([ids]), m.new_cache(1, len(ids)))[0, start - 1:-1]
        return torch.softmax(logits.float(), dim=-1)

    targets = [probs(target, ids, start) for ids, start in sequences]
    out = {}
    for variant in ("fp32", *WEIGHT_COPIES):
        set_variant(model, "fp32 mkl")
        if variant != "fp32":
            model.set_weight_copy(variant, PackedRows(((1, None),)))
        t1, t0 = [], []
        for (ids, start), p in zip(sequences, targets):
            q = probs(model, ids, start)
            t1.append(torch.minimum(p, q).sum(-1))
            t0.append((p.argmax(-1) == q.argmax(-1)).float())
        out[variant] = {"t1": float(torch.cat(t1).mean()), "t0": float(torch.cat(t0).mean())}
    model.set_weight_copy(None)
    return out


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
    if result.get("acceptance"):
        lines += ["", f"Acceptance by {result['target']}, teacher-forced on its greedy continuation "
                  f"({result['continuation']} tokens per prompt, {result['acceptance_positions']} "
                  "positions): mean sum min(p, q) (T = 1) and argmax equal to the target's (T = 0).", "",
                  "| drafter weights | T = 1 | T = 0 |", "|---|---|---|"]
        lines += [f"| {k} | {v['t1']:.4f} | {v['t0']:.4f} |" for k, v in result["acceptance"].items()]
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
    if args.target:
        target = load_model(args.target).model
        sequences = [(greedy_continuation(target, ids, args.continuation), len(ids)) for ids in prompts]
        result.update(target=args.target, continuation=args.continuation,
                      acceptance_positions=args.continuation * len(sequences),
                      acceptance=target_acceptance(model, target, sequences))
    table = format_table(result)
    write_results(RESULTS_DIR / (args.name or f"drafter_step_{args.model}"), result, table, run)
    print(table)


if __name__ == "__main__":
    main()
