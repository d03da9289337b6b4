"""Held-out acceptance and end-to-end speed of trained heads on a registered model, in one run.

    python -m eagle_heads.bench --model smollm2-135m [--num-prompts 4] [--max-new-tokens 48]

Reads the heads ``sglang-hsd train-heads`` wrote (``<cache>/heads/<model>/exit`` and ``eagle3``)
and the cached held-out features (MT-Bench), then prints

1. per exit layer: 1 - TV and top-1 agreement with the target (T=1), logit lens vs trained head;
2. per EAGLE-3 draft step: the same (teacher-forced previous drafts);
3. generation on held-out MT-Bench prompts, greedy and T=1, for autoregressive decoding and each
   speculative configuration: per-level acceptance, tokens per target round, tokens/s.

The machine's load average is printed with the results: tokens/s on a shared CPU are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch


def _configs(exit_layers: list[int], has_eagle3: bool, eagle_dir: str) -> list[tuple[str, str, list[int], bool]]:
    """(label, level spec, buffers, use trained exit heads)."""
    low, mid = exit_layers[0], exit_layers[-1]
    configs = [("autoregressive", "target", [], False),
               (f"exit:{low} lens", f"exit:{low},target", [4], False),
               (f"exit:{low} trained", f"exit:{low},target", [4], True),
               (f"exit:{low},exit:{mid} trained", f"exit:{low},exit:{mid},target", [2, 4], True)]
    if has_eagle3:
        configs += [("eagle3", f"eagle3:{eagle_dir},target", [4], False),
                    (f"eagle3,exit:{mid} trained", f"eagle3:{eagle_dir},exit:{mid},target", [3, 4], True)]
    return configs


def run(model: str, num_prompts: int, max_new_tokens: int, out_json: str | None) -> dict:
    from eagle_heads import pipeline
    from eagle_heads.data import FeatureSet, encode_prompts
    from eagle_heads.eagle3_train import evaluate_eagle3
    from eagle_heads.exit_heads import evaluate_exit_heads, load_exit_heads, read_manifest
    from sglang_hsd.runtime.config import parse_levels
    from sglang_hsd.runtime.eagle3 import Eagle3Head
    from sglang_hsd.runtime.engine import SpeculativeGenerator
    from sglang_hsd.sampling import SamplingParams

    torch.set_num_threads(min(2, torch.get_num_threads()))
    root = pipeline.heads_dir(model)
    target, tok = pipeline.load_target(model)
    exit_heads = load_exit_heads(str(root / "exit"), target)
    layers = sorted(exit_heads)
    eagle_dir = root / "eagle3"
    head = Eagle3Head.from_pretrained(str(eagle_dir), target) if (eagle_dir / "model.safetensors").exists() else None
    heldout = FeatureSet.load(str(sorted(root.glob("features-heldout-*.pt"))[-1]))
    report: dict = {"model": model, "exit_manifest": {k: v for k, v in read_manifest(str(root / "exit")).items() if k != "training_log"}}
    report["exit_1-tv"] = {f"T={t}": evaluate_exit_heads(target, heldout, exit_heads, temperature=t) for t in (1.0,)}
    if head is not None:
        report["eagle3_1-tv"] = evaluate_eagle3(head, target, heldout, steps=3)
    prompts, _ = encode_prompts(tok, ["mtbench"], num_prompts, 256)
    runs = []
    for temperature in (0.0, 1.0):
        for label, spec, buffers, trained in _configs(layers, head is not None, str(eagle_dir)):
            gen = SpeculativeGenerator(target, parse_levels(spec, buffers=buffers or None),
                                       exit_heads=exit_heads if trained else None, eagle3_head=head if "eagle3" in spec else None)
            load = os.getloadavg()[0]
            result = gen.generate(prompts, SamplingParams(temperature=temperature), max_new_tokens, tok.eos_token_id, seed=0)
            top = result.levels[-1]
            row = {"config": label, "temperature": temperature, "tokens": result.num_generated,
                   "seconds": round(result.seconds, 1), "tokens_per_s": round(result.tokens_per_second, 2),
                   "tokens_per_target_round": round(result.num_generated / top.rounds, 2) if top.rounds else 1.0,
                   "levels": [{"name": l.name.split(":")[0] if l.name.startswith("eagle3") else l.name,
                               "acceptance": round(l.acceptance_rate, 3), "accepted_per_round": round(l.mean_accepted, 2)}
                              for l in result.levels[1:]],
                   "load_avg": round(load, 1)}
            runs.append(row)
            print(json.dumps(row), flush=True)
    report["generation"] = runs
    if out_json:
        with open(out_json, "w") as f:
            json.dump(report, f, indent=2)
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--num-prompts", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--out", default=None, help="write the report as JSON here")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    report = run(args.model, args.num_prompts, args.max_new_tokens, args.out)
    print(json.dumps({k: v for k, v in report.items() if k != "generation"}, indent=2))
    print(f"({time.perf_counter() - start:.0f}s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
