"""``--hsd-adaptive``: each decode round's draft length chosen by ``sglang_hsd.adaptive``, in SGLang.

SGLang 0.5.23 can switch a V2 speculative worker between pre-built runtime states of different
draft lengths (``AdaptiveController`` with a policy object; its own ``--speculative-adaptive`` is
an EAGLE-only acceptance-EMA rule). The HSD workers install that controller with
:class:`HSDAdaptivePolicy`, whose decisions are ``BudgetController``'s: the length that maximises
expected tokens per second for this batch, from each request's past acceptance and this server's
measured round seconds at this batch size, 0 (plain decoding) when speculation does not pay.

Per round (:class:`AdaptiveRounds`, driven by ``verify_step.HSDVerify.forward_batch_generation``):
before a decode batch runs, the length is chosen from the requests' estimates and recorded on each
request (``meta_info["hsd_draft_budget"]``: the length of every decode round the request took part
in, returned when it finishes); the round's forward is timed, and the scheduler's time between
rounds is added as a measured overhead; after verification SGLang hands the accepted counts
(``on_verify_complete``), which update each request's estimate. ``/server_info`` ->
``internal_states[0]["hsd"]["adaptive"]`` reports the mean chosen length, the choices and the
measured milliseconds per batch bucket and length.

Lossless: the length of round n depends only on rounds before n (``sglang_hsd/adaptive.py``).

Trees (``--speculative-eagle-topk`` > 1, on CPU): the controller chooses a depth d in 0..D of the
configured shape (D, k, N), d > 0 drafting the budget ``tree_draft.budget_shapes(shape, rule)[d]``
(depth d, about d / D of the N - 1 nodes; d = D is the configured shape). Each budget is one of
SGLang's runtime states (``HSDVerify.build_adaptive_runtime_state`` gives it the budget's node
count; SGLang's own states are chains of d + 1 tokens) and the draft worker keeps one tree plan
per budget (``worker_setup.setup_sampled_trees``). A round is a chain of budgets to the
controller: it accepted the path's length of at most ``longest_path`` (min(d, N_d - 1)), so the
same per-token estimates and cost medians price depths as they price lengths. Lossless as for
chains: d is fixed before the round's tree is drawn (``verify/oracles/adaptive_tree_exact.py``).

Seeded requests: a seeded batch is verified by the coupled rule (``request_seeds.py``), whose
tokens do not depend on the draft lengths, so lengths chosen from timings keep them reproducible.

Scope: chains and CPU trees (``--speculative-eagle-topk`` > 1 on another device keeps its shape:
each budget's draft CUDA graph is untested) without an exit level. Elsewhere the
configured length is kept (an explicit ``--hsd-adaptive on`` there is refused naming the flag;
the default turns itself off and says so in the log).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from typing import TextIO

from sglang_hsd.adaptive import NO_SETUP, AcceptanceEstimate, BudgetController, DraftSetup, batch_bucket
from sglang_hsd.sglang_plugin.adaptive_setting import (ADAPTIVE_FLAG, CYCLE_FLAG, TRACE_FLAG, TUNING_FLAG,
                                                       AdaptiveSetting, unsupported_reason)

logger = logging.getLogger(__name__)

# meta_info key of a request's per-round draft lengths (a request-level customized-info key).
BUDGET_KEY = "hsd_draft_budget"
# Attribute of SGLang's Req holding its AcceptanceEstimate.
ESTIMATE_ATTR = "hsd_acceptance"
# A gap between two decode rounds longer than this many forwards is not scheduler overhead
# (new requests arrived, a prefill ran): it is not measured.
_MAX_OVERHEAD_FORWARDS = 1.0




class AdaptiveRounds:
    """The per-round bookkeeping between SGLang's worker and a ``BudgetController``.

    Args:
        controller: the policy state.
        lengths_cycle: lengths each request's rounds take in turn instead of the controller's
            choice (``AdaptiveSetting.lengths_cycle``); None: the controller chooses.
        trace: a text file opened for appending that gets one JSON line per decode round
            (``AdaptiveSetting.trace_path``): the batch, the requests' ids and rates, the owed
            setup, the chosen length, the round's measured and excluded seconds and, once SGLang
            hands them, each request's accepted drafts (so a request's rounds can be followed
            and another controller setting's estimates replayed); None: none.
        tree_budgets: for a tree, {depth d: the ``TreeShape`` a round of budget d drafts}
            (``tree_draft.budget_shapes``); a round of d counts as ``longest_path`` drafts.
            None: a chain (a round of L drafts L).
    """

    def __init__(self, controller: BudgetController, lengths_cycle: tuple[int, ...] | None = None,
                 trace: TextIO | None = None, tree_budgets: dict | None = None) -> None:
        self.controller = controller
        self.tree_budgets = tree_budgets
        self.lengths_cycle = lengths_cycle
        self.trace = trace
        self._traced: dict | None = None  # the current round's trace line, finished by end()
        self._untraced: dict | None = None  # a finished line waiting for its accepted counts
        self.length = controller.config.candidates[-1]  # SGLang starts at the configured length
        self._reqs: list = []
        self._round_length = 0
        self._started = 0.0
        self._last_end: float | None = None
        self._last_forward = 0.0
        self.overhead = 0.0  # seconds between a decode round's end and the next one's start (EMA)
        self._logged_length: int | None = None  # the last length logged (logged on change)
        # length -> request-rounds by accepted draft count (index 0..length), for /server_info.
        self.accepted_counts: dict[int, list[int]] = {}

    def begin(self, reqs, setup_seconds: float = 0.0, fixed_seconds: float = 0.0) -> int:
        """Choose the length for a decode batch of ``reqs`` (SGLang ``Req`` s) that must spend
        ``setup_seconds`` + ``fixed_seconds`` (a draft-cache catch-up: the part that scales
        with its rows, the part it costs however few) before it drafts; returns it."""
        started = time.perf_counter()
        self._write_trace()  # a round whose accepted counts never came
        if self._last_end is not None:
            gap = started - self._last_end
            if gap <= _MAX_OVERHEAD_FORWARDS * max(self._last_forward, 1e-3):
                self.overhead = gap if self.overhead == 0.0 else 0.8 * self.overhead + 0.2 * gap
        if self.lengths_cycle is not None:
            # Each request follows the cycle from its own first decode round (the batch from
            # its youngest request), so a request's lengths do not depend on other traffic.
            rounds_taken = min(len((req.customized_info or {}).get(BUDGET_KEY, ())) for req in reqs)
            self.length = self.lengths_cycle[rounds_taken % len(self.lengths_cycle)]
        else:
            rates = [self.controller.request_rate(_estimate(req)) for req in reqs]
            setup = NO_SETUP if setup_seconds + fixed_seconds <= 0 else DraftSetup(
                setup_seconds, sum(_remaining_tokens(req) for req in reqs) / len(reqs), fixed_seconds)
            self.length = self.controller.choose(rates, len(reqs), setup)
            if self.trace is not None:
                self._traced = {"t": round(started, 4), "batch": len(reqs),
                                "rids": [str(getattr(req, "rid", "")) for req in reqs],
                                "rates": [round(r, 4) for r in rates],
                                "setup_s": round(setup.seconds, 5), "fixed_s": round(setup.fixed_seconds, 5),
                                "remaining": None if math.isinf(setup.remaining_tokens) else setup.remaining_tokens,
                                "length": self.length,
                                "speeds": {str(length): round(speed, 3) for length, speed in
                                           self.controller.speeds(batch_bucket(len(reqs)), rates,
                                                                  setup).items()}}
        for req in reqs:
            if req.customized_info is None:
                req.customized_info = {}
            req.customized_info.setdefault(BUDGET_KEY, []).append(self.length)
        if self.length != self._logged_length:
            logger.info("sglang-hsd adaptive: batch %d -> draft length %d (server accept rate %.2f)",
                        len(reqs), self.length, self.controller.server_rate)
            self._logged_length = self.length
        self._reqs, self._round_length = list(reqs), self.length
        self._started = time.perf_counter()
        return self.length

    def end(self, excluded: float = 0.0) -> None:
        """The round's forward finished: its seconds (plus the measured overhead, less
        ``excluded`` seconds of one-time work inside it) are observed. The draft-cache catch-up
        is excluded: its cost depends on how many plain rounds came before, not on the length,
        and one large catch-up must not make a length look dear at this batch size."""
        now = time.perf_counter()
        self._last_forward = now - self._started
        self._last_end = now
        if self._reqs:
            self.controller.observe_round(len(self._reqs), self._round_length,
                                          max(self._last_forward - excluded, 0.0) + self.overhead)
        if self._traced is not None:
            self._traced.update(seconds=round(self._last_forward, 5), excluded=round(excluded, 5))
            self._untraced, self._traced = self._traced, None

    def _write_trace(self, accepted: list[int] | None = None) -> None:
        """Append the last finished round's trace line, with ``accepted`` (per request) if given."""
        if self._untraced is None:
            return
        if accepted is not None:
            self._untraced["accepted"] = accepted
        self.trace.write(json.dumps(self._untraced) + "\n")
        self.trace.flush()
        self._untraced = None

    def interrupt(self) -> None:
        """A non-decode forward ran: the next gap is not scheduler overhead."""
        self._write_trace()
        self._last_end = None

    def verified(self, num_correct_drafts_per_req: list[int]) -> None:
        """SGLang's accepted draft counts of the last decode round, in its requests' order."""
        reqs, length = self._reqs, self._round_length
        if length > 0 and self.tree_budgets is not None:
            length = self.tree_budgets[length].longest_path  # the most the round could accept
        if len(num_correct_drafts_per_req) != len(reqs):
            self._write_trace()
            return
        self._write_trace([min(int(correct), length) for correct in num_correct_drafts_per_req])
        memory = self.controller.config.memory
        if length == 0:
            for req in reqs:
                _estimate(req).observe(0, 0, memory)  # discounts its drafted rounds
            return
        accepted = rejections = 0
        counts = self.accepted_counts.setdefault(length, [0] * (length + 1))
        stops = []
        for req, correct in zip(reqs, num_correct_drafts_per_req):
            correct = min(int(correct), length)
            counts[correct] += 1
            _estimate(req).observe(length, correct, memory)
            accepted += correct
            rejections += correct < length
            stops.append((length, correct))
        self.controller.observe_rates(accepted, len(reqs), rejections)
        self.controller.observe_stops(stops)

    def as_dict(self) -> dict:
        state = self.controller.as_dict()
        if self.tree_budgets is not None:
            state["tree_budgets"] = {str(depth): str(shape) for depth, shape in self.tree_budgets.items()}
        state.update(enabled=True, current_steps=self.length, lengths_cycle=self.lengths_cycle,
                     overhead_ms=round(1000 * self.overhead, 2),
                     accepted_drafts_by_length={str(length): list(counts) for length, counts
                                                in sorted(self.accepted_counts.items())})
        return state


def _estimate(req) -> AcceptanceEstimate:
    estimate = getattr(req, ESTIMATE_ATTR, None)
    if estimate is None:
        estimate = AcceptanceEstimate()
        setattr(req, ESTIMATE_ATTR, estimate)
    return estimate


def _remaining_tokens(req) -> float:
    """Tokens ``req`` may still generate (its max_new_tokens less its output; inf without a
    limit), at least 1."""
    limit = getattr(req.sampling_params, "max_new_tokens", None)
    if limit is None:
        return math.inf
    return float(max(limit - len(req.output_ids), 1))


class HSDAdaptivePolicy:
    """SGLang's ``AdaptiveSpecPolicy`` protocol over :class:`AdaptiveRounds`: the state for a
    batch is the length ``AdaptiveRounds.begin`` chose for it; SGLang's accepted counts go to
    ``AdaptiveRounds.verified``."""

    def __init__(self, rounds: AdaptiveRounds) -> None:
        self.rounds = rounds
        self._cuda_graph_bs: list[int] | None = None

    @property
    def candidate_steps(self) -> list[int]:
        return list(self.rounds.controller.config.candidates)

    def set_cuda_graph_bs(self, cuda_graph_bs: list[int] | None) -> None:
        self._cuda_graph_bs = sorted(cuda_graph_bs) if cuda_graph_bs else None

    def cuda_graph_bs_for_step(self, step: int) -> list[int] | None:
        return self._cuda_graph_bs

    def get_steps_for_batch(self, batch_size: int) -> int:
        return self.rounds.length

    def on_verify_complete(self, num_correct_drafts_per_req: list[int], batch_size: int) -> int | None:
        self.rounds.verified(num_correct_drafts_per_req)
        return None  # the switch happens when the next batch is activated


def install_adaptive(worker, setting: AdaptiveSetting, topk: int, exit_layer: bool,
                     tree_rule: str | None = None) -> AdaptiveRounds | None:
    """Give an HSD V2 worker (after SGLang's ``__init__``, before ``init_cuda_graphs``) SGLang's
    ``AdaptiveController`` driven by ``BudgetController`` over lengths (chains) or tree depths
    (``topk`` > 1, budgets of ``tree_rule``, kept on the worker as ``hsd_tree_budgets``)
    0..``speculative_num_steps``; None when off or unsupported (logged)."""
    if not setting.enabled:
        logger.info("sglang-hsd: %s off: every round drafts %d tokens", ADAPTIVE_FLAG,
                    worker.speculative_num_steps)
        return None
    reason = unsupported_reason(topk, exit_layer, str(worker.device))
    if reason is not None:
        logger.info("sglang-hsd: %s not applied with %s", ADAPTIVE_FLAG, reason)
        return None
    if getattr(worker, "_draft_worker", None) is None:
        return None  # a pipeline stage without the draft
    from sglang.srt.speculative.adaptive_runtime_state import AdaptiveController

    problem = setting.cycle_problem(worker.speculative_num_steps)
    if problem is not None:
        raise ValueError(problem)
    trace = None
    if setting.trace_path is not None:
        trace = open(os.path.expanduser(setting.trace_path), "a", encoding="utf-8")  # noqa: SIM115 (the server's lifetime)
        logger.info("sglang-hsd: %s: one line per decode round in %s", TRACE_FLAG, setting.trace_path)
    budgets = None
    if topk > 1:
        budgets = tree_budgets(worker, tree_rule)
        worker.hsd_tree_budgets = budgets
        logger.info("sglang-hsd: %s: tree budgets by depth %s", ADAPTIVE_FLAG,
                    ", ".join(f"{depth}: {shape}" for depth, shape in budgets.items()))
    rounds = AdaptiveRounds(BudgetController(setting.config(worker.speculative_num_steps)),
                            setting.lengths_cycle, trace, budgets)
    if setting.tuning:
        logger.info("sglang-hsd: %s: %s", TUNING_FLAG, ", ".join(f"{k}={v}" for k, v in setting.tuning))
    worker.adaptive_controller = AdaptiveController(worker, HSDAdaptivePolicy(rounds))
    if setting.lengths_cycle is not None:
        logger.info("sglang-hsd: %s: rounds take the lengths %s in turn", CYCLE_FLAG,
                    list(setting.lengths_cycle))
    else:
        logger.info("sglang-hsd: %s on: draft lengths %s chosen per round from measured costs and "
                    "acceptance", ADAPTIVE_FLAG, list(rounds.controller.config.candidates))
    return rounds


def tree_budgets(worker, rule: str | None) -> dict:
    """{depth: ``TreeShape``} of the worker's configured tree under ``rule`` (a key of
    ``tree_draft.LEVEL_RULES``); the deepest must be the configured shape (SGLang registers
    that state itself, with the configured node count)."""
    from sglang_hsd.tree_draft import DEFAULT_LEVEL_RULE, TreeShape, budget_shapes

    shape = TreeShape(worker.speculative_num_steps, worker.topk, worker.speculative_num_draft_tokens)
    budgets = budget_shapes(shape, rule or DEFAULT_LEVEL_RULE)
    if budgets[shape.depth] != shape:
        raise ValueError(f"{ADAPTIVE_FLAG}: the tree {shape} keeps {budgets[shape.depth].budget} nodes "
                         f"under --hsd-tree-rule {rule}; lower --speculative-num-draft-tokens")
    return budgets


def install_request_level_key() -> None:
    """SGLang's output streamer emits ``BUDGET_KEY`` once per request (when it finishes), not
    sliced per token. Idempotent."""
    from sglang.srt.managers.scheduler_components.output_streamer import SchedulerOutputStreamer

    original = SchedulerOutputStreamer.__dict__["is_request_level_customized_info_key"]
    if getattr(original, "__sglang_hsd_original__", None) is not None:
        return

    def is_request_level_customized_info_key(self, key: str) -> bool:
        return key == BUDGET_KEY or original(self, key)

    is_request_level_customized_info_key.__sglang_hsd_original__ = original
    SchedulerOutputStreamer.is_request_level_customized_info_key = is_request_level_customized_info_key
