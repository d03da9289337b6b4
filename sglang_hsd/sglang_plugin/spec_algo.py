"""``HSDSpecAlgo``: the ``--speculative-algorithm HSD`` object SGLang's scheduler talks to.

SGLang 0.5.23's plugin base class ``CustomSpecAlgo`` lacks several methods the scheduler calls on
any algorithm object (``create_future_map``, ``carries_draft_hidden_states``, ... see
``patches/0001``); ``HSDSpecAlgo`` fills them in as an EAGLE-3 family member and hands worker
creation to ``worker.hsd_worker``.

This module subclasses SGLang at import: ``register()`` imports it after checking every signature.
"""

from __future__ import annotations

from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_registry import CustomSpecAlgo

from sglang_hsd.sglang_plugin.draft_kind import EAGLE3, MODEL, current_draft_kind
from sglang_hsd.sglang_plugin.server_args import resolve_hsd_server_args

# Non-predicate methods of SpeculativeAlgorithm that SGLang calls on any algorithm object.
# SGLang's own conformance check (spec_registry._assert_custom_spec_algo_conforms) only covers
# is_* / supports_*; CustomSpecAlgo 0.5.23 misses the ones in HSDSpecAlgo below.
DUCK_TYPED_METHODS = (
    "create_future_map", "carries_draft_hidden_states", "need_topk", "get_platform_worker_cls",
    "build_disagg_draft_input", "handle_server_args", "create_worker",
    "resolve_max_speculative_num_draft_tokens", "get_num_tokens_per_req_for_target_verify",
    "has_draft_kv",
)


def create_hsd_worker(server_args):
    """The worker factory registered for HSD (``worker.hsd_worker``, imported on first use)."""
    from sglang_hsd.sglang_plugin.worker import hsd_worker

    return hsd_worker(server_args)


class HSDSpecAlgo(CustomSpecAlgo):
    """``--speculative-algorithm HSD``: verification by ``sglang_hsd.verify.verify_chain``.

    With an EAGLE-3 head it is an EAGLE-3 family member (same draft head, same scheduler
    branches); with a separate draft language model (``draft_kind.MODEL``) it answers as SGLang's
    STANDALONE does (no hidden states carried, the draft keeps its own KV cache). The kind was
    resolved with the server arguments (``draft_kind.current_draft_kind``).
    """

    def is_eagle(self) -> bool:
        return current_draft_kind() == EAGLE3

    def is_eagle3(self) -> bool:
        return current_draft_kind() == EAGLE3

    def is_standalone(self) -> bool:
        return current_draft_kind() == MODEL

    def supports_grammar_overlap(self) -> bool:
        return True  # the EAGLE V2 verify path advances the grammar itself

    def has_draft_kv(self) -> bool:
        return True

    def need_topk(self) -> bool:
        return True

    def carries_draft_hidden_states(self) -> bool:
        return self.is_eagle()

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
        return create_hsd_worker(server_args)


def check_spec_class() -> None:
    """Raise ``TypeError`` unless ``HSDSpecAlgo`` (or its base) has every duck-typed method."""
    missing = [m for m in DUCK_TYPED_METHODS if m not in vars(HSDSpecAlgo)
               and m not in vars(CustomSpecAlgo)]
    if missing:
        raise TypeError(f"HSDSpecAlgo lacks SpeculativeAlgorithm methods {missing}")
