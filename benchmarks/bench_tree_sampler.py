"""What drawing a sampled tree's children costs, per child sampler, without any model.

At the server's sizes (B requests x k beams per draft forward, vocabulary V; default 8 x 4 x
151,936, the Qwen2.5 vocabulary), for every lossless child sampler of ``tree_draft.CHILD_SAMPLERS``:
the keyed noise of one level (``KeyedNoise.uniform`` or ``.gumbel``), the draw itself, and a whole
``LevelDrafter`` round of shape (D, k, N) with random q rows standing in for the draft forwards
(so the round's time is the drafter's own work, noise included). Median of ``--repeats`` timings
after one warm-up, at ``--threads`` torch threads.

    PYTHONPATH=. python benchmarks/bench_tree_sampler.py

Results: ``results/<name>.{json,md}`` with the commit, the command and the machine load.
"""

from __future__ import annotations

import statistics
import time

import torch

from benchmarks.common import RESULTS_DIR, benchmark_parser, start_run, write_results
from sglang_hsd.tree_draft import CHILD_SAMPLERS, DraftPlan, KeyedNoise, LevelDrafter, TreeShape


def median_ms(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return 1e3 * statistics.median(times)


def measure(name: str, batch: int, shape: TreeShape, vocab: int, repeats: int, gen: torch.Generator) -> dict:
    """One sampler's level noise, level draw and whole round, in ms."""
    sampler, k = CHILD_SAMPLERS[name], shape.topk
    rows = batch * k
    q = torch.softmax(3 * torch.randn(rows, vocab, generator=gen), -1)
    noise = KeyedNoise(torch.arange(batch), torch.arange(batch) + 100)
    draws = sampler.noise_draws(k)
    if sampler.noise == "uniform":
        level_noise = lambda: noise.uniform(1, k, draws).reshape(rows, draws)
    else:
        level_noise = lambda: noise.gumbel(1, k, draws, vocab).reshape(rows, draws, vocab)
    fed = level_noise()
    deterministic = torch.zeros(rows, dtype=torch.bool)
    plan = DraftPlan.build(shape, "spine_wide", sampler=name)
    root = torch.softmax(3 * torch.randn(batch, vocab, generator=gen), -1)

    def round_():
        drafter = LevelDrafter(plan, root, torch.zeros(batch, dtype=torch.bool), noise, validate=False)
        drafter.first()
        for _ in range(shape.depth - 1):
            drafter.step(q)
        drafter.finish()

    return {"sampler": name, "noise_ms": median_ms(level_noise, repeats),
            "draw_ms": median_ms(lambda: sampler.draw(q, fed, deterministic, k), repeats),
            "round_ms": median_ms(round_, max(1, repeats // 3))}


def main(argv=None) -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--shape", default="5:4:8", help="D:k:N")
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--name", default="tree_sampler_cost")
    args = parser.parse_args(argv)
    run = start_run(__file__, argv)
    torch.set_num_threads(args.threads)
    shape = TreeShape.parse(args.shape, "--shape")
    if shape is None:
        parser.error("--shape must be D:k:N, not none")
    gen = torch.Generator().manual_seed(0)
    rows = [measure(name, args.batch, shape, args.vocab, args.repeats, gen)
            for name, sampler in CHILD_SAMPLERS.items() if sampler.lossless]
    lines = [f"Child samplers at B = {args.batch}, shape {args.shape}, V = {args.vocab}, "
             f"{args.threads} threads (median ms; noise and draw: one level of k beams per request; "
             "round: the drafter's whole round with random q rows, no model)", "",
             "| sampler | level noise | level draw | drafter round |", "|---|---|---|---|"]
    lines += [f"| `{r['sampler']}` | {r['noise_ms']:.1f} | {r['draw_ms']:.1f} | {r['round_ms']:.1f} |" for r in rows]
    print("\n".join(lines))
    json_path, _ = write_results(RESULTS_DIR / args.name, {"config": vars(args), "results": rows}, "\n".join(lines), run)
    print(f"wrote {json_path}")


if __name__ == "__main__":
    main()
