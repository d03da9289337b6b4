"""End-to-end tokens/s and accepted lengths, every configuration measured in the same run.

    PYTHONPATH=. python benchmarks/bench_e2e.py --model smollm2-135m \\
        --configs "target" "exit:8,target" "exit:8,exit:16,target" --buffers "" "4" "3,4"

``--draft-length`` gives each configuration a drafter length rule (``fixed``, the default, or
``adaptive[:threshold[:max]]``, as ``sglang-hsd generate``), and ``--tree`` a draft shape
(``none``, the default: chains; ``D:k:N``: a sampled tree per round), so one run can compare fixed,
adaptive and tree drafts of the same levels. ``--drafter-precision`` gives a separate draft
model's single-row projections a weight copy (``fp32``, the default, ``bf16`` or ``fp16``).

Configurations are ``--levels`` strings of ``sglang-hsd generate`` (``target`` = autoregressive),
plus the Hugging Face peers: ``hf`` (plain ``generate``), ``hf-assisted`` (``generate`` with
``assistant_model``, needs ``--assistant``) and ``hf-prompt-lookup``; ``lookup:3,target`` is the
runtime's own prompt lookup and ``lookup:3,model:<drafter>,target`` puts it below a draft model. Each configuration runs on
the same prompts, for each temperature and batch size, ``--repeats`` times, the repeats
interleaved (repeat r of every row before repeat r + 1 of any, so the machine's drift over a long
run spreads over all rows); the table reports the median and ratios against the autoregressive
runtime and against HF assisted generation of the same run. Before each timed run a row generates
a few tokens untimed (first-call costs such as page faults on fresh weight copies stay out of it).
Timings on a shared 2-core machine are noisy: compare ratios, not absolute numbers.

Batch sizes > 1 run the runtime on consecutive groups of prompts (the HF peers stay at batch 1:
assisted generation supports no batches). At T = 0 every output is checked against the same
configuration at B = 1 and against the autoregressive runtime (last table column; a speculative
runtime must reproduce greedy decoding token for token at every batch size).

Writes ``benchmarks/results/<name>.json`` and ``.md`` (rewritten after every timed run, so a run
cut short keeps what it measured; ``--resume`` continues it: the repeats it holds are kept, the
missing ones timed, on the same CPU and torch only, and the result lists every run that
contributed), and with matplotlib (the ``bench`` extra)
``<name>_speedup.png`` and ``<name>_accepted.png`` (``bench_report.py``).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass, fields

import torch

from benchmarks.bench_report import BENCH_EXTRA_HINT, add_ratios, check_batch_outputs, format_e2e_table, plot_e2e
from benchmarks.common import (RESULTS_DIR, add_standard_arguments, benchmark_parser, encoded_prompts, start_run,
                               write_results)
from sglang_hsd.draft_length import parse_draft_length
from sglang_hsd.tree_draft import TreeShape
from sglang_hsd.runtime.kernel_paths import single_row_split
from sglang_hsd.runtime.kernel_setup import parse_drafter_precision
from sglang_hsd.runtime.loading import build_generator, load_model
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
    if "drafts" in a:
        out["drafts"] = a["drafts"] + b.get("drafts", 0)
        out["mean_draft_length"] = out["proposed"] / out["drafts"] if out["drafts"] else float("nan")
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


def parse_args(argv: list[str] | None = None):
    parser = benchmark_parser(__doc__)
    add_standard_arguments(parser, model="smollm2-135m")
    parser.add_argument("--assistant", help="model for hf-assisted (same tokenizer), e.g. qwen2.5-coder-0.5b")
    parser.add_argument("--configs", nargs="+", default=["target", "exit:8,target", "exit:8,exit:16,target"])
    parser.add_argument("--buffers", nargs="+", help="one per config: comma list or '' (default 4 per level)")
    parser.add_argument("--methods", nargs="+", help="one per config: verify method(s), default hsd")
    parser.add_argument("--draft-length", nargs="+", help="one per config: fixed (default) or "
                        "adaptive[:threshold[:max]] (see sglang-hsd generate --draft-length)")
    parser.add_argument("--tree", nargs="+", help="one per config: none (default, chains) or D:k:N "
                        "(see sglang-hsd generate --tree)")
    parser.add_argument("--drafter-precision", nargs="+", help="one per config: fp32 (default), bf16, fp16, int8 or int4, "
                        "the weight copy a separate drafter's single-row projections read")
    add_standard_arguments(parser, exit_heads=True)
    parser.add_argument("--prompt-set", default="mtbench")
    parser.add_argument("--num-prompts", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--pack-linears", action="store_true",
                        help="run the target's (and a separate drafter's) projections and LM head on oneDNN "
                        "pre-packed weights (CausalLM.pack_linears, as make demo does) in every runtime "
                        "configuration, plain decoding included; the HF peers keep their own kernels")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in benchmarks/results/<name>.json (same arguments, CPU and "
                        "torch): rows keep the repeats measured there and only the missing ones are timed")
    add_standard_arguments(parser, threads=1, name="e2e")
    args = parser.parse_args(argv)
    for option in ("buffers", "methods", "draft_length", "tree", "drafter_precision"):
        values = getattr(args, option)
        if values is not None and len(values) != len(args.configs):
            raise ValueError(f"--{option.replace('_', '-')} needs one value per --configs entry "
                             f"({len(args.configs)}), got {values}")
    for text in args.draft_length or []:
        parse_draft_length(text)  # bad input fails before any model is loaded
    for text in args.tree or []:
        TreeShape.parse(text)
    for text in args.drafter_precision or []:
        parse_drafter_precision(text)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    run = start_run(__file__, argv)
    torch.set_num_threads(args.threads)
    meta = {"model": args.model, "assistant": args.assistant, "prompt_set": args.prompt_set,
            "num_prompts": args.num_prompts, "max_new_tokens": args.max_new_tokens, "threads": args.threads,
            "exit_heads": args.exit_heads, "pack_linears": args.pack_linears}
    # A resume that cannot continue this run fails before any model is loaded.
    earlier_runs, done = (load_earlier(RESULTS_DIR / f"{args.name}.json", meta, run,
                                       row_specs(args, args.assistant is not None))
                          if args.resume else ([], {}))

    target = load_model(args.model)
    if args.pack_linears and not target.model.pack_linears(single_row_split(target.model)):
        raise SystemExit("--pack-linears: this model / torch build cannot run oneDNN packed linears "
                         "(float32 on CPU with mkldnn needed)")
    assistant = load_model(args.assistant) if args.assistant else None
    prompts = encoded_prompts(target.tokenizer, args.prompt_set, args.num_prompts)

    def write(rows: list[dict]) -> str:
        """Ratios, output checks, then the result files of the rows so far (rewritten after each row)."""
        add_ratios(rows)
        check_batch_outputs(rows)
        table = format_e2e_table(rows, meta) + earlier_runs_markdown(earlier_runs)
        write_results(RESULTS_DIR / args.name, {"meta": meta, "rows": rows, "earlier_runs": earlier_runs}, table, run)
        return table

    rows = measure_all(args, target, assistant, prompts, on_row=write, done=done)
    table = write(rows)
    print(table)
    try:
        for path in plot_e2e(rows, RESULTS_DIR / args.name, run=run.as_dict()):
            print("plot:", path)
    except ImportError:
        print(f"no plots: {BENCH_EXTRA_HINT}")
    bad = [r for r in rows if r.get("matches_b1") is False or r.get("matches_ar") is False]
    for r in bad:
        print(f"WARNING: T=0 B={r['batch_size']} {r['config']} [{r['method']}] differs from B=1 / autoregressive "
              f"output (prompts {r['mismatched_prompts']})")


# Tokens of the untimed warm-up generation before each timed run of a row.
WARMUP_TOKENS = 8


def _shared(assistant, config: str):
    """The HF peer's assistant when ``config``'s ``model`` level is that model (one copy in memory;
    the runtime's kernel choices wrap our layers, never the HF modules), else None (loaded anew)."""
    names = [name.strip() for name in config.split(",")]
    return assistant if assistant is not None and f"model:{assistant.name}" in names else None


@dataclass(frozen=True)
class RowSpec:
    """One row of the table: a configuration with its knobs at one temperature and batch size."""

    temperature: float
    batch_size: int
    config: str
    method: str
    buffers: str
    draft_length: str
    tree: str
    drafter_precision: str


def row_specs(args, has_assistant: bool) -> list[RowSpec]:
    """The rows ``args`` ask for, in table order (the HF peers at batch size 1 only, HF assisted
    only with ``--assistant``)."""
    n = len(args.configs)
    per_config = list(zip(args.configs, args.methods or ["hsd"] * n, args.buffers or [""] * n,
                          args.draft_length or ["fixed"] * n, args.tree or ["none"] * n,
                          args.drafter_precision or ["fp32"] * n))
    return [RowSpec(temperature, batch_size, *knobs)
            for temperature in args.temperatures for batch_size in args.batch_sizes for knobs in per_config
            if knobs[0] not in HF_CONFIGS or (batch_size == 1 and (knobs[0] != "hf-assisted" or has_assistant))]


def load_earlier(path, meta: dict, run, specs: list[RowSpec]) -> tuple[list[dict], dict[RowSpec, dict]]:
    """What ``--resume`` continues: the runs recorded in the result file ``path`` (its ``"run"``
    and its own ``"earlier_runs"``, oldest first) and its rows by :class:`RowSpec`.

    Refuses (SystemExit naming the difference) a missing file, other ``meta`` (model, prompts,
    tokens, threads, ...), another CPU or torch version than ``run``'s (repeats timed on another
    machine would enter the same medians), and earlier rows missing from ``specs`` (a resumed run
    never drops measured rows; ``specs`` may add rows). The commit may differ (each run records
    its own).
    """
    try:
        earlier = json.loads(path.read_text())
    except FileNotFoundError:
        raise SystemExit(f"--resume: no earlier result {path} (run without --resume first)") from None
    if earlier.get("meta") != meta:
        raise SystemExit(f"--resume: {path} was measured with {earlier.get('meta')}, this run asks for {meta}")
    for field in ("cpu", "torch_version"):
        if earlier["run"].get(field) != getattr(run, field):
            raise SystemExit(f"--resume: {path} ran on {field} {earlier['run'].get(field)!r}, this machine has "
                             f"{getattr(run, field)!r}; start a new --name instead")
    names = [f.name for f in fields(RowSpec)]
    done = {RowSpec(**{name: row[name] for name in names}): row for row in earlier["rows"]}
    dropped = [spec for spec in done if spec not in specs]
    if dropped:
        raise SystemExit(f"--resume: the earlier run measured rows this command does not ask for: {dropped}; "
                         "give the same --configs and knobs (new rows may be added)")
    return [*earlier.get("earlier_runs", []), earlier["run"]], done


def earlier_runs_markdown(runs: list[dict]) -> str:
    """The Markdown lines naming the earlier runs a resumed result continues ('' when none)."""
    if not runs:
        return ""
    lines = ["", "Continues earlier runs (their repeats are in the medians):", ""]
    lines += [f"- commit `{r['commit']}`, {r['started']} to {r['finished']}, load {r['load_average_start']} at start, "
              f"{r['load_average_end']} at end: `{r['command']}`" for r in runs]
    return "\n".join(lines) + "\n"


def measure_all(args, target, assistant, prompts, on_row=None, done=None) -> list[dict]:
    """Every row of ``args`` (:func:`row_specs`), timed :func:`interleaved` (``done``: rows an
    earlier run measured, see :func:`load_earlier`)."""
    eos = target.tokenizer.eos_token_id

    def make_runner(spec: RowSpec):
        params = SamplingParams(temperature=spec.temperature)
        if spec.config in HF_CONFIGS:
            return lambda seed, batch, new: run_hf(spec.config, target, assistant, batch, params, new, eos, seed)
        buffers = [int(x) for x in spec.buffers.split(",")] if spec.buffers else None
        gen = build_generator(target, spec.config, buffers, spec.method.split(","), args.exit_heads,
                              draft_length=parse_draft_length(spec.draft_length), tree=TreeShape.parse(spec.tree),
                              drafter_precision=spec.drafter_precision, pack_linears=args.pack_linears,
                              drafter=_shared(assistant, spec.config))
        return lambda seed, batch, new: run_runtime(gen, batch, params, new, eos, seed, spec.batch_size)

    return interleaved(row_specs(args, assistant is not None), args.repeats, make_runner, prompts,
                       args.max_new_tokens, on_row, done)


def interleaved(specs: list[RowSpec], repeats: int, make_runner, prompts: list[list[int]], max_new_tokens: int,
                on_row=None, done: dict[RowSpec, dict] | None = None) -> list[dict]:
    """Time every row ``repeats`` times, repeat r of every row before repeat r + 1 of any.

    Why interleaved: a run of the whole matrix takes hours on this machine, and its speed drifts
    (other jobs, the host); back-to-back repeats would put a slow stretch on a few rows and bias
    their ratios, interleaved ones spread it over all rows. The cost: each row's runner is built
    anew per repeat (``make_runner(spec)`` -> ``runner(seed, prompts, max_new) -> (tokens,
    seconds, level stats)``; packing is kept on the shared models, so this is a weight copy at
    most) and warmed up with ``WARMUP_TOKENS`` untimed tokens each time (first-call costs such as
    page faults on fresh copies stay out of the row). Repeat r samples with seed r.

    Returns one row dict per spec: the median tokens/s and seconds over the repeats
    (``tokens_per_second_per_repeat`` and ``seconds_per_repeat`` list them), and the last repeat's
    token count, outputs and level statistics.
    ``on_row(rows)``: called after every timed run with the rows so far, each over the repeats it
    has done (``repeats`` in the row), so a run cut short keeps what it measured.
    ``done``: rows of an earlier run (:func:`load_earlier`), by spec; a row's first repeats are
    taken from it (times, rates, and its outputs and statistics until a new repeat replaces them)
    and only the later ones are timed; specs not in ``done`` are timed from repeat 0.
    """
    done = done or {}
    times = [list(done[spec]["seconds_per_repeat"]) if spec in done else [] for spec in specs]
    rates = [list(done[spec]["tokens_per_second_per_repeat"]) if spec in done else [] for spec in specs]
    rows: list[dict | None] = [done.get(spec) for spec in specs]
    for repeat in range(repeats):
        for i, spec in enumerate(specs):
            if len(times[i]) > repeat:
                continue  # measured by the earlier run
            runner = None  # the previous row's generator is freed before the next one is built
            runner = make_runner(spec)
            runner(0, prompts[: spec.batch_size], WARMUP_TOKENS)
            tokens, seconds, levels = runner(repeat, prompts, max_new_tokens)
            n_tokens = sum(map(len, tokens))  # differs between repeats when sampling meets EOS
            times[i].append(seconds)
            rates[i].append(n_tokens / seconds)
            print(f"T={spec.temperature} B={spec.batch_size} {spec.config} [{spec.method}] run {repeat}: "
                  f"{rates[i][-1]:.2f} tok/s", flush=True)
            rows[i] = {**asdict(spec), "tokens": n_tokens, "seconds": statistics.median(times[i]),
                       "tokens_per_second": statistics.median(rates[i]), "repeats": len(times[i]),
                       "seconds_per_repeat": list(times[i]), "tokens_per_second_per_repeat": list(rates[i]),
                       "levels": levels, "outputs": tokens}
            if on_row is not None:
                on_row([row for row in rows if row is not None])
    return [row for row in rows if row is not None]


if __name__ == "__main__":
    main()
