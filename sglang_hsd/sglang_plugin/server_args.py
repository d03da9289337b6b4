"""Server-argument resolution and validation for ``--speculative-algorithm HSD``.

SGLang calls ``HSDSpecAlgo.handle_server_args`` (through ``record_foreign_defaults``, which hands a
recorder: reads see the resolving view, writes become declared resolutions) and then
``validate_server_args``. We do not reuse SGLang's ``_handle_eagle_family``: it compares the
algorithm *name* against ("EAGLE", "EAGLE3") and refuses rejection sampling for anything else.
What it does that matters for a topk=1 EAGLE-3 chain is repeated here.
"""

from __future__ import annotations

import logging
import os

from sglang_hsd.sglang_plugin.config import (
    DEFAULT_NUM_STEPS,
    DEFAULT_TOPK,
    EXIT_LAYER_ENV,
    PLAN_ENV,
    ExitLevelConfig,
    ExitLevelConfigError,
    PluginConfig,
    exit_level_from_plan,
)
from sglang_hsd.sglang_plugin.draft_kind import MODEL, check_same_vocabulary, resolve_draft_kind

logger = logging.getLogger(__name__)


class HSDServerArgsError(ValueError):
    """An option combination the HSD algorithm cannot serve; the message says what to change."""


def tree_verifier_available() -> bool:
    """Whether draft trees (topk > 1) are served: the tree verifier and the tree drafter ship."""
    try:
        from sglang_hsd.verify import verify_tree  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_hsd_server_args(args) -> None:
    """Fill defaults in place. ``args`` is a ServerArgs or SGLang's write recorder."""
    if args.max_running_requests is None:
        args.max_running_requests = 48
    if args.device == "cpu" and not args.disable_overlap_schedule:
        logger.warning("HSD: overlap scheduling is not implemented on CPU; disabling it.")
        args.disable_overlap_schedule = True
    if args.device == "cpu" and getattr(args, "dtype", None) == "auto":
        # SGLang's "auto" serves float32 checkpoints in float16, which most CPUs run far slower
        # than float32; the choice is the user's, so only say so.
        logger.warning("HSD on CPU: --dtype auto serves float32 checkpoints in float16, which is "
                       "slow on most CPUs; pass --dtype float32 (or bfloat16) for speed.")
    if args.enable_mixed_chunk:
        args.enable_mixed_chunk = False
    if args.speculative_num_steps is None:
        if args.speculative_eagle_topk not in (None, 1) or args.speculative_num_draft_tokens:
            raise HSDServerArgsError(
                "--speculative-algorithm HSD: give --speculative-num-steps too when setting "
                "--speculative-eagle-topk or --speculative-num-draft-tokens"
            )
        args.speculative_num_steps = DEFAULT_NUM_STEPS
    if args.speculative_eagle_topk is None:
        args.speculative_eagle_topk = DEFAULT_TOPK
    if args.speculative_eagle_topk == 1:
        args.speculative_num_draft_tokens = args.speculative_num_steps + 1
    # Chains: drafts must be *sampled* and carry their full q, which is SGLang's rejection-sampling
    # plumbing (EagleDraftWorker samples via sample_draft_proposal and keeps draft_probs). Trees:
    # that plumbing draws one child per beam (a chain), so the HSD draft worker draws the tree
    # and carries q itself and SGLang's flag stays off.
    if args.speculative_eagle_topk == 1 and not args.speculative_use_rejection_sampling:
        args.speculative_use_rejection_sampling = True
    validate_hsd_server_args(args)


def validate_hsd_server_args(args) -> None:
    """Refuse unsupported combinations with a message naming the option to change."""
    problems = []
    topk = args.speculative_eagle_topk
    steps = args.speculative_num_steps
    if topk is not None and topk < 1:
        problems.append(f"--speculative-eagle-topk {topk}: must be >= 1")
    elif topk not in (None, 1):
        problems += tree_problems(args)
    if steps is not None and steps < 1:
        problems.append(f"--speculative-num-steps {steps}: must be >= 1")
    if (topk in (None, 1) and steps is not None and args.speculative_num_draft_tokens
            not in (None, steps + 1)):
        problems.append(
            f"--speculative-num-draft-tokens {args.speculative_num_draft_tokens}: a chain of "
            f"{steps} steps verifies {steps + 1} tokens; drop the flag or set it to {steps + 1}"
        )
    try:
        PluginConfig.from_env(topk or 1)
    except ValueError as err:
        problems.append(str(err))
    if args.speculative_draft_model_path is None:
        problems.append("--speculative-draft-model-path: HSD needs a draft (an EAGLE-3 head or a "
                        "small language model of the target's family)")
    elif resolve_draft_kind(args.speculative_draft_model_path) == MODEL:
        problems += draft_model_problems(args)
    if (args.speculative_accept_threshold_single != 1.0
            or args.speculative_accept_threshold_acc != 1.0):
        problems.append(
            "--speculative-accept-threshold-single/-acc: thresholds make verification lossy; "
            "remove them"
        )
    if args.speculative_use_block_verification:
        problems.append(
            "--speculative-use-block-verification: HSD replaces SGLang's chain sampler; choose "
            "the verifier with --hsd-verify-method {hsd,tokenwise} instead"
        )
    problems += hsd_flag_problems(args)
    if getattr(args, "speculative_adaptive", False):
        problems.append("--speculative-adaptive: not supported with HSD; remove it")
    if getattr(args, "enable_multi_layer_eagle", False):
        problems.append("--enable-multi-layer-eagle: not supported with HSD; remove it")
    if getattr(args, "enable_deterministic_inference", False) and args.device != "cuda":
        problems.append(
            "--enable-deterministic-inference: SGLang 0.5.23 allows it only with GPU attention "
            "backends (fa3, fa4, flashinfer, triton, ...), none of which runs on this device; "
            "remove it"
        )
    if getattr(args, "enable_unified_memory", False):
        problems.append("--enable-unified-memory: not supported with HSD; remove it")
    if getattr(args, "enable_watermark", False):
        problems.append("--enable-watermark: incompatible with sampled drafts; remove it")
    if getattr(args, "pp_size", 1) > 1:
        problems.append("--pp-size > 1: not supported with HSD; use tensor parallelism")
    if getattr(args, "disaggregation_mode", "null") not in ("null", None):
        problems.append("--disaggregation-mode: not supported with HSD; remove it")
    if problems:
        raise _server_args_error(problems)


def _server_args_error(problems: list[str]) -> HSDServerArgsError:
    """One error listing ``problems``, a line each and each once: a plan's refusal spans lines
    (one per knob), and the draft-model checks read the same plan (``draft_model_problems``)."""
    lines = dict.fromkeys(line for problem in problems for line in problem.splitlines())
    return HSDServerArgsError("--speculative-algorithm HSD cannot run with these options:\n  - "
                              + "\n  - ".join(lines))


def tree_problems(args) -> list[str]:
    """What a topk > 1 server cannot honour, one message per option (naming the flag)."""
    topk, steps = args.speculative_eagle_topk, args.speculative_num_steps
    tokens = args.speculative_num_draft_tokens
    problems = []
    if not tree_verifier_available():
        problems.append(f"--speculative-eagle-topk {topk}: this build has no tree verifier; "
                        "use --speculative-eagle-topk 1")
    if tokens is None:
        problems.append(f"--speculative-num-draft-tokens: required with --speculative-eagle-topk "
                        f"{topk} (the tree's node budget N, root included)")
    elif steps is not None and steps >= 1:
        pool = topk + (steps - 1) * topk * topk
        if tokens - 1 < topk:
            problems.append(
                f"--speculative-eagle-topk {topk} is larger than the node budget "
                f"--speculative-num-draft-tokens {tokens} - 1; raise the budget to >= {topk + 1}")
        if tokens > 1 + pool:
            problems.append(
                f"--speculative-num-draft-tokens {tokens}: {steps} steps of topk {topk} draft at "
                f"most {pool} nodes; lower it to <= {pool + 1} or raise --speculative-num-steps")
    if args.speculative_use_rejection_sampling:
        problems.append("--speculative-use-rejection-sampling with --speculative-eagle-topk > 1: "
                        "SGLang's plumbing draws chains; HSD draws the tree and carries q itself, "
                        "remove the flag")
    if os.environ.get(EXIT_LAYER_ENV, "").strip() or _plan_has_exit_level():
        problems.append(f"--hsd-exit-layer (or an --hsd-plan exit level) with "
                        f"--speculative-eagle-topk {topk}: the exit level verifies chains only "
                        "(not built for trees); remove one of them")
    problems += _sampled_tree_problems(args)
    if args.device != "cpu" and not args.disable_overlap_schedule:  # CPU: turned off above
        problems.append(f"--speculative-eagle-topk {topk}: the overlap scheduler is not supported "
                        "with HSD trees; add --disable-overlap-schedule")
    return problems


def _plan_has_exit_level() -> bool:
    plan = os.environ.get(PLAN_ENV, "").strip()
    if not plan:
        return False
    try:
        return exit_level_from_plan(plan)[0] is not None
    except ExitLevelConfigError:
        return False  # plan_problems reports the bad plan itself


def _sampled_tree_problems(args) -> list[str]:
    """What ``--hsd-tree-draft sampled`` (the default for trees) cannot honour."""
    try:
        config = PluginConfig.from_env(args.speculative_eagle_topk)
    except ValueError:
        return []  # reported by validate_hsd_server_args
    if not config.sampled_tree:
        return []
    problems = []
    try:
        from sglang_hsd.tree_draft import TreeShape
        from sglang_hsd.tree_draft import LEVEL_RULES
    except ImportError:
        return problems + ["--hsd-tree-draft sampled: this build has no level-synchronous tree "
                           "drafter; use --hsd-tree-draft topk"]
    steps, topk, tokens = (args.speculative_num_steps, args.speculative_eagle_topk,
                           args.speculative_num_draft_tokens)
    if steps and tokens and tokens >= 2:
        capacity = LEVEL_RULES[config.tree_rule].capacity(TreeShape(steps, topk, tokens))
        if tokens - 1 > capacity:
            problems.append(
                f"--speculative-num-draft-tokens {tokens}: the sampled tree drafter "
                f"(--hsd-tree-rule {config.tree_rule}) "
                f"keeps at most {capacity} nodes for --speculative-num-steps {steps} and "
                f"--speculative-eagle-topk {topk}; lower it to <= {capacity + 1}")
    return problems


def draft_model_problems(args) -> list[str]:
    """What a separate draft language model (``--hsd-draft-kind model``) cannot serve with.

    The vocabulary check reads both checkpoints' configs and tokenizers (no weights), so a
    mismatched pair is refused before any model loads (``DraftKindError`` names the flag).
    """
    check_same_vocabulary(args.model_path, args.speculative_draft_model_path)
    problems = []
    try:
        buffer = ExitLevelConfig.from_env().buffer
    except ExitLevelConfigError as err:
        problems.append(str(err))
    else:
        if buffer > 1:
            problems.append(
                f"--hsd-exit-buffer {buffer} (or the --hsd-plan buffer) with --hsd-draft-kind "
                "model (a draft language model at --speculative-draft-model-path): exit "
                "sub-rounds draft from an EAGLE-3 head's hidden states; use --hsd-exit-buffer 1")
    if getattr(args, "speculative_token_map", None):
        problems.append("--speculative-token-map with --hsd-draft-kind model: a draft language "
                        "model drafts over the whole vocabulary; remove it")
    if getattr(args, "enable_dp_attention", False):
        problems.append("--enable-dp-attention with --hsd-draft-kind model: SGLang's standalone "
                        "draft worker does not support DP attention; remove it")
    return problems


def hsd_flag_problems(args) -> list[str]:
    """What the ``--hsd-*`` flags read from the environment cannot honour with ``args``."""
    from sglang_hsd.sglang_plugin.draft_lookup_setting import lookup_problems

    return (request_seed_problems(args) + draft_precision_problems(args) + draft_forward_problems(args)
            + adaptive_problems(args) + catch_up_problems(args) + plan_problems()
            + lookup_problems(args, _plan_has_exit_level()))


def draft_forward_problems(args) -> list[str]:
    """A bad ``--hsd-draft-forward``, or an explicit lean forward where no draft model runs on CPU."""
    from sglang_hsd.sglang_plugin.cpu.lean_decode import LEAN_DECODE_FLAG, DraftForwardConfig

    try:
        mode = DraftForwardConfig.from_env().mode
    except ValueError as err:
        return [str(err)]
    if mode not in ("lean", "checked"):
        return []
    draft = args.speculative_draft_model_path
    if args.device != "cpu" or draft is None or resolve_draft_kind(draft) != MODEL:
        return [f"{LEAN_DECODE_FLAG} {mode}: the lean forward serves a separate draft language model "
                "(--hsd-draft-kind model) on CPU (--device cpu); remove the flag"]
    return []


def catch_up_problems(args) -> list[str]:
    """What an explicit ``--hsd-draft-catch-up on`` or ``--hsd-draft-extend tail`` cannot honour
    (the defaults turn themselves off)."""
    from sglang_hsd.sglang_plugin.adaptive_setting import AdaptiveSetting
    from sglang_hsd.sglang_plugin.draft_catch_up_setting import (
        CATCH_UP_FLAG, EXTEND_FLAG, CatchUpSetting, unsupported_reason)

    try:
        setting = CatchUpSetting.from_env()
    except ValueError as err:
        return [str(err)]
    if setting.tail and setting.tail_explicit and not setting.enabled:
        return [f"{EXTEND_FLAG} tail with {CATCH_UP_FLAG} off: the tail extend is part of the "
                f"catch-up; pass {CATCH_UP_FLAG} on or drop {EXTEND_FLAG}"]
    if not (setting.enabled and (setting.explicit or setting.tail_explicit and setting.tail)):
        return []
    if setting.tail_explicit and setting.tail and (args.speculative_eagle_topk or 1) > 1:
        return [f"{EXTEND_FLAG} tail with --speculative-eagle-topk {args.speculative_eagle_topk}: a "
                f"drafting tree round keeps SGLang's window extend; drop {EXTEND_FLAG}"]
    try:
        adaptive = AdaptiveSetting.from_env().enabled
    except ValueError:
        return []  # reported by adaptive_problems
    draft_model = (args.speculative_draft_model_path is not None
                   and resolve_draft_kind(args.speculative_draft_model_path) == MODEL)
    adaptive_off = "--hsd-adaptive off" if not adaptive else _adaptive_unsupported(args)
    reason = unsupported_reason(args.device or "cuda", draft_model, adaptive_off)
    if reason is None:
        return []
    if setting.explicit:
        return [f"{CATCH_UP_FLAG} on with {reason}; pass {CATCH_UP_FLAG} off or drop the other option"]
    return [f"{EXTEND_FLAG} tail with {reason}: the tail extend runs with the draft catch-up "
            f"only; drop {EXTEND_FLAG} or the other option"]


def plan_problems() -> list[str]:
    """What ``--hsd-plan`` cannot honour (a bad file, levels the server cannot run, runtime knobs
    it does not apply: ``exit_level_from_plan``), one message per line."""
    plan = os.environ.get(PLAN_ENV, "").strip()
    if not plan:
        return []
    try:
        exit_level_from_plan(plan)
    except ExitLevelConfigError as err:
        return str(err).splitlines()
    return []


def request_seed_problems(args) -> list[str]:
    """What ``--hsd-request-seeds on`` cannot honour: SGLang's FlashInfer sampler takes no seed
    (``auto``, the default, is then off)."""
    from sglang_hsd.sglang_plugin.request_seeds import REQUEST_SEEDS_FLAG, request_seeds_setting, sampler_takes_seeds

    try:
        setting = request_seeds_setting()
    except ValueError as err:
        return [str(err)]
    backend = getattr(args, "sampling_backend", None)
    if setting == "on" and not sampler_takes_seeds(args.device, backend):
        return [f"{REQUEST_SEEDS_FLAG} on: SGLang's {backend or 'default (flashinfer)'} sampler takes no "
                "seed; add --sampling-backend pytorch"]
    return []


def draft_precision_problems(args) -> list[str]:
    """What an explicit ``--hsd-draft-precision`` copy cannot honour (``auto`` and ``fp32`` run
    anywhere: ``auto`` keeps float32 where no copy applies)."""
    from sglang_hsd.sglang_plugin.cpu.draft_copies import DRAFT_PRECISION_FLAG, DraftPrecisionConfig

    try:
        precision = DraftPrecisionConfig.from_env().precision
    except ValueError as err:
        return [str(err)]
    if precision in ("auto", "fp32"):
        return []
    problems = []
    if args.device != "cpu":
        problems.append(f"{DRAFT_PRECISION_FLAG} {precision}: weight copies run on CPU only (--device cpu); "
                        "remove the flag")
    if args.speculative_draft_model_path is not None and resolve_draft_kind(args.speculative_draft_model_path) != MODEL:
        problems.append(f"{DRAFT_PRECISION_FLAG} {precision}: copies are for a separate draft language model "
                        "(--hsd-draft-kind model); an EAGLE-3 head may share the target's LM head; remove the flag")
    dtype = getattr(args, "dtype", None)
    if dtype not in ("float32", "float", None):
        problems.append(f"{DRAFT_PRECISION_FLAG} {precision}: the copies are built from float32 weights; "
                        f"serve with --dtype float32 (got {dtype})")
    return problems


def _adaptive_unsupported(args) -> str | None:
    """Why adaptive lengths cannot run with ``args`` and the ``--hsd-*`` environment (a GPU tree,
    an exit level), or None."""
    from sglang_hsd.sglang_plugin.adaptive_setting import unsupported_reason

    exit_layer = bool(os.environ.get(EXIT_LAYER_ENV, "").strip()) or _plan_has_exit_level()
    return unsupported_reason(args.speculative_eagle_topk or 1, exit_layer, args.device or "cuda")


def adaptive_problems(args) -> list[str]:
    """What an explicit ``--hsd-adaptive on`` cannot honour (the default turns itself off), a
    cycle that cannot run, a ``--hsd-adaptive-trace`` that cannot be written or would record
    nothing, and ``--hsd-adaptive-tuning`` values that cannot hold or would tune nothing."""
    from sglang_hsd.sglang_plugin.adaptive_setting import ADAPTIVE_FLAG, CYCLE_FLAG, TRACE_FLAG, AdaptiveSetting

    try:
        setting = AdaptiveSetting.from_env()
    except ValueError as err:
        return [str(err)]
    num_steps = args.speculative_num_steps or DEFAULT_NUM_STEPS
    problems = [problem for problem in (
        setting.cycle_problem(num_steps), setting.trace_problem(), setting.tuning_problem(num_steps))
        if problem is not None]
    forced = setting.explicit or setting.lengths_cycle is not None
    if not (setting.enabled and (forced or setting.trace_path is not None)):
        return problems
    reason = _adaptive_unsupported(args)
    if reason is None:
        return problems
    if not forced:  # the default turns itself off here: the trace would stay empty
        return problems + [f"{TRACE_FLAG} with {reason}: {ADAPTIVE_FLAG} is not applied there, nothing "
                           f"would be traced"]
    flag = f"{ADAPTIVE_FLAG} on" if setting.explicit else CYCLE_FLAG
    return problems + [f"{flag} with {reason}: adaptive budgets are built for chains and CPU trees "
                       f"without an exit level; pass {ADAPTIVE_FLAG} off or drop the other option"]
