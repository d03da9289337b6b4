"""Greedy decode throughput: CausalLM (this package) vs transformers' own ``generate``.

Both decode the same prompt greedily for ``--new-tokens`` tokens at batch size 1 on the same
weights; the script checks that the two token sequences agree and reports tokens per second
(best of ``--repeats``, prefill included in both, one warm-up run each).

``--kernels`` also decodes with this package's linear kernels: ``mkl`` (``F.linear``, the
default), ``packed`` (oneDNN packed weights, ``CausalLM.pack_linears(row_padding="off")``) and
``packed-padded`` (the same packed weights, few-row calls padded as ``row_padding="auto"``
measures, or with ``--pad-to 4`` forced). The two packed variants share one packing and run
their repeats alternately (the padding is switched between repeats), so machine drift falls on
both; ``--name`` writes ``benchmarks/results/<name>.{json,md}``.

    PYTHONPATH=. python benchmarks/model_decode.py --model ~/.cache/sglang-hsd/models/smollm2-135m
    PYTHONPATH=. python benchmarks/model_decode.py --model ~/.cache/sglang-hsd/models/qwen2.5-coder-1.5b \
        --kernels packed packed-padded --no-hf --threads 2 --name decode_padding_qwen15

Prints its numbers and then the run record (commit, command, machine load).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from benchmarks.common import RESULTS_DIR, benchmark_parser, start_run, write_results
from sglang_hsd.runtime.kernel_paths import single_row_split
from sglang_hsd.runtime.layers import PackedLinear
from sglang_hsd.runtime.model import CausalLM
from sglang_hsd.runtime.row_padding import NO_PADDING, RowPadding


def decode_ours(model: CausalLM, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy decode: ``prompt`` ``LongTensor[1, P]`` -> generated ``LongTensor[1, new_tokens]``."""
    cache = model.new_cache(1, prompt.shape[1] + new_tokens)
    token = model(prompt, cache)[:, -1:].argmax(-1)
    out = [token]
    for _ in range(new_tokens - 1):
        token = model(token, cache).argmax(-1)
        out.append(token)
    return torch.cat(out, dim=1)


def decode_hf(hf_model, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    out = hf_model.generate(
        prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0
    )
    return out[:, prompt.shape[1] :]


def best_time(fn, repeats: int) -> tuple[float, torch.Tensor]:
    result = fn()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        begin = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - begin)
    return best, result


KERNELS = ("mkl", "packed", "packed-padded")


def set_padding(model: CausalLM, padding: RowPadding) -> None:
    """Every packed linear of ``model`` runs its few-row calls with ``padding``."""
    for module in model.modules():
        if isinstance(module, PackedLinear):
            module.padding = padding


def time_kernels(model: CausalLM, prompt: torch.Tensor, new_tokens: int, kernels: list[str], repeats: int,
                 pad_to: int | None) -> tuple[dict[str, list[float]], dict[str, torch.Tensor], str]:
    """Seconds of each repeat per kernel, the tokens per kernel, and the padding described."""
    seconds: dict[str, list[float]] = {kernel: [] for kernel in kernels}
    tokens: dict[str, torch.Tensor] = {}

    def once(kernel: str) -> None:
        begin = time.perf_counter()
        tokens[kernel] = decode_ours(model, prompt, new_tokens)
        seconds[kernel].append(time.perf_counter() - begin)

    if "mkl" in kernels:
        decode_ours(model, prompt, new_tokens)  # warm-up
        for _ in range(repeats):
            once("mkl")
    packed = [kernel for kernel in kernels if kernel != "mkl"]
    padding = NO_PADDING
    if packed:
        model.pack_linears(single_row_split(model), row_padding="auto")
        padding = RowPadding((pad_to,) * (pad_to - 1)) if pad_to else model.row_padding
        for kernel in packed:  # warm-up: first calls on fresh packed copies page-fault
            set_padding(model, padding if kernel == "packed-padded" else NO_PADDING)
            decode_ours(model, prompt, new_tokens)
        for _ in range(repeats):
            for kernel in packed:
                set_padding(model, padding if kernel == "packed-padded" else NO_PADDING)
                once(kernel)
        model.unpack_linears()
    return seconds, tokens, padding.describe()


def main(argv: list[str] | None = None) -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--model", type=Path, default=Path("~/.cache/sglang-hsd/models/smollm2-135m"))
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--kernels", nargs="+", choices=KERNELS, default=["mkl"])
    parser.add_argument("--pad-to", type=int, default=None, help="packed-padded: pad 1..N-1 rows to N "
                        "(default: the padding pack_linears measures here)")
    parser.add_argument("--no-hf", action="store_true", help="skip transformers' generate")
    parser.add_argument("--name", default=None, help="write <out-dir>/<name>.{json,md}")
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    if args.pad_to is not None and args.pad_to < 2:
        parser.error(f"--pad-to must be >= 2, got {args.pad_to}")
    run = start_run(__file__, argv)
    torch.set_num_threads(args.threads)

    path = str(args.model.expanduser())
    ours = CausalLM.from_pretrained(path)
    prompt = torch.randint(0, ours.vocab_size, (1, args.prompt_len), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        seconds, tokens, padding = time_kernels(ours, prompt, args.new_tokens, args.kernels, args.repeats, args.pad_to)
    reference = tokens[args.kernels[0]]
    rows = [{"kernel": kernel, "tok_per_s_best": args.new_tokens / min(times),
             "tok_per_s_median": args.new_tokens / statistics.median(times), "seconds": times,
             "greedy_agree": int((tokens[kernel] == reference).cumprod(-1).sum())} for kernel, times in seconds.items()]
    if not args.no_hf:
        from transformers import AutoModelForCausalLM

        hf_model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()  # default (sdpa)
        with torch.inference_mode():
            hf_s, hf_tokens = best_time(lambda: decode_hf(hf_model, prompt, args.new_tokens), args.repeats)
        rows.append({"kernel": f"HF generate ({hf_model.config._attn_implementation})",
                     "tok_per_s_best": args.new_tokens / hf_s, "tok_per_s_median": None, "seconds": [hf_s],
                     "greedy_agree": int((hf_tokens == reference).cumprod(-1).sum())})
    lines = [f"# Greedy decode, batch 1: {path}", "",
             f"{args.threads} threads, prompt {args.prompt_len} tokens, {args.new_tokens} new tokens, "
             f"{args.repeats} repeats; packed-padded: {padding}. Tokens agreeing with `{args.kernels[0]}` "
             f"(greedy, prefix length).", "",
             "| kernels | tok/s (best) | tok/s (median) | vs first row (median) | greedy agree |", "|---|---|---|---|---|"]
    base = rows[0]["tok_per_s_median"]
    for row in rows:
        median = row["tok_per_s_median"]
        lines.append(f"| {row['kernel']} | {row['tok_per_s_best']:.2f} | {'-' if median is None else f'{median:.2f}'} | "
                     f"{'-' if median is None else f'{median / base:.2f}x'} | {row['greedy_agree']}/{args.new_tokens} |")
    markdown = "\n".join(lines)
    print(markdown)
    if args.name:
        payload = {"model": path, "threads": args.threads, "prompt_len": args.prompt_len,
                   "new_tokens": args.new_tokens, "repeats": args.repeats, "padding": padding, "rows": rows}
        write_results(args.out_dir / args.name, payload, markdown, run)
    print(run.finish().markdown())


if __name__ == "__main__":
    main()
