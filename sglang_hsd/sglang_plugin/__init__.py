"""SGLang plugin: ``python -m sglang.launch_server --speculative-algorithm HSD ...``.

Loaded by SGLang from the ``sglang.srt.plugins`` entry point (``hsd``) in every process it
starts. ``register()`` is idempotent, imports SGLang only when called, checks the signature of
every SGLang symbol it subclasses or replaces (``signatures.py``) and refuses loudly on drift.

What it installs:
* the ``HSD`` algorithm (``SpeculativeAlgorithm.register``) with ``HSDSpecAlgo``: an EAGLE-3
  family member that fills in the methods SGLang 0.5.23's ``CustomSpecAlgo`` lacks;
* ``HSDWorker`` (``worker.py``): the EAGLE-3 V2 worker with sampled drafts whose full q is
  scattered to the target vocabulary;
* ``verify_hook.py``: our chain verifier behind SGLang's own verify entry point;
* ``--hsd-verify-method {hsd,tokenwise}``, ``--hsd-exit-layer L``, ``--hsd-exit-heads DIR|none``,
  ``--hsd-exit-method``, ``--hsd-exit-buffer N``, ``--hsd-plan plan.json`` on the launcher's
  parser (``config.py``);
* with an exit layer, an intermediate early-exit verifier level (``exit_level.py``).

CPU-only machines also need ``cpu_shims`` installed before SGLang is imported; put
``BOOTSTRAP_DIR`` on ``PYTHONPATH`` (see ``_bootstrap/sitecustomize.py``).
"""

from __future__ import annotations

import argparse
import logging
import os

from sglang_hsd.sglang_plugin.config import (
    ALGORITHM_NAME,
    EXIT_BUFFER_ENV,
    EXIT_HEADS_ENV,
    EXIT_LAYER_ENV,
    EXIT_METHOD_ENV,
    PLAN_ENV,
    VERIFY_METHOD_ENV,
    ExitLevelConfig,
    PluginConfig,
)
from sglang_hsd.verify import LOSSLESS_CHAIN_METHODS

logger = logging.getLogger(__name__)

BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bootstrap")
_REGISTERED = False

# Non-predicate methods of SpeculativeAlgorithm that SGLang calls on any algorithm object.
# SGLang's own conformance check (spec_registry._assert_custom_spec_algo_conforms) only covers
# is_* / supports_*; CustomSpecAlgo 0.5.23 misses the ones in HSDSpecAlgo below.
DUCK_TYPED_METHODS = (
    "create_future_map", "carries_draft_hidden_states", "need_topk", "get_platform_worker_cls",
    "build_disagg_draft_input", "handle_server_args", "create_worker",
    "resolve_max_speculative_num_draft_tokens", "get_num_tokens_per_req_for_target_verify",
    "has_draft_kv",
)


def _build_spec_class():
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import CustomSpecAlgo

    from sglang_hsd.sglang_plugin.server_args import resolve_hsd_server_args

    class HSDSpecAlgo(CustomSpecAlgo):
        """``--speculative-algorithm HSD``: an EAGLE-3 family member (same draft head, same
        scheduler branches) whose verification is ``sglang_hsd.verify.verify_chain``."""

        def is_eagle(self) -> bool:
            return True

        def is_eagle3(self) -> bool:
            return True

        def supports_grammar_overlap(self) -> bool:
            return True  # the EAGLE V2 verify path advances the grammar itself

        def has_draft_kv(self) -> bool:
            return True

        def need_topk(self) -> bool:
            return True

        def carries_draft_hidden_states(self) -> bool:
            return True

        def create_future_map(self, device, req_to_token_pool, needs_cpu_seq_lens=True,
                              needs_confidence_relay=False):
            return SpeculativeAlgorithm.create_future_map(
                self, device, req_to_token_pool, needs_cpu_seq_lens, needs_confidence_relay
            )

        def build_disagg_draft_input(self, batch, last_tokens_tensor, future_map):
            return SpeculativeAlgorithm.build_disagg_draft_input(
                self, batch, last_tokens_tensor, future_map
            )

        def get_platform_worker_cls(self):
            from sglang.srt.platforms import current_platform

            if current_platform.is_out_of_tree():
                raise NotImplementedError(
                    "HSD runs on SGLang's built-in CUDA/CPU platforms only, not on out-of-tree "
                    f"platform {type(current_platform).__name__}"
                )
            return None

        def handle_server_args(self, server_args) -> None:
            resolve_hsd_server_args(server_args)

        def create_worker(self, server_args):
            from sglang_hsd.sglang_plugin.worker import build_worker_classes

            # Refuse bad --hsd-* options before loading models.
            ExitLevelConfig.from_env(PluginConfig.from_env().verify_method)
            return build_worker_classes()[0]

    missing = [m for m in DUCK_TYPED_METHODS if m not in vars(HSDSpecAlgo)
               and m not in vars(CustomSpecAlgo)]
    if missing:
        raise TypeError(f"HSDSpecAlgo lacks SpeculativeAlgorithm methods {missing}")
    return HSDSpecAlgo


class _EnvAction(argparse.Action):
    """An ``--hsd-*`` flag stored in the environment variable ``self.const``, so spawned
    scheduler processes see it (ServerArgs is a closed dataclass)."""

    def __call__(self, parser, namespace, values, option_string=None):
        os.environ[self.const] = str(values)


# (flag, environment variable, argparse extras, help)
HSD_FLAGS = (
    ("--hsd-verify-method", VERIFY_METHOD_ENV, {"choices": LOSSLESS_CHAIN_METHODS},
     "chain verifier of the target level (default hsd)"),
    ("--hsd-exit-layer", EXIT_LAYER_ENV, {"type": int},
     "add an early-exit verifier level: the target's first L layers plus an exit head verify "
     "the EAGLE-3 drafts, the remaining layers run only for the positions it accepted"),
    ("--hsd-exit-heads", EXIT_HEADS_ENV, {},
     "folder of trained exit heads (sglang_hsd.exit_heads) or 'none' for the logit lens "
     "(default none)"),
    ("--hsd-exit-method", EXIT_METHOD_ENV, {"choices": LOSSLESS_CHAIN_METHODS},
     "chain verifier of the exit level (default: --hsd-verify-method)"),
    ("--hsd-exit-buffer", EXIT_BUFFER_ENV, {"type": int},
     "N_i: provisional tokens the exit level accumulates (exit sub-rounds inside one verify "
     "window of --speculative-num-steps + 1 positions) before the full target verifies them "
     "(default 1: one exit sub-round per round)"),
    ("--hsd-plan", PLAN_ENV, {},
     "take the exit layer and its buffer from a `sglang-hsd plan` JSON (its one intermediate "
     "exit level)"),
)


def _extend_cli(server_args_cls) -> None:
    original = server_args_cls.__dict__["add_cli_args"].__func__

    def add_cli_args(parser):
        original(parser)
        for flag, env, extras, text in HSD_FLAGS:
            if flag not in parser._option_string_actions:
                parser.add_argument(
                    flag, action=_EnvAction, const=env, dest=argparse.SUPPRESS,
                    default=argparse.SUPPRESS,
                    help=f"sglang-hsd (--speculative-algorithm HSD): {text}; also settable as {env}",
                    **extras,
                )

    add_cli_args.__sglang_hsd_original__ = original
    server_args_cls.add_cli_args = staticmethod(add_cli_args)


def _install_patches() -> None:
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.speculative import eagle_utils, spec_utils

    from sglang_hsd.sglang_plugin import verify_hook

    eagle_utils.chain_speculative_sampling_triton = verify_hook.make_hsd_chain_sampling(
        eagle_utils.chain_speculative_sampling_triton)
    eagle_utils._verify_uses_greedy = verify_hook.make_verify_uses_greedy(
        eagle_utils._verify_uses_greedy)
    from sglang.srt.utils import is_cpu

    if eagle_utils.top_k_renorm_prob is None or eagle_utils.top_p_renorm_prob is None:
        from sglang_hsd.sglang_plugin import cpu_sampling  # no renorm kernels on this platform

        eagle_utils.top_k_renorm_prob = eagle_utils.top_k_renorm_prob or cpu_sampling.top_k_renorm_prob
        eagle_utils.top_p_renorm_prob = eagle_utils.top_p_renorm_prob or cpu_sampling.top_p_renorm_prob
    if is_cpu():  # SGLang's draft sampler calls a Triton argmax kernel; torch's on CPU
        original = spec_utils.row_argmax
        spec_utils.row_argmax = verify_hook.torch_row_argmax
        spec_utils.row_argmax.__sglang_hsd_original__ = original
    _extend_cli(ServerArgs)
    _extend_internal_state()


def _extend_internal_state() -> None:
    """``/server_info`` -> ``internal_states[]`` gains ``hsd``: per-level statistics of the exit
    level (when configured) and the KV pool's free slots (for leak checks)."""
    from sglang.srt.managers.scheduler_components.internal_state import (
        SchedulerInternalStateController as controller,
    )

    original = controller.__dict__["_add_speculative"]
    if getattr(original, "__sglang_hsd_original__", None) is not None:
        return

    def _add_speculative(self, state):
        original(self, state)
        scheduler = self.scheduler
        if not hsd_is_active_for(scheduler):
            return
        state["hsd"] = hsd_internal_state(scheduler)

    _add_speculative.__sglang_hsd_original__ = original
    controller._add_speculative = _add_speculative


def hsd_is_active_for(scheduler) -> bool:
    algorithm = getattr(scheduler, "spec_algorithm", None)
    return algorithm is not None and str(getattr(algorithm, "name", algorithm)).upper() == ALGORITHM_NAME


def hsd_internal_state(scheduler) -> dict:
    """The ``hsd`` entry of a scheduler's internal state."""
    worker = getattr(scheduler, "draft_worker", None)
    exit_level = getattr(worker, "hsd_exit", None)
    allocator = scheduler.token_to_kv_pool_allocator
    state = {
        "kv_available_size": int(allocator.available_size()),
        "kv_evictable_size": int(scheduler.tree_cache.evictable_size()),
        "max_total_num_tokens": int(scheduler.max_total_num_tokens),
        "exit_layer": None if exit_level is None else exit_level.exit_layer,
    }
    if exit_level is not None:
        state["levels"] = exit_level.stats.as_dict()
        state["max_split_logit_diff"] = exit_level.max_split_logit_diff
    return state


def register() -> None:
    """Register ``HSD`` with SGLang. Safe to call any number of times, in any process."""
    global _REGISTERED
    if _REGISTERED:
        return
    from sglang_hsd.sglang_plugin.signatures import check_all_signatures

    check_all_signatures()  # before touching anything: refuse on any drift
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import get_spec

    from sglang_hsd.sglang_plugin.server_args import validate_hsd_server_args

    if get_spec(ALGORITHM_NAME) is None:
        spec_class = _build_spec_class()
        SpeculativeAlgorithm.register(
            ALGORITHM_NAME, supports_overlap=True,
            validate_server_args=validate_hsd_server_args, spec_class=spec_class,
        )(_worker_factory)
    _install_patches()
    _REGISTERED = True
    logger.info("sglang-hsd: registered speculative algorithm %s", ALGORITHM_NAME)


def _worker_factory(server_args):
    from sglang_hsd.sglang_plugin.worker import build_worker_classes

    return build_worker_classes()[0]


__all__ = ["register", "BOOTSTRAP_DIR", "ALGORITHM_NAME"]
