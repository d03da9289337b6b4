"""The sampled-tree round of the GPU check (``benchmarks/gpu_check.py``, section ``draft-round``).

Times one whole round of ``sglang_hsd/tree_draft/tiny_round.py`` (the ``LevelDrafter`` with keyed
noise, D - 1 forwards of a tiny random draft head with 64 features, then ``verify_tree`` hsd on
the Triton path) at serving vocabularies, eagerly and as a CUDA-graph replay, for each lossless
child sampler the server offers (``inverse_cdf``, the default; ``argmax_first_cdf``,
``--hsd-tree-draft argmax-first``) and the Gumbel top-k sampler of the first GPU runs, and checks
that the replay's tokens equal the eager round's. The head costs little next to a real draft
model, so the times are what the drafter and the verifier add per round; the gap between eager
and replay is the launch overhead a captured round saves.
"""

from __future__ import annotations

import itertools
import time

import torch

from benchmarks.gpu_timing import median_us

SAMPLERS = ("inverse_cdf", "argmax_first_cdf", "gumbel_topk")
FULL = {"shape": ((4, 2, 8), (5, 4, 8)), "batch": (1, 16, 64), "vocab": (32000, 128256), "sampler": SAMPLERS}
QUICK = {"shape": ((5, 4, 8),), "batch": (1, 64), "vocab": (128256,), "sampler": SAMPLERS[:2]}
RULE, HIDDEN = "spine_wide", 64


def draft_grid(quick: bool) -> list[tuple]:
    sizes = QUICK if quick else FULL
    return list(itertools.product(sizes["sampler"], sizes["shape"], sizes["batch"], sizes["vocab"]))


def plan_lines(quick: bool) -> list[str]:
    return [f"round {RULE} {sampler} (D, k, N)={shape} B={batch} V={vocab}: eager and CUDA-graph replay"
            for sampler, shape, batch, vocab in draft_grid(quick)]


def time_round(sampler: str, shape, batch: int, vocab: int) -> dict:
    """Eager and replay microseconds of one round configuration, and whether replay == eager."""
    from sglang_hsd.tree_draft import DraftPlan, TreeShape
    from sglang_hsd.tree_draft.tiny_round import TinyHead, round_inputs, whole_round

    device = torch.device("cuda")
    run = whole_round(TinyHead(vocab, HIDDEN, device=device), DraftPlan.build(TreeShape(*shape), RULE, device, sampler))
    static = round_inputs(batch, shape, vocab, HIDDEN, seed=0, device=device)
    with torch.no_grad():
        eager_us, _ = median_us(lambda: run(**static), cuda=True)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = run(**static)
        replay_us, _ = median_us(graph.replay, cuda=True)
        fresh = round_inputs(batch, shape, vocab, HIDDEN, seed=1, device=device)
        for name, value in fresh.items():
            static[name].copy_(value)
        graph.replay()
        eager = run(**fresh)
        same = all(torch.equal(a, b) for a, b in zip(eager[0][:3] + eager[1], out[0][:3] + out[1]))
    return {"sampler": sampler, "shape": list(shape), "batch": batch, "vocab": vocab, "eager_us": round(eager_us, 1),
            "replay_us": round(replay_us, 1), "replay_equals_eager": same,
            "status": "ok" if same else "failed: replay differs from eager"}


def run_draft_rounds(quick: bool, deadline: float, log=print) -> list[dict]:
    rows = []
    for sampler, shape, batch, vocab in draft_grid(quick):
        key = {"sampler": sampler, "shape": list(shape), "batch": batch, "vocab": vocab}
        if time.monotonic() > deadline:
            rows.append({**key, "status": "skipped: budget"})
            continue
        try:
            rows.append(time_round(sampler, shape, batch, vocab))
        except Exception as error:  # noqa: BLE001 - recorded per configuration, the grid goes on
            rows.append({**key, "status": f"error: {type(error).__name__}: "
                                          f"{str(error).splitlines()[0] if str(error) else ''}"})
        log(f"  draft round {sampler} {shape} B={batch} V={vocab}: {rows[-1]['status']}")
        torch.cuda.empty_cache()
    return rows


def draft_table(rows: list[dict]) -> list[str]:
    lines = ["| child sampler | (D, k, N) | B | V | eager us | graph replay us | eager / replay | replay = eager "
             "| status |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        eager, replay = row.get("eager_us"), row.get("replay_us")
        ratio = f"{eager / replay:.2f}x" if eager and replay else ""
        lines.append(f"| {row.get('sampler', 'gumbel_topk')} | {tuple(row['shape'])} | {row['batch']} | "
                     f"{row['vocab']} | {eager or ''} | {replay or ''} | {ratio} | {row.get('replay_equals_eager', '')} | {row['status']} |")
    return lines
