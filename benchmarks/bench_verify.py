"""Block efficiency of every chain verifier on the same sampled drafts from real models.

For each prompt, ``--positions`` rounds of speculative decoding run at the benchmark temperature:
the drafter samples a K_max-token draft from its own q, the target scores it in one forward, and
the context advances by what ``hsd`` emits (lossless, so the text is a target sample). Each verifier's *exact* expected accepted length given
that draft (no coin noise, ``expected_accepted_per_length``) is computed for every K <= K_max, so
all methods are compared on identical drafts:

    block efficiency = 1 + E[accepted draft tokens]   (tokens emitted per target call)

Drafters (``drafters.py``): ``exit:L`` (the target's first L layers + a trained exit head,
or the logit lens without one), ``eagle3`` / ``eagle3:<dir>`` (the trained EAGLE-3 head of
``sglang-hsd train-heads``, q scattered from its draft vocabulary to target ids) and
``model:<name>`` (a separate model with the target's tokenizer).

Columns. ``hsd`` is block verification (``docs/verification.md``, "Chains"), which Sun et al. (ICLR 2025, arXiv
2403.10444) prove optimal among lossless verifiers of a chain drawn from the given q: its column
*is* the exact optimum. ``hsd-paper`` (uncapped, lossy) is for reference only. ``bound`` is the
sum over k <= K of 1 - TV between the k-token draft and target laws (``bench_report.py``): what a
verifier could reach if it only had to keep each prefix length's law right separately; the gap
hsd -> bound is the price of being lossless for every k at once. MT-Bench prompts are taken per
category (``mtbench/<category>`` rows) and pooled (``mtbench`` rows).

    PYTHONPATH=. python benchmarks/bench_verify.py --model smollm2-135m --drafters exit:16 eagle3 \\
        --prompt-sets mtbench humaneval sharegpt alpacaeval --temperatures 0.6 1.0
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from benchmarks.bench_report import (coupling_bound_per_length, format_verify_summary, format_verify_table,
                                     plot_verify, summarize_draft_values)
from benchmarks.common import (RESULTS_DIR, RunRecord, add_standard_arguments, benchmark_parser, start_run,
                               write_results)
from benchmarks.drafters import CachedLM, Eagle3Drafter, ExitDrafter, ModelDrafter, load_draft_model, load_eagle3_head
from sglang_hsd.assets.chat import encode_prompts
from sglang_hsd.runtime.loading import load_exit_heads_option, load_model
from sglang_hsd.sampling import SamplingParams, logits_to_probs
from sglang_hsd.verify import verify_chain
from sglang_hsd.verify.chain import expected_accepted_per_length

METHODS = ("tokenwise", "hsd", "hsd-paper")


def build_drafter(spec: str, target, exit_heads: dict):
    """``spec`` -> (drafter, scorer ``CachedLM`` of the target, label, provenance dict)."""
    kind, _, arg = spec.partition(":")
    if kind == "exit":
        if not arg.isdigit():
            raise ValueError(f"--drafters {spec!r}: expected exit:<layer>")
        layer = int(arg)
        head = exit_heads.get(layer)
        label = f"exit:{layer} " + ("trained" if head is not None else "logit lens")
        drafter = ExitDrafter(target.hf, layer, head)
        return drafter, drafter.lm, label, {}
    if kind == "eagle3":
        try:
            head, folder = load_eagle3_head(target, arg)
        except ValueError as err:
            raise ValueError(f"--drafters {spec!r}: {err}") from None
        scorer = CachedLM(target.hf, hidden_layers=tuple(head.capture_layers), keep_logits=True)
        return Eagle3Drafter(head, scorer), scorer, "eagle3", {"eagle3": _provenance(folder, "training.json")}
    if kind == "model" and arg:
        drafter = load_draft_model(target, arg)
        return ModelDrafter(drafter.hf), CachedLM(target.hf), f"model:{arg}", {}
    raise ValueError(f"--drafters {spec!r}: expected exit:<layer>, eagle3[:<dir>] or model:<name>")


def _provenance(folder: Path, name: str) -> dict:
    path = folder / name
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(path.stat().st_mtime)) if path.is_file() else None
    return {"folder": str(folder), "file": name, "mtime": stamp}


def prompt_groups(target, prompt_sets, num_prompts, per_category, max_prompt_tokens) -> dict[str, list[list[int]]]:
    """Group name -> encoded prompts (first prompts of each set, or of each MT-Bench category,
    whose templated length is at most ``max_prompt_tokens``)."""
    from sglang_hsd.assets.prompts import load_prompts

    groups: dict[str, list[list[int]]] = {}
    for prompt_set in prompt_sets:
        split = prompt_set == "mtbench" and per_category > 0
        wanted = per_category if split else num_prompts
        for record in load_prompts(prompt_set):
            ids = encode_prompts(target.tokenizer, [record.user_text])[0]
            name = f"mtbench/{record.category}" if split else prompt_set
            if len(ids) <= max_prompt_tokens and len(groups.setdefault(name, [])) < wanted:
                groups[name].append(ids)
            if not split and len(groups.get(name, [])) >= wanted:
                break
    return groups


@torch.inference_mode()
def walk_prompt(drafter, scorer: CachedLM, prompt, params, num_draft, positions, eos, seed):
    """Draft and score ``positions`` consecutive rounds of speculative decoding on ``prompt``.

    Each round the context advances by the tokens ``hsd`` emits for the draft (accepted prefix
    plus one corrected or bonus token): a lossless rule, so the context is a sample of the target
    at this temperature, at no extra target forward.

    Returns per-draft expected accepted tokens: name -> float64 [n, K] (n <= positions: the walk
    stops at EOS).
    """
    gen = torch.Generator().manual_seed(seed)
    context = list(prompt)
    values: dict[str, list[torch.Tensor]] = {m: [] for m in (*METHODS, "bound")}
    for _ in range(positions):
        tokens, q = drafter.propose(context, num_draft, params, gen)
        logits, _ = scorer.feed(context + tokens.tolist(), len(context) - 1)
        p = logits_to_probs(logits.unsqueeze(0), params)[0]  # [K + 1, V]
        for method in METHODS:
            values[method].append(expected_accepted_per_length(tokens[None], q[None], p[None], method)[0])
        values["bound"].append(coupling_bound_per_length(tokens[None], q[None], p[None])[0])
        result = verify_chain(tokens[None], q[None], p[None], "hsd", generator=gen)
        emitted = result.tokens[0, : int(result.num_accepted[0]) + 1].tolist()
        context += emitted
        if eos in emitted:
            break
    return {m: torch.stack(v) for m, v in values.items()}


def parse_args(argv: list[str] | None = None):
    parser = benchmark_parser(__doc__)
    add_standard_arguments(parser, model="smollm2-135m")
    parser.add_argument("--drafters", nargs="+", default=["exit:16", "eagle3"],
                        help="exit:<layer>, eagle3[:<dir>] or model:<name> (same tokenizer as --model)")
    parser.add_argument("--prompt-sets", nargs="+", default=["mtbench", "humaneval", "sharegpt", "alpacaeval"])
    parser.add_argument("--num-prompts", type=int, default=2, help="prompts per set (not MT-Bench, see --per-category)")
    parser.add_argument("--per-category", type=int, default=1,
                        help="MT-Bench prompts per category (8 categories); 0 = take --num-prompts, unsplit")
    parser.add_argument("--max-prompt-tokens", type=int, default=384, help="skip longer (templated) prompts")
    parser.add_argument("--positions", type=int, default=8,
                        help="drafts per prompt and temperature (consecutive decoding rounds)")
    parser.add_argument("--max-draft", type=int, default=8, help="K_max; tables show K = 2..K_max")
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.6, 1.0])
    add_standard_arguments(parser, exit_heads=True, seed=0, threads=1, name="verify")
    args = parser.parse_args(argv)
    if any(t <= 0 for t in args.temperatures):
        parser.error("--temperatures must be > 0: a greedy draft makes every lossless verifier equal")
    if args.max_draft < 2 or args.positions < 1:
        parser.error("--max-draft must be >= 2 and --positions >= 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    run = start_run(__file__, argv)
    torch.set_num_threads(args.threads)

    target = load_model(args.model)
    exit_heads = load_exit_heads_option(target, args.exit_heads)
    groups = prompt_groups(target, args.prompt_sets, args.num_prompts, args.per_category, args.max_prompt_tokens)
    eos = target.tokenizer.eos_token_id
    provenance = {}
    if exit_heads:
        from sglang_hsd.assets.heads import heads_dir

        folder = Path(args.exit_heads) if args.exit_heads != "auto" else heads_dir(target.path.name) / "exit"
        provenance["exit"] = _provenance(folder, "manifest.json")
    rows = []
    started = time.perf_counter()
    for spec in args.drafters:
        drafter, scorer, label, extra = build_drafter(spec, target, exit_heads)
        provenance.update(extra)
        for temperature in args.temperatures:
            last = (spec, temperature) == (args.drafters[-1], args.temperatures[-1])

            def save(new_rows, final=False):
                # Written after every prompt group, so a stopped run keeps what it measured.
                meta = {"model": args.model, "drafters": args.drafters,
                        "groups": {g: len(p) for g, p in groups.items()}, "positions": args.positions,
                        "max_draft": args.max_draft, "seed": args.seed, "max_prompt_tokens": args.max_prompt_tokens,
                        "heads": provenance, "threads": args.threads, "seconds": round(time.perf_counter() - started, 1)}
                _write(args.name, meta, rows + new_rows, run, final=final)

            rows += measure(drafter, scorer, label, groups, SamplingParams(temperature=temperature), args, eos,
                            started, save)
            save([], final=last)


def measure(drafter, scorer, label, groups, params, args, eos, started, save) -> list[dict]:
    """Walk every prompt of every group at one temperature; one table row per group and K.
    ``save(rows)`` is called with the rows so far after each group."""
    per_group = {}
    for name, prompts in groups.items():
        walks = [walk_prompt(drafter, scorer, prompt, params, args.max_draft, args.positions, eos,
                             seed=args.seed + 1000 * i)
                 for i, prompt in enumerate(prompts)]
        per_group[name] = {m: torch.cat([w[m] for w in walks]) for m in walks[0]}
        _log(label, name, params.temperature, per_group[name], started)
        save(_group_rows(label, per_group, params.temperature, args.max_draft))
    return _group_rows(label, per_group, params.temperature, args.max_draft)


def _group_rows(label, per_group, temperature, max_draft) -> list[dict]:
    """Rows of every group measured so far, plus the pooled MT-Bench row over its categories."""
    groups = dict(per_group)
    pooled = [v for name, v in groups.items() if name.startswith("mtbench/")]
    if pooled:
        groups["mtbench"] = {m: torch.cat([v[m] for v in pooled]) for m in pooled[0]}
    rows = []
    for name in sorted(groups, key=lambda g: (g.split("/")[0], "/" in g, g)):
        rows += _rows(label, name, temperature, groups[name], max_draft)
    return rows


def _rows(label, group, temperature, values, max_draft) -> list[dict]:
    summary = summarize_draft_values(values)
    out = []
    for k in range(2, max_draft + 1):
        row = {"drafter": label, "prompt_set": group, "temperature": temperature, "K": k,
               "drafts": int(values["hsd"].shape[0])}
        row.update({key: vals[k - 1] for key, vals in summary.items()})
        out.append(row)
    return out


def _log(label, group, temperature, values, started) -> None:
    means = {m: 1 + float(v[:, -1].mean()) for m, v in values.items()}
    print(f"[{time.perf_counter() - started:6.0f}s] {label} {group} T={temperature} ({values['hsd'].shape[0]} drafts): "
          f"K_max block efficiency " + ", ".join(f"{m} {v:.3f}" for m, v in means.items()), flush=True)


def _write(name: str, meta: dict, rows: list[dict], run: RunRecord, final: bool) -> None:
    heads = "; ".join(f"{k} heads {v['folder']} ({v['file']} {v['mtime']})" for k, v in meta["heads"].items())
    header = (f"Block efficiency (tokens per target call, exact expectation per sampled draft), target "
              f"{meta['model']}; prompts per group {meta['groups']}; {meta['positions']} drafts per prompt "
              f"(consecutive hsd decoding rounds); {heads or 'no trained heads'}; {meta['seconds']} s")
    summary = format_verify_summary(rows)
    write_results(RESULTS_DIR / name, {"meta": meta, "rows": rows},
                  header + "\n\n" + summary + "\n" + format_verify_table(rows, "All rows:"), run)
    if not final:
        return
    print(header + "\n\n" + summary)
    try:
        print("plot:", plot_verify(rows, RESULTS_DIR / f"{name}.png", run=run.as_dict()))
    except ImportError as err:
        print(f"no plot ({err})")


if __name__ == "__main__":
    main()
