"""What exact sampling costs a verify round: the target rows' filters and the penalties, per round.

At the Qwen2.5 vocabulary (151,936) and N verify rows per request, for batches of B requests:

* ``renorm (SGLang)``: SGLang's speculative rows, top-k then top-p on the renormalised row (the CPU
  stand-ins of its kernels, what the server ran before);
* ``filter_probs``: HSD's rows with the non-speculative sampler's semantics (one ``torch.topk`` of
  the largest top_k, SGLang's ``max_top_k``, as its non-speculative sampler does);
* ``penalties``: the per-path penalty bookkeeping of a round (``RequestPenalties.build`` from each
  request's committed output of ``--output-len`` tokens and ``penalise_rows``: the ids a penalty
  touches, gathered, penalised with their counts along each row's path, scattered back);
* ``lm_head``: the float32 LM head of Qwen2.5-Coder-1.5B (1536 x 151,936) on the same B x N rows,
  one part of every verify forward, as the yardstick (the whole target forward costs several
  times more).

Median of ``--repeats`` calls after two warm-up calls, ``--threads`` torch threads. Command:

    PYTHONPATH=. python benchmarks/bench_sampling_rows.py
"""

from __future__ import annotations

import sys

import torch

from benchmarks.common import RESULTS_DIR, add_standard_arguments, benchmark_parser, start_run, write_results
from sglang_hsd.penalties import RequestPenalties, penalise_rows
from sglang_hsd.runtime.timing import median_seconds
from sglang_hsd.sampling import BatchSamplingParams, SamplingFilters, filter_probs
from sglang_hsd.sglang_plugin.cpu import cpu_sampling

VOCAB = 151_936
HIDDEN = 1536


def _round_costs(batch: int, rows: int, output_len: int, repeats: int) -> dict:
    gen = torch.Generator().manual_seed(batch)
    logits = torch.randn(batch, rows, VOCAB, generator=gen) * 3
    probs = torch.softmax(logits / 0.7, -1)
    top_k, top_p = torch.full((batch * rows,), 20), torch.full((batch * rows,), 0.8)
    params = BatchSamplingParams(torch.full((batch,), 0.7), torch.full((batch,), 20), torch.full((batch,), 0.8),
                                 torch.zeros(batch))
    filters = SamplingFilters(top_k=True, top_p=True, min_p=False, all_greedy=False, any_greedy=False,
                              max_top_k=20)  # SGLang's bound when every request has a top_k
    outputs = [torch.randint(VOCAB, (output_len,), generator=gen).tolist() for _ in range(batch)]
    scratch = logits.clone()  # the server penalises its verify logits in place
    tokens = torch.randint(VOCAB, (batch, rows), generator=gen)
    links = torch.tensor([[*range(1, rows), -1]] * batch)
    weight = torch.randn(VOCAB, HIDDEN, generator=gen) * 0.02
    hidden = torch.randn(batch * rows, HIDDEN, generator=gen)

    def renorm():
        flat = probs.view(-1, VOCAB)
        return cpu_sampling.top_p_renorm_prob(cpu_sampling.top_k_renorm_prob(flat, top_k), top_p)

    def penalties():
        state = RequestPenalties.build(outputs, VOCAB, frequency=[0.0] * batch, presence=[0.0] * batch,
                                       repetition=[1.05] * batch, min_new_tokens=[0] * batch,
                                       stop_tokens=[set()] * batch)
        return penalise_rows(scratch, state, tokens, links, torch.full_like(links, -1), inplace=True)

    timed = {"renorm_sglang": renorm, "filter_probs": lambda: filter_probs(probs, params, filters),
             "penalties": penalties, "lm_head": lambda: torch.nn.functional.linear(hidden, weight)}
    return {name: 1000 * median_seconds(call, repeats) for name, call in timed.items()}


def main(argv: list[str] | None = None) -> None:
    parser = benchmark_parser(__doc__)
    add_standard_arguments(parser, name="sampling_rows", threads=2)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--rows", type=int, default=9, help="verify rows per request (root + drafts)")
    parser.add_argument("--output-len", type=int, default=256, help="committed output tokens per request")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    run = start_run(__file__, argv)
    results = {b: _round_costs(b, args.rows, args.output_len, args.repeats) for b in args.batches}
    lines = [f"# Exact sampling in a verify round: ms per round, V = {VOCAB}, {args.rows} rows per request, "
             f"{args.threads} threads", "",
             "| batch | renorm (SGLang) | filter_probs | penalties | lm_head (yardstick) | penalties / lm_head |",
             "|---|---|---|---|---|---|"]
    for batch, ms in results.items():
        lines.append(f"| {batch} | {ms['renorm_sglang']:.1f} | {ms['filter_probs']:.1f} | {ms['penalties']:.1f} | "
                     f"{ms['lm_head']:.1f} | {ms['penalties'] / ms['lm_head']:.2f} |")
    payload = {"vocab": VOCAB, "rows": args.rows, "output_len": args.output_len, "threads": args.threads,
               "ms": {str(b): ms for b, ms in results.items()}}
    json_path, md_path = write_results(RESULTS_DIR / args.name, payload, "\n".join(lines), run)
    print("\n".join(lines))
    print(f"wrote {json_path} and {md_path}")


if __name__ == "__main__":
    main(sys.argv[1:])
