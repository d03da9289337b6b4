"""Block efficiency of every chain verifier on the same sampled drafts from real models.

For each prompt, the target samples a continuation; at several positions along it the drafter
samples a K_max-token draft from its own q, and the target scores the draft in one forward. Each
verifier's *exact* expected accepted length given that draft (no coin noise) is then computed for
every K <= K_max, so all methods are compared on identical drafts:

    block efficiency = 1 + E[accepted draft tokens]   (tokens emitted per target call)

Drafters: ``exit:L`` (the target's first L layers + final norm + LM head, or a trained exit head)
or a separate model (``--drafter qwen2.5-coder-0.5b``). For chains, ``hsd`` is block verification,
which Sun et al. (ICLR 2025) prove optimal among lossless verifiers for a given draft
distribution, so its column is the limit; ``hsd-paper`` (lossy) is shown for reference only.

    python benchmarks/bench_verify.py --model smollm2-135m --drafters exit:8 exit:16 \\
        --prompt-sets mtbench humaneval --temperatures 0.6 1.0
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from sglang_hsd.runtime.cli import encode_prompts, load_exit_heads_option, load_model
from sglang_hsd.sampling import SamplingParams, logits_to_probs
from sglang_hsd.verify.chain import expected_accepted_per_length

METHODS = ("tokenwise", "hsd", "hsd-paper")


@torch.inference_mode()
def record_drafts(target, drafter_spec, drafter, prompts, params, num_draft, positions, seed, exit_heads=None):
    """Sample drafts and score them. Returns tokens [N, K], q [N, K, V], p [N, K+1, V]."""
    gen = torch.Generator().manual_seed(seed)
    hf = target.hf
    all_tokens, all_q, all_p = [], [], []
    for prompt in prompts:
        context = list(prompt)
        for _ in range(positions):
            draft, q_rows = [], []
            for _ in range(num_draft):
                q_rows.append(_draft_probs(hf, drafter_spec, drafter, context + draft, params, exit_heads or {}))
                draft.append(int(torch.multinomial(q_rows[-1], 1, generator=gen)))
            logits = hf(torch.tensor([context + draft])).logits[0, len(context) - 1 :]
            p_rows = logits_to_probs(logits.unsqueeze(0), params)[0]
            all_tokens.append(torch.tensor(draft))
            all_q.append(torch.stack(q_rows))
            all_p.append(p_rows)
            # Advance the context by target samples, so drafts start from varied positions.
            for _ in range(4):
                row = logits_to_probs(hf(torch.tensor([context])).logits[0, -1:], params)[0]
                context.append(int(torch.multinomial(row, 1, generator=gen)))
    return torch.stack(all_tokens), torch.stack(all_q), torch.stack(all_p)


def _draft_probs(hf, drafter_spec, drafter, ids, params, exit_heads):
    if drafter_spec.startswith("exit:"):
        layer = int(drafter_spec.split(":")[1])
        out = hf.model(torch.tensor([ids]), output_hidden_states=True)
        hidden = out.hidden_states[layer][:, -1:]  # output of layer `layer` (index 0 = embeddings)
        head = exit_heads.get(layer)
        logits = (head(hidden) if head is not None else hf.lm_head(hf.model.norm(hidden)))[0]
    else:
        logits = drafter.hf(torch.tensor([ids])).logits[0, -1:]
    return logits_to_probs(logits, params)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--drafters", nargs="+", default=["exit:8", "exit:16"],
                        help="exit:<layer> or a model name with the same tokenizer")
    parser.add_argument("--prompt-sets", nargs="+", default=["mtbench", "humaneval"])
    parser.add_argument("--num-prompts", type=int, default=3)
    parser.add_argument("--positions", type=int, default=4, help="drafts per prompt")
    parser.add_argument("--max-draft", type=int, default=8)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.6, 1.0])
    parser.add_argument("--exit-heads", default="auto", help="trained exit heads: 'auto', 'none' or a folder")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--name", default="verify")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from sglang_hsd.assets.prompts import load_prompts

    target = load_model(args.model)
    exit_heads = load_exit_heads_option(target, args.exit_heads)
    rows = []
    for drafter_spec in args.drafters:
        drafter = None if drafter_spec.startswith("exit:") else load_model(drafter_spec)
        for prompt_set in args.prompt_sets:
            texts = [p.messages[0]["content"] for p in load_prompts(prompt_set, limit=args.num_prompts)]
            prompts = encode_prompts(target.tokenizer, texts)
            for temperature in args.temperatures:
                params = SamplingParams(temperature=temperature)
                tokens, q, p = record_drafts(target, drafter_spec, drafter, prompts, params,
                                             args.max_draft, args.positions, seed=0, exit_heads=exit_heads)
                means = {m: expected_accepted_per_length(tokens, q, p, m).mean(0) for m in METHODS}
                for k in range(2, args.max_draft + 1):
                    trained = drafter_spec.startswith("exit:") and int(drafter_spec[5:]) in exit_heads
                    row = {"drafter": drafter_spec + (" (trained head)" if trained else ""),
                           "prompt_set": prompt_set, "temperature": temperature,
                           "K": k, "drafts": tokens.shape[0]}
                    row.update({f"block_eff_{m}": 1 + float(means[m][k - 1]) for m in METHODS})
                    rows.append(row)
                print(f"{drafter_spec} {prompt_set} T={temperature}: K=8 block efficiency "
                      + ", ".join(f"{m} {1 + float(means[m][-1]):.3f}" for m in METHODS), flush=True)
    out_dir = Path(__file__).parent / "results"
    out_dir.mkdir(exist_ok=True)
    (out_dir / f"{args.name}.json").write_text(json.dumps({"model": args.model, "rows": rows}, indent=1))
    table = format_table(rows, args.model)
    (out_dir / f"{args.name}.md").write_text(table)
    print(table)


def format_table(rows, model) -> str:
    lines = [
        f"Block efficiency (tokens per target call, exact expectation per sampled draft), target {model}",
        "",
        "| drafter | prompts | T | K | drafts | tokenwise | hsd (= block, optimal) | hsd gain | hsd-paper (lossy) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        gain = r["block_eff_hsd"] / r["block_eff_tokenwise"] - 1
        lines.append(
            f"| {r['drafter']} | {r['prompt_set']} | {r['temperature']} | {r['K']} | {r['drafts']} | "
            f"{r['block_eff_tokenwise']:.3f} | {r['block_eff_hsd']:.3f} | {100 * gain:+.1f}% | "
            f"{r['block_eff_hsd-paper']:.3f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
