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
* ``--hsd-verify-method {hsd,tokenwise}`` on the launcher's parser (``config.py``).

CPU-only machines also need ``cpu_shims`` installed before SGLang is imported; put
``BOOTSTRAP_DIR`` on ``PYTHONPATH`` (see ``_bootstrap/sitecustomize.py``).
"""

from __future__ import annotations

import argparse
import logging
import os

from sglang_hsd.sglang_plugin.config import (
    ALGORITHM_NAME,
    SERVER_VERIFY_METHODS,
    VERIFY_METHOD_ENV,
    PluginConfig,
)

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

            PluginConfig.from_env()  # refuse a bad SGLANG_HSD_VERIFY_METHOD before loading models
            return build_worker_classes()[0]

    missing = [m for m in DUCK_TYPED_METHODS if m not in vars(HSDSpecAlgo)
               and m not in vars(CustomSpecAlgo)]
    if missing:
        raise TypeError(f"HSDSpecAlgo lacks SpeculativeAlgorithm methods {missing}")
    return HSDSpecAlgo


class _VerifyMethodAction(argparse.Action):
    """``--hsd-verify-method``: stored in the environment so spawned schedulers see it."""

    def __call__(self, parser, namespace, values, option_string=None):
        os.environ[VERIFY_METHOD_ENV] = values


def _extend_cli(server_args_cls) -> None:
    original = server_args_cls.__dict__["add_cli_args"].__func__

    def add_cli_args(parser):
        original(parser)
        if "--hsd-verify-method" not in parser._option_string_actions:
            parser.add_argument(
                "--hsd-verify-method", choices=SERVER_VERIFY_METHODS, action=_VerifyMethodAction,
                dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                help="sglang-hsd: chain verifier for --speculative-algorithm HSD "
                     f"(default hsd; also settable as {VERIFY_METHOD_ENV})",
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

    if is_cpu():  # SGLang's draft sampler calls a Triton argmax kernel; torch's on CPU
        original = spec_utils.row_argmax
        spec_utils.row_argmax = verify_hook.torch_row_argmax
        spec_utils.row_argmax.__sglang_hsd_original__ = original
    _extend_cli(ServerArgs)


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
