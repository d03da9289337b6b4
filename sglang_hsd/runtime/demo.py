"""``sglang-hsd demo``'s generation part: plain decoding against a speculative hierarchy, same run.

A ``DemoSpec`` fixes everything the demo runs (models, levels, draft-length rule, prompts, threads,
kernel path); ``DEMOS`` is the registry ``sglang-hsd demo --model NAME`` picks from. For every
prompt, ``compare_on_prompts`` decodes it plainly (the target alone, one token per forward) and
then speculatively, both greedy, and reports whether the outputs are identical token for token,
the draft tokens the target accepted in each round, and both speeds (``PromptComparison``);
``format_range`` then sums the prompts up in one line. The default demo decodes a code prompt and
a chat prompt, so it shows the range of speed-ups (code drafts are long and mostly accepted, chat
drafts are not), not only the best case.

Plain decoding runs first and on the same model objects, thread count and kernels as the
speculative run, so the ratio compares decoding strategies, not kernels; the models are loaded
before either clock starts.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable

from tqdm.auto import tqdm

from sglang_hsd.draft_length import parse_draft_length
from sglang_hsd.levels import parse_level_specs, separate_model
from sglang_hsd.runtime.config import HierarchyConfig
from sglang_hsd.runtime.kernel_setup import DRAFTER_PRECISION_OPTIONS
from sglang_hsd.sampling import SamplingParams


@dataclass(frozen=True)
class DemoPrompt:
    """One prompt of a demo: the ``index``-th (0-based) user message of prompt set
    ``prompt_set`` (``sglang_hsd.assets``), or ``text`` itself when ``prompt_set`` is None."""

    prompt_set: str | None = None
    index: int = 0
    text: str | None = None

    def __post_init__(self) -> None:
        if (self.prompt_set is None) == (self.text is None):
            raise ValueError("DemoPrompt needs exactly one of prompt_set and text")
        if self.index < 0:
            raise ValueError(f"DemoPrompt index must be >= 0, got {self.index}")

    @property
    def label(self) -> str:
        return f"{self.prompt_set} prompt {self.index}" if self.prompt_set else "prompt"


@dataclass(frozen=True)
class DemoSpec:
    """One demo.

    Fields:
        target: registry name of the target model (``sglang_hsd.assets``).
        levels: the hierarchy in ``--levels`` grammar, cheapest first (``model:<name>`` = a
            separate drafter model, fetched like the target).
        buffers: one per level below the target (``--buffers``); None: the default 4 each.
        draft_length: ``--draft-length`` spelling (``fixed`` or ``adaptive[:threshold[:max]]``).
        exit_heads: ``--exit-heads`` (``none``, ``auto`` or a folder).
        prompts: the prompts decoded, in order (at least one).
        max_new_tokens: tokens generated per prompt and decoding strategy.
        threads: torch intra-op threads; 0 = ``auto_threads()`` (every core when the machine is
            idle, one when other jobs keep it busy).
        pack_linears: run the target's multi-row projections (verification, prefill) through
            oneDNN prepacked weights (``CausalLM.pack_linears``; plain decoding uses the same
            model), and its single rows too where that is measured faster on this machine
            (``kernel_paths.single_row_split``), and a separate drafter's likewise.
        drafter_precision: the weight copy a separate drafter's single-row steps read
            (``kernel_setup.DRAFTER_PRECISION_OPTIONS``: ``auto`` = the fastest measured on this CPU;
            ``fp32`` for exit drafters).
        summary: one line for ``--help``.
    """

    target: str
    levels: str
    buffers: tuple[int, ...] | None
    draft_length: str
    exit_heads: str
    prompts: tuple[DemoPrompt, ...]
    max_new_tokens: int
    threads: int
    pack_linears: bool
    drafter_precision: str
    summary: str

    def __post_init__(self) -> None:
        parse_level_specs(self.levels, list(self.buffers) if self.buffers else None)  # ValueError if bad
        parse_draft_length(self.draft_length)
        if not self.prompts:
            raise ValueError("DemoSpec needs at least one prompt")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens (--max-new-tokens) must be >= 1, got {self.max_new_tokens}")
        if self.threads < 0:
            raise ValueError(f"threads (--threads) must be >= 0 (0 = auto), got {self.threads}")
        if self.drafter_precision not in DRAFTER_PRECISION_OPTIONS:
            raise ValueError(f"drafter_precision must be one of {', '.join(DRAFTER_PRECISION_OPTIONS)}, "
                             f"got {self.drafter_precision!r}")

    @property
    def drafter(self) -> str | None:
        """The separate model's name or folder, if a level is one."""
        level = separate_model(parse_level_specs(self.levels, list(self.buffers) if self.buffers else None))
        return level.model_path if level is not None else None

    def hierarchy(self) -> HierarchyConfig:
        """The speculative run's ``HierarchyConfig`` (verify rule ``hsd`` at every level)."""
        levels = parse_level_specs(self.levels, list(self.buffers) if self.buffers else None)
        return HierarchyConfig(levels, draft_length=parse_draft_length(self.draft_length))


QWEN_PAIR = DemoSpec(
    target="qwen2.5-coder-1.5b",
    levels="model:qwen2.5-coder-0.5b,target",
    buffers=None,
    draft_length="adaptive:0.4:16",
    exit_heads="none",
    # The first prompt of each set, not chosen for speed: on code the drafter agrees with the
    # target for long stretches, on chat far less often.
    prompts=(DemoPrompt("humaneval", 0), DemoPrompt("mtbench", 0)),
    max_new_tokens=64,
    threads=0,
    pack_linears=True,
    drafter_precision="auto",
    summary="Qwen2.5-Coder-0.5B-Instruct drafts for Qwen2.5-Coder-1.5B-Instruct on a HumanEval "
    "and an MT-Bench prompt (adaptive draft length); the default: the range from code to chat",
)

SMOLLM2_EXITS = DemoSpec(
    target="smollm2-135m",
    levels="exit:8,exit:16,target",
    buffers=None,
    draft_length="fixed",
    exit_heads="auto",
    prompts=(DemoPrompt(text="Write a Python function that checks whether a number is prime, and explain it "
                        "briefly."),),
    max_new_tokens=48,
    threads=1,
    pack_linears=False,
    drafter_precision="fp32",
    summary="SmolLM2-135M-Instruct drafting with its own early exits (exit:8 -> exit:16 -> "
    "target); small and quick to fetch, but slower than plain decoding",
)

# ``sglang-hsd demo --model NAME``: NAME -> what runs.
DEMOS: dict[str, DemoSpec] = {QWEN_PAIR.target: QWEN_PAIR, SMOLLM2_EXITS.target: SMOLLM2_EXITS}
DEFAULT_DEMO = QWEN_PAIR.target


@dataclass
class PromptComparison:
    """Plain against speculative greedy decoding of one prompt.

    Fields:
        plain_tokens, spec_tokens: generated token ids (prompt excluded).
        plain_seconds, spec_seconds: wall time of each generation.
        plain_cpu_seconds, spec_cpu_seconds: this process's CPU time during each generation (other
            jobs on the machine stretch wall time far more than CPU time; spinning threads count).
        loads: 1-minute load average before the plain run and after the speculative one.
        accepted: per target round, the draft tokens the target accepted (the round emitted one
            more: the corrected or bonus token).
        drafter_precision: the weights the drafter's single-row steps read (``"auto"`` resolved).
    """

    plain_tokens: list[int]
    spec_tokens: list[int]
    plain_seconds: float
    spec_seconds: float
    plain_cpu_seconds: float
    spec_cpu_seconds: float
    loads: tuple[float, float]
    accepted: list[int]
    drafter_precision: str = "fp32"

    @property
    def identical(self) -> bool:
        return self.plain_tokens == self.spec_tokens

    @property
    def plain_tokens_per_second(self) -> float:
        return len(self.plain_tokens) / self.plain_seconds

    @property
    def spec_tokens_per_second(self) -> float:
        return len(self.spec_tokens) / self.spec_seconds

    @property
    def speedup(self) -> float:
        return self.spec_tokens_per_second / self.plain_tokens_per_second

    @property
    def mean_accepted(self) -> float:
        return sum(self.accepted) / len(self.accepted) if self.accepted else float("nan")


def auto_threads(cores: int | None = None, load: float | None = None) -> int:
    """The intra-op thread count for the demo: all ``cores`` when the 1-minute load average
    (``load``; read before the demo starts working) is below 0.75, else 1.

    Why: the target's prepacked multi-row products scale to both cores of an idle 2-core machine
    (``docs/cpu.md``), but with other jobs on the cores every parallel region waits for a busy
    core; on the shared development machine (load 6-8) two threads made plain decoding 5x slower
    and speculation slower than plain, while one thread kept the speed-up.
    """
    cores = cores if cores is not None else (os.cpu_count() or 1)
    load = load if load is not None else os.getloadavg()[0]
    return cores if load < 0.75 else 1


def compress_runs(values: list[int]) -> str:
    """``[16, 16, 16, 4, 2, 2]`` -> ``"16x3 4 2x2"`` (a value repeated n > 1 times in a row: ``vxn``)."""
    parts: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j < len(values) and values[j] == values[i]:
            j += 1
        parts.append(f"{values[i]}x{j - i}" if j - i > 1 else str(values[i]))
        i = j
    return " ".join(parts)


def _timed(generator, prompt: list[int], spec: DemoSpec, eos, desc: str, progress: bool, trace: bool):
    """One greedy generation of ``prompt`` with a tqdm bar over its tokens."""
    with tqdm(total=spec.max_new_tokens, desc=desc, unit="tok", disable=not progress, leave=True) as bar:
        def advance(done: int) -> None:
            bar.update(done - bar.n)

        cpu = time.process_time()
        result = generator.generate([prompt], SamplingParams(temperature=0.0), spec.max_new_tokens, eos,
                                    trace_rounds=trace, progress=advance)
        return result, time.process_time() - cpu


def compare_on_prompts(target, drafter, spec: DemoSpec, prompts: list[list[int]], eos_token_id=None,
                       exit_heads: dict | None = None, progress: bool = True,
                       report: Callable[[int, PromptComparison], None] | None = None) -> list[PromptComparison]:
    """Decode every prompt plainly, then speculatively (greedy), and compare.

    Args:
        target: the target ``CausalLM``; drafter: the drafter ``CausalLM`` when ``spec.levels``
            starts with a ``model`` level, else None.
        prompts: token id lists (already chat-templated).
        exit_heads: trained exit heads by layer (``load_exit_heads_option``), for exit levels.
        progress: tqdm bars per generation on stderr.
        report: called with each prompt's index (0-based) and comparison as soon as it is done.

    Returns: one ``PromptComparison`` per prompt.
    """
    from sglang_hsd.levels import parse_level_specs as parse
    from sglang_hsd.runtime.engine import SpeculativeGenerator
    from sglang_hsd.runtime.kernel_setup import configure_kernels

    if spec.pack_linears:  # in place: plain and speculative decoding share these kernels
        configure_kernels(target, None, pack_linears=True)
    plain = SpeculativeGenerator(target, HierarchyConfig(parse("target")))
    speculative = SpeculativeGenerator(target, spec.hierarchy(), drafter=drafter, exit_heads=exit_heads,
                                       pack_linears=spec.pack_linears, drafter_precision=spec.drafter_precision)
    results = []
    for number, prompt in enumerate(prompts, 1):
        load = os.getloadavg()[0]
        base, base_cpu = _timed(plain, prompt, spec, eos_token_id, f"plain {number}/{len(prompts)}", progress, False)
        fast, fast_cpu = _timed(speculative, prompt, spec, eos_token_id, f"speculative {number}/{len(prompts)}",
                                progress, True)
        accepted = [entry["target_accepted"] for entry in fast.round_trace[0]]
        results.append(PromptComparison(base.tokens[0], fast.tokens[0], base.seconds, fast.seconds, base_cpu,
                                        fast_cpu, (load, os.getloadavg()[0]), accepted,
                                        speculative.drafter_precision))
        if report is not None:
            report(number - 1, results[-1])
    return results


def format_comparison(result: PromptComparison, label: str, decode: Callable[[list[int]], str] | None = None) -> str:
    """The lines the demo prints for one prompt."""
    lines = [f"--- {label}"]
    if decode is not None:
        lines.append(decode(result.spec_tokens).rstrip())
        lines.append("---")
    verdict = "IDENTICAL" if result.identical else "DIFFERENT"
    lines += [
        f"greedy output vs plain decoding, token for token: {verdict} ({len(result.spec_tokens)} tokens)",
        f"accepted draft tokens per round: mean {result.mean_accepted:.2f} over {len(result.accepted)} rounds "
        f"[{compress_runs(result.accepted)}]  (vxn = v in n rounds in a row)",
        f"plain {result.plain_tokens_per_second:.2f} tok/s, speculative {result.spec_tokens_per_second:.2f} tok/s: "
        f"{result.speedup:.2f}x (drafter steps on {result.drafter_precision} weights)",
        f"(process CPU time: plain {result.plain_cpu_seconds:.1f}s, speculative {result.spec_cpu_seconds:.1f}s, "
        f"{result.plain_cpu_seconds / result.spec_cpu_seconds:.2f}x; 1-minute load average "
        f"{result.loads[0]:.1f} -> {result.loads[1]:.1f}: other jobs stretch wall time)",
    ]
    return "\n".join(lines)


def prompt_texts(prompts: tuple[DemoPrompt, ...]) -> list[str]:
    """The user message of every prompt, in order (untemplated)."""
    from sglang_hsd.runtime import loading

    return [prompt.text if prompt.prompt_set is None
            else loading.prompt_set_texts(prompt.prompt_set, prompt.index + 1)[prompt.index]
            for prompt in prompts]


def format_range(labels: list[str], results: list[PromptComparison]) -> str:
    """One line over every prompt: the lowest and the highest speed-up, each with its prompt and
    acceptance, and whether every output equals plain decoding's."""
    ranked = sorted(zip(results, labels), key=lambda pair: pair[0].speedup)
    parts = [f"{result.speedup:.2f}x ({label}, {result.mean_accepted:.1f} drafts accepted per round)"
             for result, label in (ranked[0], ranked[-1])]
    span = parts[0] if len(ranked) == 1 else f"{parts[0]} to {parts[1]}"
    same = all(result.identical for result in results)
    verdict = "every output identical to plain decoding" if same else "AN OUTPUT DIFFERS from plain decoding"
    return f"range over {len(results)} prompt{'s' * (len(results) > 1)}: {span}; {verdict}"


def run_demo(spec: DemoSpec, progress: bool = True) -> int:
    """Fetch (with progress bars) and load the models, compare on the spec's prompts, print each
    prompt's comparison as it finishes, then the range over all of them.

    Returns 0 if every speculative output equals plain decoding's, else 1.
    """
    import torch

    from sglang_hsd.assets.chat import encode_prompts
    from sglang_hsd.runtime import loading

    torch.set_num_threads(spec.threads or auto_threads())  # ``sglang-hsd demo`` resolves 0 earlier
    start = time.perf_counter()
    target = loading.load_model(spec.target)
    drafter = loading.load_model(spec.drafter) if spec.drafter else None
    if drafter is not None:
        loading.check_same_tokenizer(target.tokenizer, drafter.tokenizer, spec.drafter)
    print(f"models ready in {time.perf_counter() - start:.0f}s; {spec.levels}, draft length "
          f"{spec.draft_length}, {torch.get_num_threads()} thread(s), oneDNN prepacked: {spec.pack_linears}, "
          f"drafter steps: {spec.drafter_precision}")
    texts = prompt_texts(spec.prompts)
    labels = [prompt.label for prompt in spec.prompts]
    decode = lambda tokens: target.tokenizer.decode(tokens, skip_special_tokens=True)  # noqa: E731

    def report(number: int, result: PromptComparison) -> None:
        first_line = texts[number].strip().splitlines()[0]
        print(f"\n> {first_line[:100]}{' [...]' if len(first_line) > 100 else ''}\n", flush=True)
        print(format_comparison(result, labels[number], decode), flush=True)

    results = compare_on_prompts(target.model, drafter.model if drafter else None, spec,
                                 encode_prompts(target.tokenizer, texts), target.tokenizer.eos_token_id,
                                 loading.load_exit_heads_option(target, spec.exit_heads), progress, report)
    print("\n" + format_range(labels, results))
    return 0 if all(result.identical for result in results) else 1
