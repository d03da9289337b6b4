"""How much any lossless verifier could gain at a tree's first level over SGLang's stock tree.

At each position of real continuations, for the target's p and the drafter's q at temperature T
(one sampling function for both, ``sglang_hsd.sampling.logits_to_probs``) and k children:

* stock: SGLang's deterministic top-k children of q, verified target-only, accept p(top-k of q)
  (exact; no verifier can do better with those children);
* rrs, hsd: k children drawn without replacement from q, verified by this project's
  ``verify_tree`` (recursive rejection; the traversal verifier, the default), Monte Carlo over
  ``--trees`` trees per position;
* bound: an upper bound on the acceptance of EVERY lossless verifier of such children
  (``verify/oracles/root_coupling.py``: the best coupling of Y ~ p with the random child set,
  evaluated on two families of min-cut sets).

The first level is where the two trees differ most when the drafter is weak: every deeper level
is reached only through it. Positions are teacher-forced: the target's own continuation (sampled at
T = 1 for the draft-model pair, the held-out features' continuation for the EAGLE-3 head), the
drafter conditioned on the same tokens (the EAGLE-3 head's first step on the target's features).

Pairs: ``qwen`` (Qwen2.5-Coder 0.5B drafting for 1.5B) on two prompt sets; ``smollm2-eagle3``
(SmolLM2-135M and the EAGLE-3 head in its heads folder, ``sglang-hsd train-heads --model
smollm2-135m --no-exit --eagle3``) on its held-out MT-Bench features.

    PYTHONPATH=. python benchmarks/tree_root_bound.py --pairs qwen smollm2-eagle3 --name tree_root_bound
"""

from __future__ import annotations

import statistics
from pathlib import Path

import torch

from benchmarks.common import RESULTS_DIR, add_standard_arguments, benchmark_parser, encoded_prompts, start_run, write_results
from sglang_hsd.sampling import SamplingParams, logits_to_probs
from sglang_hsd.verify import verify_tree
from sglang_hsd.verify.oracles.full_tree_draft import sample_tree
from sglang_hsd.verify.oracles.root_coupling import node_bound, restrict



def qwen_positions(args) -> list[dict]:
    """Teacher-forced logits of the Qwen pair: [{"set", "target" [P, V], "draft" [P, V]}] per set."""
    from benchmarks.bench_tree import continuation
    from sglang_hsd.runtime.loading import load_model

    target, drafter = load_model("qwen2.5-coder-1.5b"), load_model("qwen2.5-coder-0.5b")
    vocab = min(target.hf.lm_head.out_features, drafter.hf.lm_head.out_features)
    out = []
    for prompt_set in args.prompt_sets:
        rows_p, rows_q = [], []
        for i, ids in enumerate(encoded_prompts(target.tokenizer, prompt_set, args.num_prompts)):
            seq = continuation(target, ids, args.new_tokens, seed=args.seed + i)
            with torch.inference_mode():
                batch = torch.tensor([seq])
                lo, hi = len(ids) - 1, len(seq) - 1  # predictions of the continuation tokens
                rows_p.append(target.hf(batch).logits[0, lo:hi, :vocab].float())
                rows_q.append(drafter.hf(batch).logits[0, lo:hi, :vocab].float())
            print(f"qwen {prompt_set} prompt {i}: {hi - lo} positions", flush=True)
        out.append({"pair": "qwen", "set": prompt_set, "target": torch.cat(rows_p), "draft": torch.cat(rows_q)})
    return out


def smollm2_positions(args) -> list[dict]:
    """Teacher-forced first-step logits of SmolLM2-135M's EAGLE-3 head: on its held-out features, its
    training features, or features collected now on the prompts after its training prompts."""
    from eagle_heads import pipeline
    from eagle_heads.data import FeatureSet, collect_features
    from eagle_heads.eagle3_train import make_windows
    from sglang_hsd.assets import heads as heads_cache
    from sglang_hsd.runtime.eagle3 import Eagle3Head

    root = heads_cache.heads_dir("smollm2-135m")
    kind = "train" if args.smollm2_features == "fresh" else args.smollm2_features
    files = sorted(Path(root).glob(f"features-{kind}-*.pt"))
    if not (Path(root) / "eagle3" / "model.safetensors").exists() or not files:
        raise SystemExit(f"no EAGLE-3 head or {kind} features in {root}: run "
                         "`sglang-hsd train-heads --model smollm2-135m --no-exit --eagle3` first")
    target, tokenizer = pipeline.load_target("smollm2-135m")
    head = Eagle3Head.from_pretrained(str(Path(root) / "eagle3"), target)
    features = FeatureSet.load(str(files[-1]))
    if args.smollm2_features == "fresh":  # the next prompts of the set after the training ones
        features = collect_features(target, tokenizer, [args.smollm2_set], args.num_prompts,
                                    list(head.capture_layers), max_new_tokens=args.new_tokens,
                                    max_prompt_tokens=features.meta["max_prompt_tokens"],
                                    offset=features.meta["prompts_per_set"] + features.meta["offset"], seed=args.seed)
        trained = pipeline.training_prompt_names(Path(root))
        if trained & set(features.meta["names"]):
            raise SystemExit("fresh prompts overlap the head's training prompts")
    mask = features.continuation_mask()
    lengths = (features.seq_indptr[1:] - features.seq_indptr[:-1]).tolist()
    names = features.meta.get("names") or [""] * len(lengths)
    prefix = args.smollm2_set + "/"
    chosen = [i for i, name in enumerate(names) if name.startswith(prefix)][: args.num_prompts]
    rows_p, rows_q = [], []
    with torch.inference_mode():
        for seq in chosen:
            length = lengths[seq]
            window = length - 2
            ids, aux, final, _ = make_windows(features, head.capture_layers, target.num_layers,
                                              torch.tensor([seq]), torch.tensor([0]), window, 1)
            keep = mask[int(features.seq_indptr[seq]) + 1: int(features.seq_indptr[seq]) + 1 + window]
            out = head.ttt_forward(ids, aux, 1)[0]
            rows_p.append(target.lm_head(target.norm(final[0, :window][keep])).float())
            rows_q.append(head.target_logits(out[0][keep]).float())
    label = f"{args.smollm2_set} ({ {'heldout': 'held out', 'train': 'head training prompts', 'fresh': 'fresh'}[args.smollm2_features]})"
    return [{"pair": "smollm2-eagle3", "set": label, "target": torch.cat(rows_p),
             "draft": torch.cat(rows_q)}]


def reduced(p: torch.Tensor, q: torch.Tensor, support: int) -> tuple[torch.Tensor, torch.Tensor]:
    """p, q [B, V] on the union of their ``support`` largest tokens (``restrict``), plus one last
    column lumping the rest: float64 [B, W + 1]."""
    ps, qs = restrict(p, q, support)
    lump = lambda rows: torch.cat([rows, (1 - rows.sum(-1, keepdim=True)).clamp_min(0)], -1)
    return lump(ps), lump(qs)


def sampled_accepted(p_row: torch.Tensor, q_row: torch.Tensor, k: int, trees: int, generator) -> dict[str, float]:
    """Mean acceptance of ``rrs`` and ``hsd`` on ``trees`` one-level trees (k children without
    replacement from q_row [V]), the same trees for both."""
    if int((q_row > 0).sum()) < k:
        return {"rrs": float("nan"), "hsd": float("nan")}
    tree = sample_tree(lambda paths: q_row.expand(paths.shape[0], paths.shape[1], -1), k, 1, generator,
                       root_tokens=torch.zeros(trees, dtype=torch.long))
    target = p_row.expand(trees, tree.draft_probs.shape[1], -1).clone()
    out = {}
    for method in ("rrs", "hsd"):
        res = verify_tree(tree.candidates, tree.retrive_next_token, tree.retrive_next_sibling, tree.draft_probs,
                          target, method=method, generator=generator, validate=False)
        out[method] = float(res.num_accepted.double().mean())
    return out


def measure(group: dict, temperature: float, k: int, args, generator) -> dict:
    params = SamplingParams(temperature=temperature)
    p, q = logits_to_probs(group["target"], params), logits_to_probs(group["draft"], params)
    stock, bound, rrs, hsd = [], [], [], []
    for start in range(0, p.shape[0], args.chunk):
        out = node_bound(p[start: start + args.chunk], q[start: start + args.chunk], k, args.support)
        stock += out["stock"].tolist()
        bound += out["bound"].tolist()
    ps, qs = reduced(p, q, args.support)
    for b in range(p.shape[0]):
        acc = sampled_accepted(ps[b], qs[b], k, args.trees, generator)
        rrs.append(acc["rrs"])
        hsd.append(acc["hsd"])
    mean = statistics.fmean
    return {"pair": group["pair"], "set": group["set"], "T": temperature, "k": k, "positions": len(stock),
            "stock": mean(stock), "rrs": mean(rrs), "hsd": mean(hsd), "bound": mean(bound),
            "bound_over_stock": mean(bound) / mean(stock), "hsd_over_stock": mean(hsd) / mean(stock),
            "positions_bound_below_stock": sum(b < s - 1e-9 for b, s in zip(bound, stock)),
            "tail_q": float(qs[:, -1].mean()), "tail_p": float(ps[:, -1].mean())}


def markdown(rows: list[dict]) -> str:
    lines = ["# First-level acceptance: stock top-k vs sampled children, and the bound on every lossless verifier", "",
             "Mean acceptance probability of the first level (k children) over teacher-forced positions. "
             "stock = p(top-k of q), exact; rrs / hsd = sampled children verified by this project, Monte Carlo; "
             "bound = upper bound for any lossless verifier of children drawn without replacement from q. "
             "tail q / p: mass outside the modelled support (lumped into one token for rrs / hsd).", "",
             "| pair | set | T | k | positions | stock | rrs | hsd | bound | hsd / stock | bound / stock | tail q / p |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['pair']} | {r['set']} | {r['T']} | {r['k']} | {r['positions']} | {r['stock']:.4f} | "
                     f"{r['rrs']:.4f} | {r['hsd']:.4f} | {r['bound']:.4f} | {r['hsd_over_stock']:.3f} | "
                     f"{r['bound_over_stock']:.3f} | {r['tail_q']:.4f} / {r['tail_p']:.4f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = benchmark_parser(__doc__)
    add_standard_arguments(parser, name="tree_root_bound", threads=2, seed=0)
    parser.add_argument("--pairs", nargs="+", default=["qwen", "smollm2-eagle3"], choices=["qwen", "smollm2-eagle3"])
    parser.add_argument("--prompt-sets", nargs="+", default=["sharegpt", "humaneval"])
    parser.add_argument("--num-prompts", type=int, default=8, help="prompts per set (sequences of the features for smollm2-eagle3)")
    parser.add_argument("--new-tokens", type=int, default=48, help="continuation length (qwen pair; smollm2-eagle3 with fresh features)")
    parser.add_argument("--smollm2-features", choices=["heldout", "train", "fresh"], default="heldout",
                        help="the EAGLE-3 head's held-out features, its training features, or features "
                             "collected now on the --smollm2-set prompts after its training prompts")
    parser.add_argument("--smollm2-set", default="mtbench", help="prompt set of those features' sequences")
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.7, 1.0])
    parser.add_argument("--topk", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--trees", type=int, default=128, help="sampled trees per position")
    parser.add_argument("--support", type=int, default=128,
                        help="tokens of p and of q modelled one by one (node_bound's support)")
    parser.add_argument("--chunk", type=int, default=32, help="positions per bound computation")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    run = start_run(__file__, argv)
    generator = torch.Generator().manual_seed(args.seed)
    groups = []
    if "qwen" in args.pairs:
        groups += qwen_positions(args)
    if "smollm2-eagle3" in args.pairs:
        groups += smollm2_positions(args)
    rows = []
    for group in groups:
        for temperature in args.temperatures:
            for k in args.topk:
                rows.append(measure(group, temperature, k, args, generator))
                print(rows[-1], flush=True)
    write_results(RESULTS_DIR / args.name, {"rows": rows, "args": vars(args)}, markdown(rows), run)
    print(markdown(rows))


if __name__ == "__main__":
    main()
