"""The ``--hsd-*`` flags on SGLang's launcher parser.

SGLang's ``ServerArgs`` is a closed dataclass pickled to every scheduler process, so a plugin
cannot add fields to it. ``extend_cli`` wraps ``ServerArgs.add_cli_args`` to add the flags of
``HSD_FLAGS``; each flag's action stores its value in an environment variable instead, which
every process SGLang spawns inherits (``config.py`` reads them back when the worker is built).
"""

from __future__ import annotations

import argparse
import os

from sglang_hsd.sglang_plugin.config import (
    DRAFT_TEMPERATURE_SCALE_ENV,
    EXIT_BUFFER_ENV,
    EXIT_HEADS_ENV,
    EXIT_LAYER_ENV,
    EXIT_METHOD_ENV,
    ON_OFF,
    PLAN_ENV,
    TREE_DRAFT_ENV,
    TREE_DRAFTS,
    TREE_RULE_ENV,
    VERIFY_METHOD_CHOICES,
    VERIFY_METHOD_ENV,
)
from sglang_hsd.sglang_plugin.adaptive_setting import (
    ADAPTIVE_ENV, ADAPTIVE_FLAG, CYCLE_ENV, CYCLE_FLAG, TRACE_ENV, TRACE_FLAG, TUNABLE, TUNING_ENV, TUNING_FLAG)
from sglang_hsd.sglang_plugin.draft_catch_up_setting import (
    CATCH_UP_ENV, CATCH_UP_FLAG, EXTEND_ENV, EXTEND_FLAG, EXTEND_MODES)
from sglang_hsd.sglang_plugin.cpu.draft_copies import DRAFT_PRECISION_ENV, DRAFT_PRECISION_FLAG, SERVER_DRAFT_PRECISIONS
from sglang_hsd.sglang_plugin.cpu.lean_decode import LEAN_DECODE_ENV, LEAN_DECODE_FLAG, LEAN_DECODE_MODES
from sglang_hsd.sglang_plugin.cpu.linear_path import (
    CPU_LINEAR_ENV, CPU_LINEAR_FLAG, CPU_LINEAR_PATHS, PADDING_CHOICES, PADDING_ENV, PADDING_FLAG)
from sglang_hsd.sglang_plugin.draft_kind import DRAFT_KIND_ENV, DRAFT_KINDS
from sglang_hsd.sglang_plugin.draft_lookup_setting import COPIES_ENV, COPIES_FLAG, LOOKUP_ENV, LOOKUP_FLAG
from sglang_hsd.sglang_plugin.request_seeds import REQUEST_SEEDS_CHOICES, REQUEST_SEEDS_ENV, REQUEST_SEEDS_FLAG
from sglang_hsd.verify import LOSSLESS_CHAIN_METHODS
from sglang_hsd.tree_draft import LOSSLESS_LEVEL_RULES


class _EnvAction(argparse.Action):
    """An ``--hsd-*`` flag stored in the environment variable ``self.const``, so spawned
    scheduler processes see it (ServerArgs is a closed dataclass)."""

    def __call__(self, parser, namespace, values, option_string=None):
        os.environ[self.const] = str(values)


# (flag, environment variable, argparse extras, help)
HSD_FLAGS = (
    ("--hsd-verify-method", VERIFY_METHOD_ENV, {"choices": VERIFY_METHOD_CHOICES},
     "verifier of the target level: chains (topk 1) hsd|tokenwise (default hsd); trees "
     "(topk > 1) hsd|rrs with --hsd-tree-draft sampled (default hsd), target-only with topk"),
    ("--hsd-tree-draft", TREE_DRAFT_ENV, {"choices": tuple(TREE_DRAFTS)},
     "how trees (--speculative-eagle-topk > 1) are drafted: sampled (children drawn without "
     "replacement from the drafter's q; default), argmax-first (each node's first child is q's "
     "argmax, the others drawn without replacement from q without it) or topk (SGLang's "
     "deterministic top-k)"),
    ("--hsd-tree-rule", TREE_RULE_ENV, {"choices": LOSSLESS_LEVEL_RULES},
     "expansion rule of sampled trees (which drafted nodes are forwarded and kept, decided from "
     "earlier draws only): spine_wide (default; deep, for drafters that accept several tokens), "
     "spine, or beam (wide and shallow, for drafters that accept few)"),
    ("--hsd-draft-temperature-scale", DRAFT_TEMPERATURE_SCALE_ENV, {"type": float, "metavar": "S"},
     "S > 0: sampled trees draw children from the drafter's q at temperature T * S (T: the "
     "request's) and verify with that q, so the output law is unchanged; S < 1 sharpens a "
     "drafter flatter than the target (default 1)"),
    ("--hsd-exit-layer", EXIT_LAYER_ENV, {"type": int, "metavar": "L"},
     "add an early-exit verifier level: the target's first L layers plus an exit head verify "
     "the EAGLE-3 drafts, the remaining layers run only for the positions it accepted"),
    ("--hsd-exit-heads", EXIT_HEADS_ENV, {"metavar": "DIR|none"},
     "folder of trained exit heads (eagle_heads.exit_heads) or 'none' for the logit lens "
     "(default none)"),
    ("--hsd-exit-method", EXIT_METHOD_ENV, {"choices": LOSSLESS_CHAIN_METHODS},
     "chain verifier of the exit level (default: --hsd-verify-method)"),
    ("--hsd-exit-buffer", EXIT_BUFFER_ENV, {"type": int, "metavar": "N_i"},
     "N_i: provisional tokens the exit level accumulates (exit sub-rounds inside one verify "
     "window of --speculative-num-steps + 1 positions) before the full target verifies them "
     "(default 1: one exit sub-round per round)"),
    ("--hsd-plan", PLAN_ENV, {"metavar": "PLAN.json"},
     "take the exit layer and its buffer from a `sglang-hsd plan` JSON (its one intermediate "
     "exit level), or its lookup level below the draft model (lookup:N,model:...,target: "
     "--hsd-draft-lookup N with the lookup's buffer as the copies); nothing else is read from it, so a plan with runtime knobs (draft_length, "
     "tree, threads, kernel_path, drafter_precision) is refused, naming the server's own flag "
     "for each"),
    ("--hsd-draft-kind", DRAFT_KIND_ENV, {"choices": DRAFT_KINDS},
     "what --speculative-draft-model-path is: an EAGLE-3 head (eagle3), a separate language model "
     "of the target's family with its own KV cache (model), or detected from its config (auto, "
     "the default)"),
    (REQUEST_SEEDS_FLAG, REQUEST_SEEDS_ENV, {"choices": REQUEST_SEEDS_CHOICES},
     "auto (default): on where SGLang's sampler takes seeds (--sampling-backend pytorch, the CPU "
     "default), else off. on: a request with a seed gets the same tokens every time, whatever "
     "the speculation drafted (seeded batches are verified against the target's keyed draws); "
     "needs the torch sampler. off: SGLang's behaviour (seeds honoured only with "
     "--enable-deterministic-inference)"),
    (CPU_LINEAR_FLAG, CPU_LINEAR_ENV, {"choices": CPU_LINEAR_PATHS},
     "CPU kernel of the unquantized linear layers and lm_head of every model the server loads, "
     "with or without speculation: mkl (SGLang's F.linear, the default) or onednn-packed "
     "(oneDNN pre-packed float32 weights, much cheaper for the few rows of a verification "
     "forward; needs --dtype float32; the float32 weights are released once packed)"),
    (PADDING_FLAG, PADDING_ENV, {"choices": PADDING_CHOICES},
     "with --hsd-cpu-linear onednn-packed: auto (default) pads packed calls of 1-3 rows with zero "
     "rows to 4 where each model's measurement at load says that is faster (oneDNN's few-row "
     "kernel is slower on some CPUs); off never pads"),
    (ADAPTIVE_FLAG, ADAPTIVE_ENV, {"choices": ON_OFF},
     "on (default for chains): each decode round drafts the length (0 = plain decoding up to "
     "--speculative-num-steps) that maximises expected tokens per second for the batch, from the "
     "requests' past acceptance and this server's measured round costs; logged, reported in "
     "/server_info and per request (meta_info hsd_draft_budget). off: every round drafts "
     "--speculative-num-steps. Trees and the exit level keep their shape"),
    (CYCLE_FLAG, CYCLE_ENV, {"metavar": "L1,L2,..."},
     "comma-separated draft lengths (each 0..--speculative-num-steps) that each request's "
     "decode rounds take in turn from its first round (a batch follows its youngest request) "
     "instead of the adaptive controller's choice: measures what each length costs and "
     "tests the switches between them (fixed before any draft, so lossless)"),
    (TRACE_FLAG, TRACE_ENV, {"metavar": "FILE"},
     "a file that gets one JSON line per decode round under --hsd-adaptive: the batch size, "
     "each request's estimated acceptance rate, the draft catch-up owed, the chosen length and "
     "the round's seconds (to see why the controller chose what it did)"),
    (TUNING_FLAG, TUNING_ENV, {"metavar": "NAME=VALUE,..."},
     "comma-separated name=value settings of the adaptive controller instead of its defaults "
     f"(names: {', '.join(TUNABLE)}), e.g. draft_margin=1.05; refused before models load where a "
     "value cannot hold or --hsd-adaptive does not choose (off, or a --hsd-draft-lengths-cycle)"),
    (CATCH_UP_FLAG, CATCH_UP_ENV, {"choices": ON_OFF},
     "on (default with --hsd-draft-kind model on CPU under --hsd-adaptive): a round that drafts "
     "nothing skips the draft model's extend and a prefill the draft model's prefill, and the "
     "draft cache catches up in one batched extend when drafting resumes; reported in "
     "/server_info (hsd.draft_catch_up). off: every round and prefill runs the draft model "
     "(SGLang's way)"),
    (EXTEND_FLAG, EXTEND_ENV, {"choices": EXTEND_MODES},
     "with the draft catch-up: tail (default) runs the draft model after a drafting chain round "
     "only over the one or two positions its draft steps did not write (the bonus token, and "
     "the last draft when all were accepted); window reruns the whole verify window (SGLang's "
     "way). Reported in /server_info (hsd.draft_catch_up)"),
    (DRAFT_PRECISION_FLAG, DRAFT_PRECISION_ENV, {"choices": SERVER_DRAFT_PRECISIONS},
     "CPU: the weight copy a separate draft model's (--hsd-draft-kind model) few-row forwards "
     "read: auto (default: the fastest measured at start-up, logged), fp32 (none), bf16, fp16, "
     "int8, int4 or w8a8 (int8 weights and per-row 8-bit activations: where it measures faster "
     "at every row count, prefills and catch-ups too). Only the drafter's numbers change; the "
     "verifier uses the q it produced, so the output law is unchanged"),
    (LOOKUP_FLAG, LOOKUP_ENV, {"metavar": "N|off"},
     "N (a longest n-gram) or off (default): a prompt-lookup level below a separate draft model "
     "(--hsd-draft-kind model, chains, CPU): each draft forward also reads the tokens that "
     "followed the latest earlier occurrence of the text's last <= N tokens, and hands up several "
     "drafts where the draft model's own draws match them (same drafts, same law, fewer "
     "forwards). Reported in /server_info (hsd.draft_lookup)"),
    (COPIES_FLAG, COPIES_ENV, {"type": int, "metavar": "M"},
     "with --hsd-draft-lookup: the most tokens one lookup copies (default: as many as the "
     "round's chain has room for); on CPU each copy is a row of the draft forward"),
    (LEAN_DECODE_FLAG, LEAN_DECODE_ENV, {"choices": LEAN_DECODE_MODES},
     "CPU: how a separate draft model (--hsd-draft-kind model) runs its forwards (draft steps, "
     "draft extends, its prefill): auto (default) the lean forward of Llama / Qwen2-style models "
     "(the same layers with far fewer Python and torch calls; other models SGLang's forward, "
     "logged), lean (refused for a model it does not support), checked (both, compared on "
     "every forward: a test mode) or sglang. Only the drafter's numbers can change (float "
     "rounding); the verifier uses the q they produced"),
)


def flags_markdown() -> str:
    """``HSD_FLAGS`` as the table of ``docs/sglang_plugin.md`` ("Flags"): flag and value, variable,
    meaning (the help text). Pipes are escaped, as a table cell needs (in code spans too)."""
    lines = ["| flag | variable | meaning |", "|---|---|---|"]
    for flag, env, extras, text in HSD_FLAGS:
        value = "{" + ",".join(extras["choices"]) + "}" if "choices" in extras else extras["metavar"]
        cells = (f"`{flag} {value}`", f"`{env}`", text)
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines) + "\n"


def extend_cli(server_args_cls) -> None:
    """Wrap ``server_args_cls.add_cli_args`` (SGLang's ``ServerArgs``) to add ``HSD_FLAGS``."""
    original = server_args_cls.__dict__["add_cli_args"].__func__

    def add_cli_args(parser):
        original(parser)
        for flag, env, extras, text in HSD_FLAGS:
            if flag not in parser._option_string_actions:
                parser.add_argument(
                    flag, action=_EnvAction, const=env, dest=argparse.SUPPRESS,
                    default=argparse.SUPPRESS,
                    help=f"sglang-hsd: {text}; also settable as {env}",
                    **extras,
                )

    add_cli_args.__sglang_hsd_original__ = original
    server_args_cls.add_cli_args = staticmethod(add_cli_args)
