"""Tree verification on a real model: stock top-k trees vs sampled trees with real q.

For each context (a prompt plus a few target-sampled tokens), the comparison a user faces with the
same drafter and tree shape (topk children per node, depth levels):

* stock: deterministic top-k children, verified ``target-only`` (SGLang's current semantics);
* sampled without replacement with the real q, verified by ``rrs`` and by ``hsd`` (same trees).

Accepted draft tokens per round are averaged over ``--trees`` sampled trees and ``--coins``
verifier draws per tree (Monte Carlo; the exact tables on tiny worlds are in
``tests/verify/test_tree_expected_accepted.py``).

    python benchmarks/bench_tree.py --model smollm2-135m --drafter exit:16 --topk 2 --depth 3
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from sglang_hsd.runtime.cli import encode_prompts, load_exit_heads_option, load_model
from sglang_hsd.sampling import SamplingParams, logits_to_probs
from sglang_hsd.verify.tree import verify_tree
from sglang_hsd.verify.tree_draft import sample_tree, topk_tree


def _paths_to_nodes(tree) -> list[list[int]]:
    """Token path (root first) to every node of a batch-1 tree."""
    parents, tokens = tree.parents[0].tolist(), tree.candidates[0].tolist()
    paths = []
    for node in range(len(parents)):
        path, cur = [], node
        while cur >= 0:
            path.append(tokens[cur])
            cur = parents[cur]
        paths.append(path[::-1])
    return paths


@torch.inference_mode()
def _last_probs(hf, layer, prefix, paths, params, head=None) -> torch.Tensor:
    """Distribution after prefix + each path (paths of equal length). float [M, V].

    ``layer`` None = the full target; else the exit at ``layer`` with ``head`` (trained exit head)
    or the final norm + LM head.
    """
    ids = torch.tensor([prefix + p for p in paths])
    if layer is None:
        logits = hf(ids).logits[:, -1]
    else:
        hidden = hf.model(ids, output_hidden_states=True).hidden_states[layer][:, -1]
        logits = head(hidden) if head is not None else hf.lm_head(hf.model.norm(hidden))
    return logits_to_probs(logits, params)


def _accepted(tree, hf, prefix, params, method, draft_mode, coins, gen) -> float:
    paths = _paths_to_nodes(tree)
    vocab = tree.draft_probs.shape[-1]
    target = torch.zeros(1, len(paths), vocab)
    by_len: dict[int, list[int]] = {}
    for node, path in enumerate(paths):
        by_len.setdefault(len(path), []).append(node)
    for nodes in by_len.values():
        target[0, nodes] = _last_probs(hf, None, prefix, [paths[n] for n in nodes], params)
    total = 0.0
    for _ in range(coins):
        res = verify_tree(tree.candidates, tree.retrive_next_token, tree.retrive_next_sibling, tree.draft_probs,
                          target, method=method, generator=gen, validate=False, draft_mode=draft_mode)
        total += float(res.num_accepted[0])
    return total / coins


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--drafter", default="exit:16", help="exit:<layer> of the target")
    parser.add_argument("--topk", type=int, default=2)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--prompt-set", default="mtbench")
    parser.add_argument("--num-prompts", type=int, default=4)
    parser.add_argument("--trees", type=int, default=6)
    parser.add_argument("--coins", type=int, default=8)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--exit-heads", default="auto", help="trained exit heads: 'auto', 'none' or a folder")
    parser.add_argument("--name", default="tree")
    args = parser.parse_args()
    torch.set_num_threads(1)

    from sglang_hsd.assets.prompts import load_prompts

    target = load_model(args.model)
    hf, layer = target.hf, int(args.drafter.split(":")[1])
    head = load_exit_heads_option(target, args.exit_heads).get(layer)
    params = SamplingParams(temperature=args.temperature)
    texts = [p.messages[0]["content"] for p in load_prompts(args.prompt_set, limit=args.num_prompts)]
    gen = torch.Generator().manual_seed(0)
    rows = []
    for context in encode_prompts(target.tokenizer, texts):
        prefix, root = context[:-1], torch.tensor([context[-1]])

        def q_fn(paths, prefix=prefix):  # paths [1, M, d + 1] with the root token first
            return _last_probs(hf, layer, prefix, paths[0].tolist(), params, head).unsqueeze(0)

        stock = topk_tree(q_fn, args.topk, args.depth, root_tokens=root)
        row = {"stock target-only": _accepted(stock, hf, prefix, params, "target-only", "without-replacement",
                                              args.coins, gen)}
        sampled = {"sampled rrs": [], "sampled hsd": []}
        for _ in range(args.trees):
            tree = sample_tree(q_fn, args.topk, args.depth, gen, replacement=False, root_tokens=root)
            for method in ("rrs", "hsd"):
                sampled[f"sampled {method}"].append(
                    _accepted(tree, hf, prefix, params, method, "without-replacement", args.coins, gen))
        row.update({k: statistics.mean(v) for k, v in sampled.items()})
        rows.append(row)
        print(" | ".join(f"{k} {v:.3f}" for k, v in row.items()), flush=True)
    means = {k: statistics.mean(r[k] for r in rows) for k in rows[0]}
    out_dir = Path(__file__).parent / "results"
    out_dir.mkdir(exist_ok=True)
    meta = {k: getattr(args, k) for k in ("model", "drafter", "topk", "depth", "prompt_set", "trees", "coins",
                                          "temperature")}
    meta["exit_head"] = "trained" if head is not None else "logit lens"
    (out_dir / f"{args.name}.json").write_text(json.dumps({"meta": meta, "rows": rows, "mean": means}, indent=1))
    lines = [f"Accepted draft tokens per round (Monte Carlo), {meta}", "",
             "| context | " + " | ".join(means) + " |", "|---" * (len(means) + 1) + "|"]
    lines += [f"| {i} | " + " | ".join(f"{r[k]:.3f}" for k in means) + " |" for i, r in enumerate(rows)]
    lines.append("| mean | " + " | ".join(f"{v:.3f}" for v in means.values()) + " |")
    (out_dir / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
