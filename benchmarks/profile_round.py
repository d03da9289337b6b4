"""Where a speculative round spends its time: a per-section breakdown of ``SpeculativeGenerator``.

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python benchmarks/profile_round.py --model smollm2-135m \\
        --config "model:smollm2-135m,target" --buffers 4 --temperature 0

``--pack-linears``, ``--draft-length`` and ``--drafter-precision`` set the generator up as
``bench_e2e.py`` does. The engine's functions are wrapped with timers for one ``generate`` call
(after a short warm-up call); each section reports its *exclusive* time (time inside it minus time inside nested
sections), so the shares add up to the total (wall time, or with ``--clock cpu`` the process's
CPU time, which other jobs on a shared machine disturb less):

* ``forward:<model>[a:b]`` - decoder layers a..b (``CausalLM.forward_layers``) outside matmuls;
  ``.../matmul`` - the linear projections inside them (``nn.Linear`` / ``PackedLinear``). ``prefill:...`` - the same for
  forwards of more than ``PREFILL_MIN_TOKENS`` tokens per row (the prompt).
* ``head:<model>`` - final norm + LM head or a trained exit head (``exit_logits``), matmul
  included (``head/matmul``).
* ``probs`` - temperature / top-k / top-p / softmax (``logits_to_probs``).
* ``verify_chain``, ``truncate`` (cache roll-back), ``commit`` (EOS / length checks),
  ``append`` (an intermediate level's buffer), ``advance`` (gathering a group's inputs and
  storing its hidden states).
* ``draft``, ``verify``, ``run`` - the engine's own Python and tensor bookkeeping in those
  methods (sampling the draft token with ``multinomial`` is in ``draft``).

``--compare-packing 3`` instead alternates plain and packed linears (``CausalLM.pack_linears``)
in one process and prints tokens per CPU second; ``--matmul-rows 1 2 5 8`` times one MLP projection and the LM head of the model by row
count, ``F.linear`` against ``PackedLinear``. ``--torch-profile`` adds torch.profiler's top operators (host syncs show up as
``aten::_local_scalar_dense``). The script only reads attribute names, so it also profiles older
versions of the engine (put their checkout first on ``PYTHONPATH``). It prints its tables, then the
run record (commit, command, machine load); it writes no file.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections import defaultdict

import torch

from benchmarks.common import add_standard_arguments, benchmark_parser, encoded_prompts, start_run
from sglang_hsd.draft_length import parse_draft_length
from sglang_hsd.runtime.kernel_paths import single_row_split
from sglang_hsd.runtime.kernel_setup import parse_drafter_precision

# Forwards over more new tokens than this per row are the prompt's prefill, reported apart.
PREFILL_MIN_TOKENS = 32


class SectionTimer:
    """Exclusive wall time per section name, with a stack so nested sections are not double counted."""

    def __init__(self, clock=time.perf_counter) -> None:
        self.clock = clock
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._stack: list[list] = []  # [name, start, nested seconds]

    @contextlib.contextmanager
    def section(self, name: str):
        if self._stack and name.startswith("/"):
            name = self._stack[-1][0].split("/")[0] + name
        # A wrapper (PackedLinear, CopyRowsLinear) calling its inner linear: one matmul, timed once.
        if self._stack and self._stack[-1][0] == name:
            yield
            return
        frame = [name, self.clock(), 0.0]
        self._stack.append(frame)
        try:
            yield
        finally:
            self._stack.pop()
            elapsed = self.clock() - frame[1]
            self.seconds[name] += elapsed - frame[2]
            self.calls[name] += 1
            if self._stack:
                self._stack[-1][2] += elapsed


def _wrap(timer: SectionTimer, owner, attr: str, name, patches: list) -> None:
    """Replace ``owner.attr`` by a timed wrapper; ``name`` is a string or ``f(*args) -> str``."""
    original = getattr(owner, attr, None) if owner is not None else None
    if original is None:
        return

    @functools.wraps(original)
    def timed(*args, **kwargs):
        with timer.section(name(*args) if callable(name) else name):
            return original(*args, **kwargs)

    patches.append((owner, attr, original))
    setattr(owner, attr, timed)


@contextlib.contextmanager
def instrumented(timer: SectionTimer, roles: dict[int, str]):
    """Wrap the engine's pieces with ``timer`` sections while the context is open."""
    from sglang_hsd.runtime import engine, groups, layers
    from sglang_hsd.runtime.model import CausalLM

    role = lambda model: roles.get(id(model), "model")  # noqa: E731
    patches: list = []
    def forward_name(self, hidden, start, end, *args, **kwargs) -> str:
        kind = "prefill" if hidden.shape[1] > PREFILL_MIN_TOKENS else "forward"
        return f"{kind}:{role(self)}[{start}:{end}]"

    _wrap(timer, CausalLM, "forward_layers", forward_name, patches)
    _wrap(timer, CausalLM, "exit_logits", lambda self, *a, **k: f"head:{role(self)}", patches)
    _wrap(timer, torch.nn.Linear, "forward", "/matmul", patches)
    _wrap(timer, getattr(layers, "PackedLinear", None), "forward", "/matmul", patches)
    _wrap(timer, getattr(layers, "CopyRowsLinear", None), "forward", "/matmul", patches)
    for module in (engine, groups):
        _wrap(timer, module, "advance", "advance", patches)
    for attr, name in (("logits_to_probs", "probs"), ("verify_chain", "verify_chain"),
                       ("truncate_all", "truncate")):
        _wrap(timer, engine, attr, name, patches)
    for attr, name in (("_draft", "draft"), ("_verify", "verify"), ("_commit", "commit"),
                       ("_append_to_buffer", "append"), ("_autoregressive_step", "autoregressive"),
                       ("run", "run")):
        _wrap(timer, engine._Run, attr, name, patches)
    try:
        yield
    finally:
        for owner, attr, original in reversed(patches):
            setattr(owner, attr, original)


def format_breakdown(timer: SectionTimer, total: float) -> str:
    """A table of sections by exclusive time, with their share of ``total`` seconds."""
    lines = [f"{'section':<34} {'calls':>6} {'seconds':>8} {'share':>6}"]
    for name, seconds in sorted(timer.seconds.items(), key=lambda item: -item[1]):
        lines.append(f"{name:<34} {timer.calls[name]:>6} {seconds:>8.3f} {seconds / total:>6.1%}")
    outside = total - sum(timer.seconds.values())
    lines.append(f"{'(outside the sections)':<34} {'':>6} {outside:>8.3f} {outside / total:>6.1%}")
    return "\n".join(lines)


def matmul_costs(model, rows: list[int], repeats: int = 5) -> str:
    """Milliseconds of one MLP projection and the LM head by row count: ``F.linear`` vs packed.

    Interleaved repeats, median; the ratio to one row is what a (K + 1)-token verification
    forward costs relative to a single-token decoding step.
    """
    import statistics

    from sglang_hsd.runtime.layers import PackedLinear, packed_linear_supported

    def plain(module):
        return module.linear if isinstance(module, PackedLinear) else module

    lines = [f"{'projection':<22} {'rows':>4} {'F.linear ms':>12} {'x 1 row':>8} {'packed ms':>10} {'x 1 row':>8}"]
    for label, module in (("mlp.up_proj", model.layers[0].mlp.up_proj), ("lm_head", model.lm_head)):
        linear = plain(module)
        packed = PackedLinear(linear) if packed_linear_supported(linear) else None
        times: dict[tuple[str, int], list[float]] = defaultdict(list)
        with torch.inference_mode():
            for _ in range(repeats):
                for count in rows:
                    x = torch.randn(1, count, linear.in_features)
                    for kind, fn in (("plain", linear), ("packed", packed)):
                        if fn is None:
                            continue
                        fn(x)
                        start = time.perf_counter()
                        fn(x)
                        times[kind, count].append((time.perf_counter() - start) * 1e3)
        med = {key: statistics.median(value) for key, value in times.items()}
        for count in rows:
            plain_ms = med["plain", count]
            packed_ms = med.get(("packed", count), float("nan"))
            lines.append(f"{label:<22} {count:>4} {plain_ms:>12.3f} {plain_ms / med['plain', 1]:>8.2f} "
                         f"{packed_ms:>10.3f} {packed_ms / med['plain', 1]:>8.2f}")
    return "\n".join(lines)


def compare_packing(gen, prompts, params, max_new_tokens: int, repeats: int) -> str:
    """Tokens per CPU second with plain and packed linears, alternating in one process."""
    models = [gen.target] + ([gen.drafter] if gen.drafter is not None else [])
    rates: dict[bool, list[float]] = defaultdict(list)
    for _ in range(repeats):
        for packed in (False, True):
            for model in models:
                model.unpack_linears()
                if packed:
                    model.pack_linears(single_row_split(model))
            start = time.process_time()
            generated = sum(gen.generate([prompt], params, max_new_tokens, seed=0).num_generated for prompt in prompts)
            rates[packed].append(generated / (time.process_time() - start))
    lines = []
    for packed in (False, True):
        label = "packed" if packed else "plain"
        lines.append(f"{label:>6}: " + " ".join(f"{rate:.2f}" for rate in rates[packed]) + " tokens / CPU s")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None):
    parser = benchmark_parser(__doc__)
    add_standard_arguments(parser, model="smollm2-135m")
    parser.add_argument("--config", default="model:smollm2-135m,target", help="levels string of sglang-hsd generate")
    parser.add_argument("--buffers", default="", help="comma list, one per level below the target")
    parser.add_argument("--method", default="hsd")
    parser.add_argument("--draft-length", default="fixed",
                        help="fixed (the buffer) or adaptive[:threshold[:max]] (sglang-hsd generate --draft-length)")
    parser.add_argument("--drafter-precision", default="fp32",
                        help="a separate drafter's single rows: fp32, bf16, fp16, int8 or int4")
    parser.add_argument("--pack-linears", action="store_true",
                        help="oneDNN pre-packed weights for multi-row calls (CausalLM.pack_linears)")
    add_standard_arguments(parser, exit_heads=True)
    parser.add_argument("--prompt-set", default="mtbench")
    parser.add_argument("--num-prompts", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--batch-size", type=int, default=1)
    add_standard_arguments(parser, threads=1)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="cpu: this process's CPU time (less sensitive to other jobs on a shared machine)")
    parser.add_argument("--compare-packing", type=int, metavar="REPEATS",
                        help="only compare plain and packed linears (tokens per CPU second), alternating")
    parser.add_argument("--matmul-rows", type=int, nargs="*",
                        help="only time one projection and the LM head for these row counts (e.g. 1 2 5 8)")
    parser.add_argument("--torch-profile", action="store_true", help="also print torch.profiler's top operators")
    args = parser.parse_args(argv)
    parse_draft_length(args.draft_length)  # bad input fails before any model is loaded
    parse_drafter_precision(args.drafter_precision)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    run = start_run(__file__, argv)
    torch.set_num_threads(args.threads)

    from sglang_hsd.runtime.loading import build_generator, load_model
    from sglang_hsd.sampling import SamplingParams

    target = load_model(args.model)
    if args.matmul_rows:
        print(matmul_costs(target.model, sorted(set(args.matmul_rows) | {1})))
        print(run.finish().markdown())
        return
    prompts = encoded_prompts(target.tokenizer, args.prompt_set, args.num_prompts)
    buffers = [int(x) for x in args.buffers.split(",")] if args.buffers else None
    gen = build_generator(target, args.config, buffers, args.method.split(","), args.exit_heads,
                          draft_length=parse_draft_length(args.draft_length), pack_linears=args.pack_linears,
                          drafter_precision=args.drafter_precision)
    roles = {id(target.model): "target"}
    if gen.drafter is not None:
        roles.setdefault(id(gen.drafter), "drafter")
    params = SamplingParams(temperature=args.temperature)
    gen.generate(prompts[:1], params, 4, seed=1)  # warm-up
    if args.compare_packing:
        print(f"{args.config} buffers={args.buffers or '-'} T={args.temperature} prompts={len(prompts)}")
        print(compare_packing(gen, prompts, params, args.max_new_tokens, args.compare_packing))
    else:
        profile_generate(gen, prompts, params, roles, args)
    print(run.finish().markdown())


def profile_generate(gen, prompts, params, roles: dict[int, str], args) -> None:
    """Time one ``generate`` per batch of prompts by section and print the breakdown."""
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    timer = SectionTimer(clock)
    start = clock()
    results = []
    with instrumented(timer, roles):
        for first in range(0, len(prompts), args.batch_size):
            batch = prompts[first : first + args.batch_size]
            results.append(gen.generate(batch, params, args.max_new_tokens, seed=0))
    total = clock() - start
    generated = sum(result.num_generated for result in results)
    print(f"{args.config} buffers={args.buffers or '-'} method={args.method} T={args.temperature} "
          f"prompts={len(prompts)} batch={args.batch_size} clock={args.clock}")
    for result in results:
        print(result.summary())
    print(f"{generated} tokens in {total:.2f} {args.clock} seconds = {generated / total:.2f} tok/s ({args.clock})")
    print(format_breakdown(timer, total))
    if args.torch_profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            gen.generate(prompts[: args.batch_size], params, args.max_new_tokens, seed=0)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


if __name__ == "__main__":
    main()
