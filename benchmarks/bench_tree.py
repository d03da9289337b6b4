"""Tree verification on real models: stock top-k trees vs sampled trees with real q.

For each context (a prompt plus the first 0, 8, 16, ... tokens of a target-sampled continuation at
T = 1) and each tree shape (``topk`` children per node, ``depth`` levels) and temperature, the
comparison a user faces with one drafter:

* stock: the drafter's deterministic top-k children, verified ``target-only`` (SGLang's current
  semantics). The tree is fixed given the context, so its expected accepted draft tokens are
  computed exactly: target-only accepts child x of an accepted node n with probability p_n(x), so
  E = sum over non-root nodes of the target probability of the node's path;
* sampled: children drawn without replacement from the drafter's real q, verified by ``rrs`` and
  by ``hsd`` on the same trees with the same ``TreeUniforms`` (paired), Monte Carlo over
  ``--trees`` trees x ``--coins`` verifier draws per tree; standard errors are over trees.

Target rows come from one target forward per tree over its internal nodes with the tree attention
mask on top of the context's KV cache (leaves need no row: the bonus token is not counted);
``--check`` compares that forward with plain per-path forwards once.

Recorded worlds (exact): per context, the real p and q restricted to a tiny vocabulary of V tokens
at every node up to depth - 1: tiny token i < V - 1 is the target's (i+1)-th most likely token at
that node, token V - 1 lumps the rest (its mass 1 - sum of the others; its continuation uses the
target's V-th most likely token). ``tree_exact`` then gives the exact expected accepted tokens of
the three rules, as in ``tests/verify/tree/test_expected_accepted.py``, and, at the server's node
budget N = ``--num-draft-tokens`` (root included), of the level-synchronous default rule
(``sglang_hsd/tree_draft/drafter.py``'s ``spine_wide`` + hsd, through its sequential twin in
``oracles/expand_exact.py``, which has the same law) against SGLang's stock tree at the same N
(top-k beam pruned to the N - 1 best path scores, target-only).

    python benchmarks/bench_tree.py --target qwen2.5-coder-1.5b --drafter model:qwen2.5-coder-0.5b
    python benchmarks/bench_tree.py --target smollm2-135m --drafter exit:16 --name tree_smollm2
    python benchmarks/bench_tree.py --target smollm2-135m --drafter eagle3 --name tree_smollm2_eagle3

``--drafter eagle3`` is the target's trained EAGLE-3 head (``drafters.Eagle3Prefix``: context
entries read the target's features, tree nodes their parent's head output, as in the server); its
prompts start after the last prompt of each set that trained the head.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import time

import numpy as np
import torch

from benchmarks.common import (RESULTS_DIR, RunRecord, add_standard_arguments, benchmark_parser, encoded_prompts,
                               fresh_prompt_offset, start_run, write_results)
from benchmarks.drafters import Eagle3Prefix, PrefixModel, load_draft_model, load_eagle3_head, node_logits
from sglang_hsd.runtime.loading import load_exit_heads_option, load_model
from sglang_hsd.sampling import SamplingParams, logits_to_probs
from sglang_hsd.verify import TreeUniforms, tree_attention_mask, verify_tree
from sglang_hsd.verify.oracles.full_tree_draft import sample_tree, topk_tree
from sglang_hsd.verify.oracles import tree_exact
from sglang_hsd.verify.oracles.exact import TabularWorld, prefix_offset
from sglang_hsd.verify.oracles.expand_exact import Shape, expand_round_law
from sglang_hsd.tree_draft import DEFAULT_LEVEL_RULE

SAMPLED_METHODS = ("rrs", "hsd")
# "hsd below stock" counts ignore differences this small: float32 target rows make a saturated
# stock tree's exact value 3 +- 1e-7.
TIE = 1e-6


def tree_paths(tree, b: int = 0) -> list[tuple[int, ...]]:
    """Token path (without the root token) to every node of row b of a ``DraftTree``."""
    parents, tokens = tree.parents[b].tolist(), tree.candidates[b].tolist()
    paths: list[tuple[int, ...]] = []
    for node, parent in enumerate(parents):  # breadth first: parents come before children
        paths.append(() if parent < 0 else paths[parent] + (tokens[node],))
    return paths


def draft_q_fn(drafter: PrefixModel, temperature: float):
    """``QFunction`` of one context (every batch row drafts from it): q rows at temperature T."""
    params = SamplingParams(temperature=temperature)

    def q_fn(paths: torch.Tensor) -> torch.Tensor:  # [B, M, d + 1]
        rows = node_logits(drafter, [tuple(p[1:]) for p in paths.flatten(0, 1).tolist()])
        return logits_to_probs(rows, params).view(*paths.shape[:2], -1)

    return q_fn


def tree_target_logits(target: PrefixModel, tree, b: int = 0) -> tuple[torch.Tensor, list[int]]:
    """Target logits at the internal nodes of row b of a tree: (float [I, V], their node indices)."""
    paths = tree_paths(tree, b)
    internal = [n for n in range(len(paths)) if int(tree.retrive_next_token[b, n]) >= 0]
    return node_logits(target, [paths[n] for n in internal]), internal


def target_rows(logits: torch.Tensor, internal: list[int], num_nodes: int, temperature: float) -> torch.Tensor:
    """float [1, N, V] target rows; leaves get a uniform placeholder (only the bonus token reads it)."""
    vocab = logits.shape[-1]
    rows = torch.full((num_nodes, vocab), 1.0 / vocab)
    rows[internal] = logits_to_probs(logits, SamplingParams(temperature=temperature))
    return rows.unsqueeze(0)


def target_reach(tree, target: torch.Tensor) -> list[float]:
    """P(``target-only`` accepts node n) for every node of row 0 of a fixed tree (distinct
    siblings): the product of the target's probabilities along n's path (the root: 1; filler
    columns with no parent, as a ``LevelTree`` leaves when q's support runs out: 0).

    tree: batch-1 tree with ``parents`` and ``candidates``; target: float [1, N, V].
    """
    parents, tokens = tree.parents[0].tolist(), tree.candidates[0].tolist()
    reach = [1.0] + [0.0] * (len(parents) - 1)
    for node in range(1, len(parents)):  # parents come before their children
        if parents[node] >= 0:
            reach[node] = reach[parents[node]] * float(target[0, parents[node], tokens[node]])
    return reach


def stock_expected_accepted(tree, target: torch.Tensor) -> float:
    """Exact expected accepted draft tokens of ``target-only`` on a fixed tree: a child x of an
    accepted node n is accepted with probability p_n(x), so the expectation is the sum of the
    nodes' path probabilities (``target_reach``)."""
    return sum(target_reach(tree, target)[1:])


def lump_small_tokens(candidates: torch.Tensor, draft: torch.Tensor, target: torch.Tensor, keep_prob: float):
    """Keep the tokens some row gives more than ``keep_prob`` (and every drafted token); lump the
    rest into one extra column so rows still sum to one. Verifying 150k-token rows is the cost of
    this benchmark; the lumped mass bounds how much a fold's residual mass can change.

    candidates: int64 [1, N]; draft / target: float [1, N, V]. Returns (candidates [1, N] remapped,
    draft [1, N, K + 1], target [1, N, K + 1], largest lumped mass of any internal row).
    """
    internal = target.new_zeros(target.shape[1], dtype=torch.bool)
    internal[draft[0].sum(-1) > 0] = True
    keep = ((draft[0] > keep_prob) | (target[0] > keep_prob)).any(0)
    keep[candidates[0]] = True
    kept = keep.nonzero().squeeze(-1)
    new_index = torch.full((keep.numel(),), -1, dtype=torch.long)
    new_index[kept] = torch.arange(kept.numel())
    lumped = []
    for rows in (draft, target):
        small = rows[..., kept]
        lumped.append(torch.cat([small, (1.0 - small.sum(-1, keepdim=True)).clamp_min(0.0)], dim=-1))
    rest = torch.maximum(lumped[0][0, internal, -1], lumped[1][0, internal, -1]).max() if internal.any() else 0.0
    return new_index[candidates], lumped[0], lumped[1], float(rest)


def paired_accepted(tree, b: int, target: torch.Tensor, coins: int, generator, keep_prob: float = 0.0):
    """Mean accepted draft tokens of each sampled method on row b of a tree, same uniforms for all.

    target: float [1, N, V], the target rows of that tree. ``keep_prob`` > 0 lumps rare tokens
    (``lump_small_tokens``). Returns ({method: mean}, largest lumped mass)."""
    num_nodes = tree.candidates.shape[1]
    uniforms = TreeUniforms.draw(coins, num_nodes, generator=generator)
    candidates, draft, rest = tree.candidates[b : b + 1], tree.draft_probs[b : b + 1], 0.0
    if keep_prob > 0:
        candidates, draft, target, rest = lump_small_tokens(candidates, draft, target, keep_prob)
    expand = lambda t: t.expand(coins, *t.shape[1:])  # noqa: E731
    links = [tree.retrive_next_token[b : b + 1], tree.retrive_next_sibling[b : b + 1]]
    out = {}
    for method in SAMPLED_METHODS:
        res = verify_tree(expand(candidates), expand(links[0]), expand(links[1]),
                          expand(draft), expand(target), method=method, uniforms=uniforms,
                          validate=False, draft_mode="without-replacement")
        out[method] = float(res.num_accepted.double().mean())
    return out, rest


def mean_se(values: list[float]) -> tuple[float, float]:
    return statistics.mean(values), (statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0)


def record_world(target: PrefixModel, drafter: PrefixModel, vocab: int, depth: int) -> dict:
    """Real logits at every node of a rank-mapped tiny tree (see the module docstring).

    Returns {"paths": tiny prefixes of length < depth (by length, then lexicographic), "real_paths":
    the real token paths they stand for, "target" / "draft":
    logits [P, V_real] at those prefixes, "tokens": real tokens [P, vocab] (column i = tiny token i)}.
    """
    tiny = [()]
    real = {(): ()}
    ranks = {(): torch.topk(target.memo[()], vocab).indices.tolist()}
    for length in range(1, depth):
        level = [tuple(t) for t in itertools.product(range(vocab), repeat=length)]
        for prefix in level:
            real[prefix] = real[prefix[:-1]] + (ranks[prefix[:-1]][prefix[-1]],)
        logits = node_logits(target, [real[p] for p in level])
        ranks.update({p: torch.topk(row, vocab).indices.tolist() for p, row in zip(level, logits)})
        tiny += level
    paths = [real[p] for p in tiny]
    return {"paths": tiny, "real_paths": paths, "target": node_logits(target, paths),
            "draft": node_logits(drafter, paths), "tokens": torch.tensor([ranks[p] for p in tiny])}


def world_at(recorded: dict, vocab: int, depth: int, temperature: float) -> TabularWorld:
    """A ``TabularWorld`` from recorded logits at temperature T; rows at depth ``depth`` are uniform
    (read only for the bonus token, never for the accepted count)."""
    params = SamplingParams(temperature=temperature)
    rows = {}
    for name in ("target", "draft"):
        probs = logits_to_probs(recorded[name], params).double()
        kept = probs.gather(1, recorded["tokens"][:, : vocab - 1])
        table = torch.cat([kept, (1.0 - kept.sum(-1, keepdim=True)).clamp_min(0.0)], dim=1)
        full = np.full((prefix_offset(vocab, depth + 1), vocab), 1.0 / vocab)
        full[: table.shape[0]] = (table / table.sum(-1, keepdim=True)).numpy()
        rows[name] = full
    return TabularWorld(vocab, depth, rows["target"], rows["draft"])


def world_exact(world: TabularWorld, topk: int, depth: int) -> dict[str, float]:
    """Exact expected accepted draft tokens of the three rules on a tiny world (one round)."""
    return {
        "stock": float(tree_exact.tree_expected_accepted(world, "target-only", topk, depth, (), "top-k")),
        "rrs": float(tree_exact.tree_expected_accepted(world, "rrs", topk, depth, (), "without-replacement")),
        "hsd": float(tree_exact.tree_expected_accepted(world, "hsd", topk, depth, (), "without-replacement")),
    }


def world_budgeted(world: TabularWorld, topk: int, depth: int, num_draft_tokens: int) -> dict[str, float]:
    """Exact expected accepted drafts at node budget N: level-synchronous default (sampled children,
    and argmax-first children: ``--hsd-tree-draft argmax-first``) vs SGLang's stock."""
    shape = Shape(depth, topk, num_draft_tokens)
    return {"level_hsd": float(expand_round_law(world, DEFAULT_LEVEL_RULE, shape).expected_accepted),
            "level_argmax_first": float(expand_round_law(world, DEFAULT_LEVEL_RULE, shape, children="argmax-first")
                                        .expected_accepted),
            "level_stock": float(expand_round_law(world, "stock", shape).expected_accepted)}


def world_monte_carlo(world: TabularWorld, method: str, topk: int, depth: int, trees: int, generator) -> tuple[float, float]:
    """Accepted draft tokens of ``method`` on ``trees`` sampled trees of a tiny world: (mean, SE)."""
    def q_fn(paths: torch.Tensor) -> torch.Tensor:  # [B, M, d + 1], column 0 a dummy root token
        flat = [world.q(tuple(p[1:])) for p in paths.reshape(-1, paths.shape[-1]).tolist()]
        return torch.tensor(np.array(flat)).view(*paths.shape[:2], world.vocab_size)

    tree = sample_tree(q_fn, topk, depth, generator, root_tokens=torch.zeros(trees, dtype=torch.long))
    target = torch.zeros(tree.draft_probs.shape, dtype=torch.float64)
    for b in range(trees):
        paths = tree_paths(_batch_row(tree, b))
        target[b] = torch.tensor(np.array([world.p(path) for path in paths]))
    res = verify_tree(tree.candidates, tree.retrive_next_token, tree.retrive_next_sibling, tree.draft_probs, target,
                      method=method, generator=generator, validate=False)
    return mean_se(res.num_accepted.double().tolist())


def _batch_row(tree, b: int):
    """Row b of a ``DraftTree`` as a batch-1 tree (the fields ``tree_paths`` reads)."""
    return argparse.Namespace(parents=tree.parents[b : b + 1], candidates=tree.candidates[b : b + 1])


def load_pair(target_name: str, drafter_spec: str, exit_heads: str):
    """(target LoadedModel, target PrefixModel, drafter, drafter label) for ``--drafter``: the
    drafter a ``PrefixModel`` (exit:<layer>, model:<name>) or an ``Eagle3Prefix`` (eagle3[:<dir>]);
    its ``trained_prompts`` names the prompts that trained it."""
    kind, _, value = drafter_spec.partition(":")
    if kind not in ("exit", "model", "eagle3") or (kind != "eagle3" and not value):
        raise ValueError(f"--drafter must be exit:<layer>, model:<name> or eagle3[:<dir>], got {drafter_spec!r}")
    target = load_model(target_name)
    if kind == "eagle3":
        from eagle_heads.pipeline import training_prompt_names

        try:
            head, folder = load_eagle3_head(target, value)
        except ValueError as err:
            raise ValueError(f"--drafter {drafter_spec!r}: {err}") from None
        vocab = target.hf.lm_head.out_features
        drafter = Eagle3Prefix(head, target.hf, vocab, training_prompt_names(folder.parent))
        return target, PrefixModel(target.hf, vocab_size=vocab), drafter, "eagle3 (server feeding)"
    if kind == "exit":
        layer = int(value)
        head = load_exit_heads_option(target, exit_heads).get(layer)
        vocab = target.hf.lm_head.out_features
        label = f"exit:{layer} ({'trained head' if head is not None else 'logit lens'})"
        return target, PrefixModel(target.hf, vocab_size=vocab), PrefixModel(target.hf, layer, head, vocab), label
    drafter = load_draft_model(target, value)
    vocab = min(target.hf.lm_head.out_features, drafter.hf.lm_head.out_features)
    return target, PrefixModel(target.hf, vocab_size=vocab), PrefixModel(drafter.hf, vocab_size=vocab), f"model:{value}"


def prompt_items(tokenizer, prompt_sets: list[str], num_prompts: int, trained: set[str] = frozenset()) -> list[dict]:
    """Encoded prompts, alternating between the sets (a run stopped early still covers each set).
    ``trained``: "set/id" names of prompts a drafter was trained on; each set starts after the
    last of them (``common.fresh_prompt_offset``), and "prompt" is the index in the set."""
    per_set = []
    for prompt_set in prompt_sets:
        offset = fresh_prompt_offset(prompt_set, trained)
        encoded = encoded_prompts(tokenizer, prompt_set, offset + num_prompts)[offset:]
        per_set.append([{"set": prompt_set, "prompt": offset + i, "ids": ids} for i, ids in enumerate(encoded)])
    return [item for group in itertools.zip_longest(*per_set) for item in group if item is not None]


@torch.inference_mode()
def continuation(target, ids: list[int], length: int, seed: int, temperature: float = 1.0) -> list[int]:
    """ids plus ``length`` target tokens sampled at ``temperature`` (no top-k / top-p)."""
    if length == 0:  # generate() refuses max_new_tokens=0
        return list(ids)
    if not temperature > 0:
        raise ValueError(f"continuation temperature must be > 0, got {temperature}")
    torch.manual_seed(seed)
    generated = target.hf.generate(torch.tensor([ids]), do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
                                   max_new_tokens=length, min_new_tokens=length)
    return generated[0].tolist()


def contexts(target_loaded, target: PrefixModel, drafter: PrefixModel, items: list[dict], positions: list[int],
             seed: int, temperature: float = 1.0):
    """Yield (item, position, context tokens) with both models' caches set to that context: the
    prompt plus the first ``position`` tokens of one target continuation at ``temperature`` per
    prompt."""
    for item in items:
        tokens = continuation(target_loaded, item["ids"], max(positions), seed + item["prompt"], temperature)
        target_logits, drafter_logits = target.prefill(tokens), drafter.prefill(tokens)
        for position in sorted(positions, reverse=True):  # crop the caches from long to short
            length = len(item["ids"]) + position
            target.set_context(length, target_logits[length - 1])
            drafter.set_context(length, drafter_logits[length - 1])
            yield item, position, tokens[:length]


def run_context(target, drafter, root_token: int, args, generator) -> dict:
    """Every (topk, T) measurement of one context (``set_context`` done on both models): {(topk, T): row}."""
    results = {}
    recorded = record_world(target, drafter, args.world_vocab, args.depth)
    for topk in args.topk:
        # The top-k tree does not depend on the temperature.
        stock = topk_tree(draft_q_fn(drafter, 1.0), topk, args.depth, root_tokens=torch.tensor([root_token]))
        stock_logits, stock_internal = tree_target_logits(target, stock)
        num_nodes = stock.candidates.shape[1]
        for temperature in args.temperature:
            target_at = lambda logits, internal: target_rows(logits, internal, num_nodes, temperature)  # noqa: E731
            row = {"stock": stock_expected_accepted(stock, target_at(stock_logits, stock_internal))}
            trees = sample_tree(draft_q_fn(drafter, temperature), topk, args.depth, generator,
                                root_tokens=torch.full((args.trees,), root_token))
            per_tree = {m: [] for m in SAMPLED_METHODS}
            row["lumped_mass"] = 0.0
            for b in range(args.trees):
                values, rest = paired_accepted(trees, b, target_at(*tree_target_logits(target, trees, b)), args.coins,
                                               generator, args.keep_prob)
                row["lumped_mass"] = max(row["lumped_mass"], rest)
                for method in SAMPLED_METHODS:
                    per_tree[method].append(values[method])
            for method in SAMPLED_METHODS:
                row[method], row[f"{method}_se"] = mean_se(per_tree[method])
            _, row["hsd_minus_rrs_se"] = mean_se([h - r for h, r in zip(per_tree["hsd"], per_tree["rrs"])])
            world = world_at(recorded, args.world_vocab, args.depth, temperature)
            row.update({f"world_{k}": v for k, v in world_exact(world, topk, args.depth).items()})
            budgeted = world_budgeted(world, topk, args.depth, args.num_draft_tokens)
            row.update({f"world_{k}": v for k, v in budgeted.items()})
            results[(topk, temperature)] = row
    return results, recorded


def summarize(rows: list[dict]) -> list[dict]:
    """Per (topk, T): means over contexts, gains with standard errors, contexts where hsd loses."""
    out = []
    for key in sorted({(r["topk"], r["temperature"]) for r in rows}, key=lambda k: (k[0], -k[1])):
        sel = [r for r in rows if (r["topk"], r["temperature"]) == key]
        n = len(sel)
        mean = lambda name: sum(r[name] for r in sel) / n  # noqa: E731
        pooled = lambda name: math.sqrt(sum(r[name] ** 2 for r in sel)) / n  # noqa: E731
        out.append({
            "topk": key[0], "temperature": key[1], "contexts": n,
            "stock": mean("stock"), "rrs": mean("rrs"), "hsd": mean("hsd"),
            "hsd_minus_stock": mean("hsd") - mean("stock"), "hsd_minus_stock_se": pooled("hsd_se"),
            "hsd_minus_rrs": mean("hsd") - mean("rrs"), "hsd_minus_rrs_se": pooled("hsd_minus_rrs_se"),
            "hsd_below_stock": sum(r["hsd"] < r["stock"] - TIE for r in sel),
            "hsd_below_stock_2se": sum(r["hsd"] + 2 * r["hsd_se"] < r["stock"] - TIE for r in sel),
            "world_stock": mean("world_stock"), "world_rrs": mean("world_rrs"), "world_hsd": mean("world_hsd"),
            "world_hsd_below_stock": sum(r["world_hsd"] < r["world_stock"] - TIE for r in sel),
            "world_hsd_below_rrs": sum(r["world_hsd"] < r["world_rrs"] - TIE for r in sel),
            "world_level_hsd": mean("world_level_hsd"), "world_level_stock": mean("world_level_stock"),
            "world_level_argmax_first": mean("world_level_argmax_first"),
            "world_level_below_stock": sum(r["world_level_hsd"] < r["world_level_stock"] - TIE for r in sel),
        })
    return out


def save_results(name: str, meta: dict, rows: list[dict], run: RunRecord) -> None:
    """``benchmarks/results/<name>.json`` (meta, summary, rows, run) and ``.md`` (the tables)."""
    summary = summarize(rows)
    write_results(RESULTS_DIR / name, {"meta": meta, "summary": summary, "rows": rows},
                  format_tables(meta, rows, summary), run)


def format_tables(meta: dict, rows: list[dict], summary: list[dict]) -> str:
    """The Markdown result: summary over contexts, recorded tiny worlds, every context."""
    lines = [f"# Tree verification: {meta['target']} with drafter {meta['drafter']}", "",
             "Accepted draft tokens per round (the bonus token not counted). " + ", ".join(
                 f"{k} {v}" for k, v in meta.items() if k not in ("target", "drafter", "command")), "",
             f"    {meta['command']}", "",
             "## Real distributions (stock exact; sampled: Monte Carlo, paired rrs/hsd, +- 1 SE)", "",
             "| topk | T | contexts | stock top-k + target-only | sampled + rrs | sampled + hsd | hsd - stock | "
             "hsd - rrs | contexts hsd < stock (beyond 2 SE) |", "|---" * 9 + "|"]
    for s in summary:
        lines.append(f"| {s['topk']} | {s['temperature']} | {s['contexts']} | {s['stock']:.3f} | {s['rrs']:.3f} | "
                     f"{s['hsd']:.3f} | {s['hsd_minus_stock']:+.3f} +- {s['hsd_minus_stock_se']:.3f} | "
                     f"{s['hsd_minus_rrs']:+.3f} +- {s['hsd_minus_rrs_se']:.3f} | {s['hsd_below_stock']} "
                     f"({s['hsd_below_stock_2se']}) |")
    lines += ["", f"## Recorded tiny worlds (exact, V = {meta['world_vocab']}: target's top {meta['world_vocab'] - 1}"
              " per node + one lumped token)", "",
              "| topk | T | worlds | stock top-k + target-only | sampled + rrs | sampled + hsd | hsd - stock | "
              "hsd - rrs | worlds hsd < stock | worlds hsd < rrs |", "|---" * 10 + "|"]
    for s in summary:
        lines.append(f"| {s['topk']} | {s['temperature']} | {s['contexts']} | {s['world_stock']:.3f} | "
                     f"{s['world_rrs']:.3f} | {s['world_hsd']:.3f} | {s['world_hsd'] - s['world_stock']:+.3f} | "
                     f"{s['world_hsd'] - s['world_rrs']:+.3f} | {s['world_hsd_below_stock']} | "
                     f"{s['world_hsd_below_rrs']} |")
    lines += ["", f"## Recorded tiny worlds at node budget N = {meta['num_draft_tokens']} (exact, depth <= "
              f"{meta['depth']})", "", f"| topk | T | worlds | stock (pruned top-k) + target-only | {DEFAULT_LEVEL_RULE} + hsd | "
              "difference | worlds below stock | argmax-first children + hsd |", "|---" * 8 + "|"]
    for s in summary:
        lines.append(f"| {s['topk']} | {s['temperature']} | {s['contexts']} | {s['world_level_stock']:.3f} | "
                     f"{s['world_level_hsd']:.3f} | {s['world_level_hsd'] - s['world_level_stock']:+.3f} | "
                     f"{s['world_level_below_stock']} | {s['world_level_argmax_first']:.3f} |")
    lines += ["", "## Per context", "",
              "| topk | T | context | set | prompt | pos | stock | rrs | hsd | hsd - stock | hsd - rrs | world stock | "
              "world rrs | world hsd |", "|---" * 14 + "|"]
    for r in sorted(rows, key=lambda r: (r["topk"], -r["temperature"], r["context"])):
        lines.append(f"| {r['topk']} | {r['temperature']} | {r['context']} | {r['set']} | {r['prompt']} | "
                     f"{r['position']} | {r['stock']:.3f} | {r['rrs']:.3f} +- {r['rrs_se']:.3f} | {r['hsd']:.3f} +- "
                     f"{r['hsd_se']:.3f} | {r['hsd'] - r['stock']:+.3f} | {r['hsd'] - r['rrs']:+.3f} +- "
                     f"{r['hsd_minus_rrs_se']:.3f} | {r['world_stock']:.3f} | {r['world_rrs']:.3f} | "
                     f"{r['world_hsd']:.3f} |")
    return "\n".join(lines) + "\n"


def consistency_checks(target, context: list[int], recorded: dict, args, generator) -> dict:
    """Tree-mask forward vs per-path forwards, and exact vs Monte Carlo hsd on one recorded world."""
    real = [recorded["real_paths"][i] for i in (0, 1, -1)]  # the root, a depth-1 and the deepest path
    diff = float((node_logits(target, real) - target.path_logits(context, real)).abs().max())
    world = world_at(recorded, args.world_vocab, args.depth, 1.0)
    exact = world_exact(world, args.topk[0], args.depth)
    mc = {m: world_monte_carlo(world, m, args.topk[0], args.depth, args.check_trees, generator) for m in SAMPLED_METHODS}
    return {"tree_mask_vs_per_path_max_abs_logit_diff": diff, "world_exact": exact,
            "world_monte_carlo": {m: {"mean": v[0], "se": v[1]} for m, v in mc.items()},
            "check_trees": args.check_trees, "check_topk": args.topk[0]}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--target", "--model", dest="target", default="smollm2-135m")
    parser.add_argument("--drafter", default="exit:16", help="exit:<layer> of the target, model:<name> or eagle3[:<dir>]")
    parser.add_argument("--topk", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--temperature", type=float, nargs="+", default=[1.0, 0.6])
    parser.add_argument("--prompt-sets", nargs="+", default=["humaneval", "mtbench"])
    parser.add_argument("--num-prompts", type=int, default=4, help="per prompt set")
    parser.add_argument("--positions", type=int, nargs="+", default=[0, 8, 16],
                        help="contexts: the prompt plus this many continuation tokens")
    parser.add_argument("--trees", type=int, default=12, help="sampled trees per context and (topk, T)")
    parser.add_argument("--coins", type=int, default=8, help="verifier draws per sampled tree")
    parser.add_argument("--world-vocab", type=int, default=5)
    parser.add_argument("--num-draft-tokens", type=int, default=8,
                        help="node budget N (root included) of the budgeted rules on the recorded worlds")
    parser.add_argument("--keep-prob", type=float, default=1e-7,
                        help="sampled trees: lump tokens no row gives more than this (0 = verify full rows)")
    parser.add_argument("--check", action="store_true", help="consistency checks on the first context")
    parser.add_argument("--check-trees", type=int, default=20000)
    add_standard_arguments(parser, exit_heads=True, seed=0, name="tree")
    args = parser.parse_args(argv)
    if min(args.positions) < 0 or any(k < 1 or k >= args.world_vocab for k in args.topk):
        raise ValueError("--positions must be >= 0 and every --topk in [1, --world-vocab)")
    if any(not 2 <= args.num_draft_tokens <= 1 + k + (args.depth - 1) * k * k for k in args.topk):
        raise ValueError("--num-draft-tokens must be in [2, 1 + k + (depth - 1) k^2] for every --topk")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    run = start_run(__file__, argv)
    torch.set_num_threads(1)
    target_loaded, target, drafter, label = load_pair(args.target, args.drafter, args.exit_heads)
    items = prompt_items(target_loaded.tokenizer, args.prompt_sets, args.num_prompts, drafter.trained_prompts)
    generator = torch.Generator().manual_seed(args.seed)
    meta = {"target": args.target, "drafter": label, "depth": args.depth, "trees": args.trees, "coins": args.coins,
            "num_draft_tokens": args.num_draft_tokens,
            "keep_prob": args.keep_prob,
            "world_vocab": args.world_vocab, "positions": args.positions, "prompt_sets": args.prompt_sets,
            "continuation": "target, T = 1", "command": run.command}
    rows, started = [], time.time()
    for item, position, tokens in contexts(target_loaded, target, drafter, items, args.positions, args.seed):
        ctx_start = time.time()
        measured, recorded = run_context(target, drafter, tokens[-1], args, generator)
        if args.check and "checks" not in meta:
            meta["checks"] = consistency_checks(target, tokens, recorded, args, generator)
            print("checks:", json.dumps(meta["checks"]), flush=True)
        rows += context_rows(rows, item, position, measured)
        meta["seconds"] = round(time.time() - started)
        print(f"  context {rows[-1]['context']}: {time.time() - ctx_start:.0f} s", flush=True)
        save_results(args.name, meta, rows, run)
    for s in summarize(rows):
        print(json.dumps(s))


def context_rows(rows: list[dict], item: dict, position: int, measured: dict) -> list[dict]:
    """Result rows of one context (numbered after the contexts in ``rows``), printed as they go."""
    context_id = len({(r["set"], r["prompt"], r["position"]) for r in rows})
    new = []
    for (topk, temperature), row in measured.items():
        new.append({"context": context_id, "set": item["set"], "prompt": item["prompt"],
                    "position": position, "topk": topk, "temperature": temperature, **row})
        print(f"ctx {context_id} {item['set']}#{item['prompt']}@{position} topk {topk} T {temperature}: "
              f"stock {row['stock']:.3f} rrs {row['rrs']:.3f} hsd {row['hsd']:.3f} +- {row['hsd_se']:.3f} | "
              f"world stock {row['world_stock']:.3f} rrs {row['world_rrs']:.3f} hsd {row['world_hsd']:.3f} | "
              f"budget stock {row['world_level_stock']:.3f} level {row['world_level_hsd']:.3f}",
              flush=True)
    return new


if __name__ == "__main__":
    main()
