"""End-to-end tokens/s and accepted lengths, every configuration measured in the same run.

    python benchmarks/bench_e2e.py --model smollm2-135m \\
        --configs "target" "exit:8,target" "exit:8,exit:16,target" --buffers "" "4" "3,4"

Configurations are ``--levels`` strings of ``sglang-hsd generate`` (``target`` = autoregressive),
plus the Hugging Face peers: ``hf`` (plain ``generate``), ``hf-assisted`` (``generate`` with
``assistant_model``, needs ``--assistant``) and ``hf-prompt-lookup``. Each configuration runs on
the same prompts, for each temperature and batch size, ``--repeats`` times; the table reports the
median and ratios against the autoregressive runtime and against HF assisted generation of the
same run. Timings on a shared 2-core machine are noisy: compare ratios, not absolute numbers.

Writes ``benchmarks/results/<name>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from sglang_hsd.runtime.cli import build_generator, encode_prompts, load_model
from sglang_hsd.sampling import SamplingParams

HF_CONFIGS = ("hf", "hf-assisted", "hf-prompt-lookup")


def run_runtime(generator, prompts, params, max_new, eos, seed, batch_size):
    """Generate in batches of ``batch_size``; return (tokens, seconds, per-level stats dicts)."""
    tokens, seconds, levels = [], 0.0, None
    for start in range(0, len(prompts), batch_size):
        result = generator.generate(prompts[start : start + batch_size], params, max_new, eos, seed=seed)
        tokens += result.tokens
        seconds += result.seconds
        stats = [lv.as_dict() for lv in result.levels]
        levels = stats if levels is None else [_add_stats(a, b) for a, b in zip(levels, stats)]
    return tokens, seconds, levels


def _add_stats(a: dict, b: dict) -> dict:
    out = dict(a)
    for key in ("rounds", "proposed", "accepted", "seconds"):
        out[key] = a[key] + b[key]
    out["acceptance_rate"] = out["accepted"] / out["proposed"] if out["proposed"] else float("nan")
    out["mean_accepted"] = out["accepted"] / out["rounds"] if out["rounds"] else float("nan")
    return out


def run_hf(kind, target, assistant, prompts, params, max_new, eos, seed):
    """Hugging Face generate, one prompt at a time (assisted generation supports batch size 1 only)."""
    hf = target.hf
    tokens, seconds = [], 0.0
    for prompt in prompts:
        kwargs = dict(max_new_tokens=max_new, pad_token_id=eos, eos_token_id=eos)
        if params.temperature > 0:
            kwargs.update(do_sample=True, temperature=params.temperature, top_k=params.top_k or None, top_p=params.top_p)
        else:
            kwargs.update(do_sample=False)
        if kind == "hf-assisted":
            kwargs["assistant_model"] = assistant.hf
        elif kind == "hf-prompt-lookup":
            kwargs["prompt_lookup_num_tokens"] = 10
        torch.manual_seed(seed)
        start = time.perf_counter()
        with torch.inference_mode():
            out = hf.generate(torch.tensor([prompt]), **kwargs)
        seconds += time.perf_counter() - start
        tokens.append(out[0, len(prompt) :].tolist())
    return tokens, seconds, None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--assistant", help="model for hf-assisted (same tokenizer), e.g. qwen2.5-coder-0.5b")
    parser.add_argument("--configs", nargs="+", default=["target", "exit:8,target", "exit:8,exit:16,target"])
    parser.add_argument("--buffers", nargs="+", help="one per config: comma list or '' (default 4 per level)")
    parser.add_argument("--methods", nargs="+", help="one per config: verify method(s), default hsd")
    parser.add_argument("--exit-heads", default="auto")
    parser.add_argument("--prompt-set", default="mtbench")
    parser.add_argument("--num-prompts", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--name", default="e2e", help="results file stem")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from sglang_hsd.assets.prompts import load_prompts

    target = load_model(args.model)
    assistant = load_model(args.assistant) if args.assistant else None
    texts = [p.messages[0]["content"] for p in load_prompts(args.prompt_set, limit=args.num_prompts)]
    prompts = encode_prompts(target.tokenizer, texts)
    eos = target.tokenizer.eos_token_id
    buffers = args.buffers or [""] * len(args.configs)
    methods = args.methods or ["hsd"] * len(args.configs)
    rows = []
    for temperature in args.temperatures:
        params = SamplingParams(temperature=temperature)
        for batch_size in args.batch_sizes:
            for config, buf, method in zip(args.configs, buffers, methods):
                if config in HF_CONFIGS:
                    if batch_size != 1 or (config == "hf-assisted" and assistant is None):
                        continue
                    runner = lambda seed: run_hf(config, target, assistant, prompts, params,  # noqa: E731
                                                 args.max_new_tokens, eos, seed)
                else:
                    gen = build_generator(target, config, [int(x) for x in buf.split(",")] if buf else None,
                                          method.split(","), args.exit_heads)
                    runner = lambda seed: run_runtime(gen, prompts, params, args.max_new_tokens,  # noqa: E731
                                                      eos, seed, batch_size)
                times, tokens, levels = [], None, None
                for repeat in range(args.repeats):
                    tokens, seconds, levels = runner(repeat)
                    times.append(seconds)
                    print(f"T={temperature} B={batch_size} {config} [{method}] run {repeat}: "
                          f"{sum(map(len, tokens)) / seconds:.2f} tok/s", flush=True)
                seconds = statistics.median(times)
                rows.append({
                    "temperature": temperature, "batch_size": batch_size, "config": config, "method": method,
                    "buffers": buf, "tokens": sum(map(len, tokens)), "seconds": seconds,
                    "tokens_per_second": sum(map(len, tokens)) / seconds, "levels": levels,
                    "outputs": tokens,
                })
    _add_ratios(rows)
    out_dir = Path(__file__).parent / "results"
    out_dir.mkdir(exist_ok=True)
    meta = {"model": args.model, "assistant": args.assistant, "prompt_set": args.prompt_set,
            "num_prompts": args.num_prompts, "max_new_tokens": args.max_new_tokens, "threads": args.threads,
            "exit_heads": args.exit_heads}
    (out_dir / f"{args.name}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    table = format_table(rows, meta)
    (out_dir / f"{args.name}.md").write_text(table)
    print(table)


def _add_ratios(rows: list[dict]) -> None:
    """Speed-up against the autoregressive runtime and HF assisted generation of the same T and B."""
    for row in rows:
        same = [r for r in rows if r["temperature"] == row["temperature"]]
        base = [r for r in same if r["config"] == "target" and r["batch_size"] == row["batch_size"]]
        peer = [r for r in same if r["config"] == "hf-assisted"]
        row["vs_autoregressive"] = row["tokens_per_second"] / base[0]["tokens_per_second"] if base else None
        row["vs_hf_assisted"] = row["tokens_per_second"] / peer[0]["tokens_per_second"] if peer else None


def format_table(rows: list[dict], meta: dict) -> str:
    lines = [
        f"model {meta['model']}, assistant {meta['assistant']}, {meta['num_prompts']} {meta['prompt_set']} prompts, "
        f"{meta['max_new_tokens']} new tokens, {meta['threads']} thread(s), exit heads: {meta['exit_heads']}",
        "",
        "| T | B | config | method | buffers | tok/s | vs AR | vs HF assisted | accepted/round per level |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        accepted = ", ".join(
            f"{lv['name']}: {lv['mean_accepted']:.2f}" for lv in (r["levels"] or [])[1:]
        ) or "-"
        fmt = lambda x: "-" if x is None else f"{x:.2f}x"  # noqa: E731
        lines.append(
            f"| {r['temperature']} | {r['batch_size']} | {r['config']} | {r['method']} | {r['buffers'] or '-'} | "
            f"{r['tokens_per_second']:.2f} | {fmt(r['vs_autoregressive'])} | {fmt(r['vs_hf_assisted'])} | {accepted} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
