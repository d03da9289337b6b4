"""Greedy decode throughput: CausalLM (this package) vs transformers' own ``generate``.

Both decode the same prompt greedily for ``--new-tokens`` tokens at batch size 1 on the same
weights; the script checks that the two token sequences agree and reports tokens per second
(best of ``--repeats``, prefill included in both, one warm-up run each).

    PYTHONPATH=. python benchmarks/model_decode.py --model ~/.cache/sglang-hsd/models/smollm2-135m

Prints its numbers and then the run record (commit, command, machine load); it writes no file.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from benchmarks.common import benchmark_parser, start_run
from sglang_hsd.runtime.model import CausalLM


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


def main(argv: list[str] | None = None) -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--model", type=Path, default=Path("~/.cache/sglang-hsd/models/smollm2-135m"))
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args(argv)
    run = start_run(__file__, argv)
    torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM

    path = str(args.model.expanduser())
    ours = CausalLM.from_pretrained(path)
    hf_model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()  # default (sdpa)
    prompt = torch.randint(0, ours.vocab_size, (1, args.prompt_len), generator=torch.Generator().manual_seed(0))

    with torch.inference_mode():
        ours_s, ours_tokens = best_time(lambda: decode_ours(ours, prompt, args.new_tokens), args.repeats)
        hf_s, hf_tokens = best_time(lambda: decode_hf(hf_model, prompt, args.new_tokens), args.repeats)
    agree = int((ours_tokens == hf_tokens).cumprod(-1).sum())
    print(f"model={path} threads={args.threads} prompt={args.prompt_len} new_tokens={args.new_tokens}")
    print(f"CausalLM      : {args.new_tokens / ours_s:7.1f} tok/s ({ours_s:.3f} s)")
    attn = hf_model.config._attn_implementation
    print(f"HF generate   : {args.new_tokens / hf_s:7.1f} tok/s ({hf_s:.3f} s, attn={attn})")
    print(f"greedy tokens agree for the first {agree}/{args.new_tokens} positions")
    print(run.finish().markdown())


if __name__ == "__main__":
    main()
