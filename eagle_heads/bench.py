"""Held-out acceptance per draft position and end-to-end speed of trained heads, in one run.

    python -m eagle_heads.bench --model smollm2-135m [--heads-dir DIR] [--num-prompts 4] \
        [--max-new-tokens 48] [--snapshots] --out bench.json

Reads the heads ``sglang-hsd train-heads`` wrote (``DIR/exit``, ``DIR/eagle3``; default
``<cache>/heads/<model>``) and the held-out features cached there (MT-Bench prompts + target
continuations, never trained on), then reports

1. teacher forced, on the held-out *continuation* positions: 1 - TV (= expected acceptance at
   T=1) and top-1 agreement (= greedy acceptance) per draft position 1..4, for the EAGLE-3 head
   (TTT steps: its own hidden states fed back) and for every exit layer, trained and logit lens
   (an exit drafter re-runs the target's first L layers on its drafts, so under teacher forcing
   its distribution does not depend on the draft position: one number per layer);
2. generation on held-out MT-Bench prompts, greedy and T=1: for 2-level ``drafter,target``
   configurations with 4 drafts per round, the accepted fraction at each draft position
   (rounds in which draft k was accepted / rounds that drafted k; ``record_accepted_lengths``);
   for every configuration, autoregressive included, tokens/s and tokens per target round;
3. with ``--snapshots``: greedy generation acceptance of the training snapshots
   (``eagle3/snapshots/<m>min``, ``exit/snapshots/<m>min``), acceptance vs training budget.

The machine's load average is stored with each run: tokens/s on a shared CPU are noisy, so
compare configurations only within one run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from pathlib import Path

import torch

DRAFTS = 4  # drafts per round of the 2-level configurations (and draft positions reported)


@contextlib.contextmanager
def record_accepted_lengths():
    """Record every chain verification of the runtime engine while active.

    Yields a list that receives one ``(draft_lengths int64 [R], num_accepted int64 [R])`` pair per
    ``verify_chain`` call. Meaningful per level only for 2-level configurations (one verifier).
    """
    # The engine verifies its chains through runtime/lookup_rounds.py (``_chain``).
    from sglang_hsd.runtime import lookup_rounds as caller

    if not callable(getattr(caller, "verify_chain", None)):
        raise RuntimeError("sglang_hsd.runtime.lookup_rounds no longer calls verify_chain by name: "
                           "update record_accepted_lengths")
    original, calls = caller.verify_chain, []

    def recording(draft, *args, **kwargs):
        result = original(draft, *args, **kwargs)
        lengths = kwargs.get("draft_lengths")
        lengths = lengths if lengths is not None else torch.full((draft.shape[0],), draft.shape[1])
        calls.append((lengths.clone(), result.num_accepted.clone()))
        return result

    caller.verify_chain = recording
    try:
        yield calls
    finally:
        caller.verify_chain = original


def per_position_acceptance(calls, positions: int = DRAFTS) -> tuple[list, list]:
    """Acceptance at draft positions k = 1..``positions`` from ``record_accepted_lengths`` calls.

    Returns two lists (None where no round qualifies): the accepted fraction (rounds whose draft
    k was accepted / rounds that drafted at least k tokens) and the conditional one (/ rounds
    that drafted k and accepted drafts 1..k-1), which teacher-forced top-1 and 1 - TV estimate.
    """
    if not calls:
        return [None] * positions, [None] * positions
    lengths = torch.cat([c[0] for c in calls])
    accepted = torch.cat([c[1] for c in calls])
    fraction, conditional = [], []
    for k in range(1, positions + 1):
        for out, rows in ((fraction, lengths >= k), (conditional, (lengths >= k) & (accepted >= k - 1))):
            out.append(round(float((accepted[rows] >= k).float().mean()), 3) if bool(rows.any()) else None)
    return fraction, conditional


def _configs(layers: list[int], eagle_dir: str | None) -> list[tuple[str, str, list[int], bool]]:
    """(label, level spec, buffers, use trained exit heads)."""
    configs = [("autoregressive", "target", [], False)]
    for layer in layers:
        configs += [(f"exit:{layer} lens", f"exit:{layer},target", [DRAFTS], False),
                    (f"exit:{layer} trained", f"exit:{layer},target", [DRAFTS], True)]
    if eagle_dir:
        configs.append(("eagle3", f"eagle3:{eagle_dir},target", [DRAFTS], False))
        for layer in layers[-1:]:
            configs.append((f"eagle3,exit:{layer} trained", f"eagle3:{eagle_dir},exit:{layer},target", [3, DRAFTS], True))
    return configs


def generate_once(target, tok, prompts, spec, buffers, temperature, max_new_tokens, exit_heads=None, head=None) -> dict:
    """One generation of ``prompts`` (one batch) with the levels ``spec``; a result row."""
    from sglang_hsd.runtime.config import parse_levels
    from sglang_hsd.runtime.engine import SpeculativeGenerator
    from sglang_hsd.sampling import SamplingParams

    gen = SpeculativeGenerator(target, parse_levels(spec, buffers=buffers or None), exit_heads=exit_heads, eagle3_head=head)
    load = os.getloadavg()[0]
    with record_accepted_lengths() as calls:
        result = gen.generate(prompts, SamplingParams(temperature=temperature), max_new_tokens, tok.eos_token_id, seed=0)
    top = result.levels[-1]
    row = {"temperature": temperature, "tokens": result.num_generated, "seconds": round(result.seconds, 1),
           "tokens_per_s": round(result.tokens_per_second, 2),
           "tokens_per_target_round": round(result.num_generated / top.rounds, 3) if top.rounds else 1.0,
           "levels": [{"name": "eagle3" if l.name.startswith("eagle3") else l.name, "acceptance": round(l.acceptance_rate, 3),
                       "accepted_per_round": round(l.mean_accepted, 3)} for l in result.levels[1:]],
           "load_avg": round(load, 1)}
    if len(result.levels) == 2 and result.levels[1].proposed:
        row["accepted_at_position"], row["accepted_at_position_given_previous"] = per_position_acceptance(calls)
    return row


def teacher_forced(target, heldout, exit_heads, head) -> dict:
    """Section 1 of the module doc, on held-out continuation positions (T=1 for 1 - TV)."""
    from eagle_heads.eagle3_train import evaluate_eagle3
    from eagle_heads.exit_heads import evaluate_exit_heads

    cont = heldout.continuation_mask()
    out = {"exit": evaluate_exit_heads(target, heldout, exit_heads, mask=cont)}
    if head is not None:
        out["eagle3"] = evaluate_eagle3(head, target, heldout, steps=DRAFTS, mask=cont)
    return out


def run(model: str, heads_dir: str | None, num_prompts: int, max_new_tokens: int, temperatures: list[float], snapshots: bool, out_json: str | None, heldout_path: str | None = None, only: list[str] | None = None, teacher_forcing: bool = True) -> dict:
    from eagle_heads import pipeline
    from eagle_heads.data import FeatureSet, encode_prompt_sets
    from sglang_hsd.assets import heads as heads_cache
    from sglang_hsd.runtime.exit_heads import load_exit_heads, read_manifest
    from sglang_hsd.runtime.eagle3 import Eagle3Head

    torch.set_num_threads(1)
    root = Path(heads_dir) if heads_dir else heads_cache.heads_dir(model)
    target, tok = pipeline.load_target(model)
    exit_heads = load_exit_heads(str(root / "exit"), target)
    layers = sorted(exit_heads)
    eagle_dir = root / "eagle3"
    head = Eagle3Head.from_pretrained(str(eagle_dir), target) if (eagle_dir / "model.safetensors").exists() else None
    heldout_files = [Path(heldout_path)] if heldout_path else sorted(root.glob("features-heldout-*.pt"))
    if not heldout_files:
        raise FileNotFoundError(f"no held-out features in {root}: run `sglang-hsd train-heads --out {root}` first")
    heldout = FeatureSet.load(str(heldout_files[-1]))
    report: dict = {"model": model, "heads_dir": str(root), "heldout_features": heldout_files[-1].name,
                    "exit_manifest": {k: v for k, v in read_manifest(str(root / "exit")).items() if k not in ("training_log", "budget_curve")}}
    if teacher_forcing:
        report["teacher_forced_continuation"] = teacher_forced(target, heldout, exit_heads, head)
        print(json.dumps(report["teacher_forced_continuation"]), flush=True)
    prompts, names = encode_prompt_sets(tok, ["mtbench"], num_prompts, 256)
    report["prompts"] = names
    runs = []
    for temperature in temperatures:
        for label, spec, buffers, trained in _configs(layers, str(eagle_dir) if head is not None else None):
            if only and label not in only:
                continue
            row = {"config": label} | generate_once(target, tok, prompts, spec, buffers, temperature, max_new_tokens,
                                                    exit_heads if trained else None, head if "eagle3" in spec else None)
            runs.append(row)
            print(json.dumps(row), flush=True)
    report["generation"] = runs
    if snapshots:
        report["snapshots"] = snapshot_acceptance(target, tok, root, prompts, max_new_tokens, layers[-1])
    if out_json:
        with open(out_json, "w") as f:
            json.dump(report, f, indent=2)
    return report


def snapshot_acceptance(target, tok, root: Path, prompts, max_new_tokens: int, layer: int) -> list[dict]:
    """Section 3 of the module doc: greedy 2-level acceptance of each training snapshot."""
    from sglang_hsd.runtime.exit_heads import load_exit_heads
    from sglang_hsd.runtime.eagle3 import Eagle3Head

    rows = []
    for kind in ("eagle3", "exit"):
        dirs = sorted((root / kind / "snapshots").glob("*min"), key=lambda p: float(p.name[:-3])) + [root / kind]
        for directory in dirs:
            minutes = float(directory.name[:-3]) if directory.name.endswith("min") else "final"
            if kind == "eagle3":
                if not (directory / "model.safetensors").exists():
                    continue
                head = Eagle3Head.from_pretrained(str(directory), target)
                row = generate_once(target, tok, prompts, f"eagle3:{directory},target", [DRAFTS], 0.0, max_new_tokens, head=head)
            else:
                heads = load_exit_heads(str(directory), target, [layer])
                row = generate_once(target, tok, prompts, f"exit:{layer},target", [DRAFTS], 0.0, max_new_tokens, exit_heads=heads)
            row = {"drafter": kind if kind == "eagle3" else f"exit:{layer}", "train_minutes": minutes} | row
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--heads-dir", default=None, help="folder with exit/, eagle3/ and held-out features (default <cache>/heads/<model>)")
    parser.add_argument("--num-prompts", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--temperatures", type=float, nargs="*", default=[0.0, 1.0], help="generation temperatures (none: teacher-forced metrics and --snapshots only)")
    parser.add_argument("--heldout", default=None, help="held-out features file (default the newest features-heldout-*.pt in the heads folder)")
    parser.add_argument("--configs", nargs="*", default=None, help="run only these configuration labels (e.g. autoregressive 'exit:16 trained' eagle3)")
    parser.add_argument("--no-teacher-forced", action="store_true", help="skip section 1 (train-heads already stores it in the heads' manifests)")
    parser.add_argument("--snapshots", action="store_true", help="also measure greedy acceptance of the training snapshots")
    parser.add_argument("--out", default=None, help="write the report as JSON here")
    args = parser.parse_args(argv)
    if args.num_prompts < 1 or args.max_new_tokens < 1:
        parser.error("--num-prompts and --max-new-tokens must be >= 1")
    start = time.perf_counter()
    run(args.model, args.heads_dir, args.num_prompts, args.max_new_tokens, args.temperatures, args.snapshots, args.out, args.heldout, args.configs, not args.no_teacher_forced)
    print(f"({time.perf_counter() - start:.0f}s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
