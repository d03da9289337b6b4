"""Budgeted trees at the server's shapes on recorded real distributions: exact, rule against rule.

``bench_tree.py`` compares full trees (every node has k children) and, as one extra table, one
node budget at a small depth. Its full trees cannot reach SGLang's shapes: at (D, k) = (5, 4) a
full tree has 1,364 nodes. This script computes only what the server drafts: for each context
(a prompt plus the first 0, 16, ... tokens of a target-sampled continuation, at T = 1 unless
``--continuation-temperature`` says otherwise) it records
the target's and the drafter's logits on a rank-mapped tiny tree (``bench_tree.record_world``:
tiny token i < V - 1 is the target's (i+1)-th most likely token at its node, token V - 1 lumps
the rest) up to the deepest shape asked for, and for each shape (D, k, N) and temperature it
gives the exact expected accepted draft tokens of one round (bonus token not counted) of

* ``stock``: SGLang's stock tree: the drafter's top-k children per beam, k beams per level, pruned
  to the N - 1 best path scores, verified ``target-only``;
* each lossless level rule of the server (``sglang_hsd.tree_draft.LEVEL_RULES``) with children
  drawn without replacement from q and traversal verification (``hsd``), through its sequential
  twin in ``sglang_hsd/verify/oracles/expand_exact.py`` (the same law as the batched drafter);
* the default rule with argmax-first children (``--hsd-tree-draft argmax-first``).

``--real-trees M`` measures the same trees on the real distributions instead (no tiny world, no
lumped token): the stock tree exactly and M trees per rule drawn by the server's own drafter
(``benchmarks/real_trees.py``). Use it when the drafter is weak (most of q outside the target's
best tokens), where the recorded-world law credits the lumped token to the sampled tree.

T = 0 is left out: there the server's greedy rows draft the same top-k tree in both modes and
every lossless verifier returns the target's argmax path, so both accept the same tokens.

The tiny world keeps the target's V - 1 best tokens per node and lumps the rest into one token,
so a drafter whose q spreads over many tokens outside them is credited with a lumped token both
sides can match: read the ratios here as the law's, and the server benchmark
(``bench_sglang_tree.py``) as the product's.

    PYTHONPATH=. python benchmarks/bench_tree_budget.py --target qwen2.5-coder-1.5b \\
        --drafter model:qwen2.5-coder-0.5b --prompt-sets sharegpt mtbench --num-prompts 4
    PYTHONPATH=. python benchmarks/bench_tree_budget.py --target smollm2-135m --drafter eagle3 \\
        --prompt-sets sharegpt mtbench --num-prompts 8 --name tree_budget_smollm2_eagle3
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from benchmarks.bench_tree import TIE, contexts, load_pair, prompt_items, record_world, world_at
from benchmarks.common import RESULTS_DIR, RunRecord, add_standard_arguments, benchmark_parser, start_run, write_results
from benchmarks import real_trees
from sglang_hsd.sampling import SamplingParams, logits_to_probs
from sglang_hsd.tree_draft import DEFAULT_CHILD_SAMPLER, DEFAULT_LEVEL_RULE, LOSSLESS_LEVEL_RULES, DraftPlan, TreeShape
from sglang_hsd.verify.oracles.expand_exact import Shape, expand_round_law

ARGMAX_FIRST = f"{DEFAULT_LEVEL_RULE}+argmax-first"
# The two trees a per-request switch chooses between (``switch_value``, ``confidence_value``).
SWITCHED = ("stock", DEFAULT_LEVEL_RULE)
# Root-confidence switches reported: the stock tree where the drafter's root q has max >= tau.
CONFIDENCE_THRESHOLDS = (0.4, 0.6, 0.8)


def shape_list(shape: Shape) -> list[int]:
    return [shape.depth, shape.topk, shape.num_draft_tokens]


def parse_shape(text: str) -> Shape:
    """``"D,k,N"`` -> ``Shape`` (the server's --speculative-num-steps, -eagle-topk, -num-draft-tokens)."""
    try:
        depth, topk, num = (int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shapes: expected D,k,N (three integers), got {text!r}") from None
    if depth < 1 or topk < 1 or not 2 <= num <= 1 + topk + (depth - 1) * topk * topk:
        raise argparse.ArgumentTypeError(f"--shapes: need D >= 1, k >= 1 and 2 <= N <= 1 + k + (D - 1) k^2, got {text!r}")
    return Shape(depth, topk, num)


def budget_values(world, shape: Shape, rules: list[str]) -> dict:
    """Exact expected accepted draft tokens of one round: ``stock``, each rule (sampled children,
    hsd) and ``ARGMAX_FIRST``; under "accepted_law", the law of the accepted count (a list, index
    a = 0 .. D) of the two trees a per-request switch would choose between (``SWITCHED``)."""
    laws = {"stock": expand_round_law(world, "stock", shape)}
    for rule in dict.fromkeys([*rules, DEFAULT_LEVEL_RULE]):
        laws[rule] = expand_round_law(world, rule, shape)
    values = {name: float(law.expected_accepted) for name, law in laws.items() if name == "stock" or name in rules}
    values[ARGMAX_FIRST] = float(expand_round_law(world, DEFAULT_LEVEL_RULE, shape, children="argmax-first")
                                 .expected_accepted)
    values["accepted_law"] = {name: accepted_law(laws[name].emitted, shape.depth) for name in SWITCHED}
    return values


def accepted_law(emitted: dict[tuple[int, ...], float], depth: int) -> list[float]:
    """P(a drafts accepted), a = 0 .. depth, from a round's law of emitted tokens (the accepted
    path and the token after it)."""
    law = [0.0] * (depth + 1)
    for tokens, prob in emitted.items():
        law[len(tokens) - 1] += prob
    return law


def switch_value(rows: list[dict], threshold: int) -> float:
    """Mean expected accepted drafts over ``rows`` (one (shape, T); several positions per prompt)
    of a per-request switch: a prompt's first context drafts the default sampled tree; at each
    later position the request drafts the stock tree when the round at its previous recorded
    position accepted >= ``threshold`` drafts, the default otherwise. Exact over the rounds'
    accepted-count laws: P(stock at i + 1) = sum over modes m of P(m at i) P_i^m(a >= threshold).
    Optimistic in one way (a real request decides from its last round, not from the same
    context a few tokens earlier) and pessimistic in another (positions here are further apart
    than rounds)."""
    default, values = DEFAULT_LEVEL_RULE, []
    for key in sorted({(r["set"], r["prompt"]) for r in rows}):
        stock_prob = 0.0
        for r in sorted((r for r in rows if (r["set"], r["prompt"]) == key), key=lambda r: r["position"]):
            values.append(stock_prob * r["stock"] + (1 - stock_prob) * r[default])
            laws = r["accepted_law"]
            stock_prob = (stock_prob * sum(laws["stock"][threshold:])
                          + (1 - stock_prob) * sum(laws[default][threshold:]))
    return statistics.mean(values)


def context_rows(recorded: dict, args, context: dict) -> list[dict]:
    """One row per (shape, T) of a recorded context."""
    depth = max(shape.depth for shape in args.shapes)
    rows = []
    for temperature in args.temperature:
        world = world_at(recorded, args.world_vocab, depth, temperature)
        for shape in args.shapes:
            values = budget_values(world, shape, args.rules)
            rows.append({**context, "shape": shape_list(shape), "temperature": temperature, **values})
    return rows


def real_context_rows(target, drafter, args, context: dict, generator: torch.Generator) -> list[dict]:
    """One row per (shape, T) of a context on the real distributions (``--real-trees M``): the stock
    tree's exact value and law, each rule's mean accepted drafts over M sampled trees (and its SE,
    "<rule>_se"), the default rule's empirical law of the accepted count."""
    rows = []
    for temperature in args.temperature:
        params = SamplingParams(temperature=temperature)
        for shape in args.shapes:
            tree_shape = TreeShape(shape.depth, shape.topk, shape.num_draft_tokens)
            stock_law = real_trees.stock_accepted_law(target, real_trees.stock_tree(drafter, tree_shape), params,
                                                      shape.depth)
            row = {**context, "shape": shape_list(shape), "temperature": temperature,
                   "stock": sum(a * p for a, p in enumerate(stock_law)), "real_trees": args.real_trees}
            for name, rule, sampler in [*((r, r, DEFAULT_CHILD_SAMPLER) for r in args.rules),
                                        (ARGMAX_FIRST, DEFAULT_LEVEL_RULE, "argmax_first_cdf")]:
                plan = DraftPlan.build(tree_shape, rule, sampler=sampler)
                trees = real_trees.draft_trees(drafter, plan, args.real_trees, params, generator)
                counts = real_trees.accepted(target, trees, params, sampler, generator).double()
                row[name], row[f"{name}_se"] = float(counts.mean()), float(counts.std() / len(counts) ** 0.5)
                if name == DEFAULT_LEVEL_RULE:
                    default_law = torch.bincount(counts.long(), minlength=shape.depth + 1) / len(counts)
            row["accepted_law"] = {"stock": stock_law, DEFAULT_LEVEL_RULE: default_law.tolist()}
            rows.append(row)
    return rows


def confidence_value(rows: list[dict], threshold: float) -> float:
    """Mean expected accepted drafts of a switch on the drafter's confidence at the root: the stock
    tree where the root's q (at the request's temperature) has max >= ``threshold``
    ("root_q_max"), the default elsewhere. The root's q is a function of the committed prefix
    alone, drawn before any draft, so either choice keeps each round lossless."""
    return statistics.mean(r["stock"] if r["root_q_max"] >= threshold else r[DEFAULT_LEVEL_RULE] for r in rows)


def root_q_max(drafter, temperature: float) -> float:
    """max of the drafter's q at the context's root under temperature T."""
    return float(logits_to_probs(drafter.memo[()][None].float(), SamplingParams(temperature=temperature)).max())


def summarize(rows: list[dict], names: list[str]) -> list[dict]:
    """Per (shape, T): means over contexts, each rule's ratio to stock, contexts below stock."""
    out = []
    for key in sorted({(tuple(r["shape"]), r["temperature"]) for r in rows}, key=lambda k: (k[0], -k[1])):
        sel = [r for r in rows if (tuple(r["shape"]), r["temperature"]) == key]
        means = {name: statistics.mean(r[name] for r in sel) for name in ["stock", *names]}
        depth = key[0][0]
        switch = {"switch a>=D-1": switch_value(sel, depth - 1), "switch a>=D": switch_value(sel, depth)}
        if all("root_q_max" in r for r in sel):
            switch.update({f"root q max>={t}": confidence_value(sel, t) for t in CONFIDENCE_THRESHOLDS})
        switch["best of the two per context"] = statistics.mean(max(r["stock"], r[DEFAULT_LEVEL_RULE]) for r in sel)
        out.append({"shape": list(key[0]), "temperature": key[1], "contexts": len(sel), "mean": means,
                    "ratio_to_stock": {n: (means[n] + 1) / (means["stock"] + 1) for n in names},
                    "below_stock": {n: sum(r[n] < r["stock"] - TIE for r in sel) for n in names},
                    "switch_ratio_to_stock": {n: (v + 1) / (means["stock"] + 1) for n, v in switch.items()}})
    return out


def format_tables(meta: dict, rows: list[dict], summary: list[dict]) -> str:
    names = meta["rules"]
    if meta.get("real_trees"):
        title = "on the real distributions"
        what = (f"Expected accepted draft tokens per round (bonus token not counted) on the full vocabularies: the stock "
                f"tree exact, the rules' means over {meta['real_trees']} sampled trees per context "
                "(`benchmarks/real_trees.py`; below and the per-context best carry that Monte Carlo noise)")
    else:
        title = "on recorded worlds"
        what = ("Exact expected accepted draft tokens per round (bonus token not counted) on rank-mapped tiny worlds "
                f"(V = {meta['world_vocab']}: the target's top {meta['world_vocab'] - 1} tokens per node + one lumped "
                "token)")
    lines = [f"# Budgeted trees {title}: {meta['target']} with drafter {meta['drafter']}", "",
             what + ". ratio: (1 + rule) / (1 + stock), tokens per target pass. below: contexts where the rule "
             "accepts less than stock.", "", f"    {meta['command']}", "",
             "| shape | T | contexts | stock | " + " | ".join(f"{n} | ratio | below" for n in names) + " |",
             "|---" * (4 + 3 * len(names)) + "|"]
    for s in summary:
        cells = [f"{s['mean'][n]:.3f} | {s['ratio_to_stock'][n]:.3f} | {s['below_stock'][n]}" for n in names]
        lines.append(f"| ({', '.join(map(str, s['shape']))}) | {s['temperature']} | {s['contexts']} | "
                     f"{s['mean']['stock']:.3f} | " + " | ".join(cells) + " |")
    lines += ["", f"## A per-request switch between the stock tree and {DEFAULT_LEVEL_RULE}", "",
              "ratio to stock of `switch_value` (the stock tree after a round that accepted >= a drafts, D the "
              "shape's depth), of `confidence_value` (the stock tree where the drafter's root q has max >= tau) "
              "and of the better of the two trees in each context (the ceiling of any per-context choice).", "",
              "| shape | T | " + " | ".join(summary[0]["switch_ratio_to_stock"]) + " |" if summary else "",
              "|---" * (2 + (len(summary[0]["switch_ratio_to_stock"]) if summary else 0)) + "|"]
    for s in summary:
        lines.append(f"| ({', '.join(map(str, s['shape']))}) | {s['temperature']} | "
                     + " | ".join(f"{v:.3f}" for v in s["switch_ratio_to_stock"].values()) + " |")
    lines += ["", "## Per context", "", "| shape | T | set | prompt | pos | stock | " + " | ".join(names) + " |",
              "|---" * (6 + len(names)) + "|"]
    for r in sorted(rows, key=lambda r: (r["shape"], -r["temperature"], r["set"], r["prompt"], r["position"])):
        lines.append(f"| ({', '.join(map(str, r['shape']))}) | {r['temperature']} | {r['set']} | {r['prompt']} | "
                     f"{r['position']} | {r['stock']:.3f} | " + " | ".join(f"{r[n]:.3f}" for n in names) + " |")
    return "\n".join(lines) + "\n"


def save_results(name: str, meta: dict, rows: list[dict], run: RunRecord) -> list[dict]:
    summary = summarize(rows, meta["rules"])
    write_results(RESULTS_DIR / name, {"meta": meta, "summary": summary, "rows": rows},
                  format_tables(meta, rows, summary), run)
    return summary


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--target", "--model", dest="target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--drafter", default="model:qwen2.5-coder-0.5b",
                        help="exit:<layer> of the target, model:<name>, or eagle3[:<dir>] (the target's trained "
                             "EAGLE-3 head, fed as the server feeds it; prompts start after its training prompts)")
    parser.add_argument("--shapes", type=parse_shape, nargs="+", default=[Shape(5, 4, 8), Shape(4, 2, 8)],
                        help="D,k,N as the server's --speculative-num-steps, -eagle-topk, -num-draft-tokens")
    parser.add_argument("--temperature", type=float, nargs="+", default=[0.7, 1.0])
    parser.add_argument("--rules", nargs="+", default=list(LOSSLESS_LEVEL_RULES), choices=list(LOSSLESS_LEVEL_RULES),
                        help=f"lossless level rules ({DEFAULT_LEVEL_RULE}, the default the switch study compares "
                             "with the stock tree, is always measured)")
    parser.add_argument("--prompt-sets", nargs="+", default=["sharegpt", "mtbench"])
    parser.add_argument("--num-prompts", type=int, default=4, help="per prompt set")
    parser.add_argument("--positions", type=int, nargs="+", default=[0, 16],
                        help="contexts: the prompt plus this many continuation tokens")
    parser.add_argument("--continuation-temperature", type=float, default=1.0,
                        help="the target samples each prompt's continuation (the contexts) at this temperature")
    parser.add_argument("--world-vocab", type=int, default=5)
    parser.add_argument("--real-trees", type=int, default=0,
                        help="M > 0: instead of the exact law on recorded tiny worlds, draft M trees per context "
                             "and rule on the real distributions (benchmarks/real_trees.py; stock stays exact)")
    add_standard_arguments(parser, exit_heads=True, seed=0, name="tree_budget")
    args = parser.parse_args(argv)
    if min(args.positions) < 0:
        parser.error("--positions must be >= 0")
    args.rules = list(dict.fromkeys([*args.rules, DEFAULT_LEVEL_RULE]))
    if not args.continuation_temperature > 0:
        parser.error(f"--continuation-temperature must be > 0, got {args.continuation_temperature}")
    if args.real_trees < 0 or args.real_trees == 1:
        parser.error(f"--real-trees must be 0 (the recorded-world law) or >= 2 (an SE needs two), got {args.real_trees}")
    if any(t <= 0 for t in args.temperature):
        parser.error("--temperature: every T must be > 0 (T = 0 is equal by construction, see the docstring)")
    if not args.real_trees and any(shape.topk >= args.world_vocab for shape in args.shapes):
        parser.error("--shapes: every k must be below --world-vocab")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    run = start_run(__file__, argv)
    target_loaded, target, drafter, label = load_pair(args.target, args.drafter, args.exit_heads)
    depth = max(shape.depth for shape in args.shapes)
    meta = {"target": args.target, "drafter": label, "shapes": [shape_list(s) for s in args.shapes],
            "temperatures": args.temperature, "rules": [*args.rules, ARGMAX_FIRST], "world_vocab": args.world_vocab,
            "positions": args.positions, "prompt_sets": args.prompt_sets,
            "continuation": f"target, T = {args.continuation_temperature}",
            "real_trees": args.real_trees, "command": run.command}
    rows, summary, started = [], [], time.time()
    items = prompt_items(target_loaded.tokenizer, args.prompt_sets, args.num_prompts, drafter.trained_prompts)
    generator = torch.Generator().manual_seed(args.seed)
    for item, position, _ in contexts(target_loaded, target, drafter, items, args.positions, args.seed,
                                      args.continuation_temperature):
        context = {"set": item["set"], "prompt": item["prompt"], "position": position}
        if args.real_trees:
            new = real_context_rows(target, drafter, args, context, generator)
        else:
            new = context_rows(record_world(target, drafter, args.world_vocab, depth), args, context)
        for r in new:
            r["root_q_max"] = root_q_max(drafter, r["temperature"])
        rows += new
        meta["seconds"] = round(time.time() - started)
        for r in new:
            print(f"{r['set']}#{r['prompt']}@{r['position']} {tuple(r['shape'])} T {r['temperature']}: "
                  + " ".join(f"{n} {r[n]:.3f}" for n in ["stock", *meta["rules"]]), flush=True)
        summary = save_results(args.name, meta, rows, run)
    for s in summary:
        print(json.dumps(s))


if __name__ == "__main__":
    main()
