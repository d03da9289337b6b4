"""``--hsd-draft-catch-up``: a round that drafts nothing skips the draft model's extend; the
draft model catches up, in one batched extend, when a later round drafts again.

With ``--hsd-adaptive`` a round may draft L = 0 tokens (plain decoding: the target verifies the
committed token alone). SGLang's STANDALONE round still runs the draft model's extend over the
newly committed token, so its KV cache stays current for later rounds; on CPU that extend costs
a sixth of a plain decode step at batch 1 and more than a third at batch 8, exactly where the
controller chose L = 0 because speculation does not pay. :class:`DraftCatchUp` skips it:

* an L = 0 round leaves the draft cache as it is and marks each of its requests with the first
  position the draft cache lacks (``STALE_ATTR`` on SGLang's ``Req``; a request keeps its first
  mark across several L = 0 rounds); the round's next-draft input gets zero stubs of the usual
  shapes, which no round reads before they are replaced (an L = 0 round reads only the bonus
  token, a drafting round runs the catch-up first);
* the next round with L > 0 runs, before its first draft step, one EXTEND forward of the draft
  model over every marked request's missing positions (per-request prefix lengths: a request
  missing positions s..n-1 runs n - s rows, the others none), writing their draft KV into the
  slots the target already holds for them, and samples each such request's first draft from the
  last row exactly as SGLang's decode-time draft extend does (``sample_draft_proposal`` with the
  request's temperature and top-k; a greedy request's top-k of 1 proposes the argmax);
* a prefill (a new or re-admitted request) skips the draft model's prefill too: the request is
  marked from the first position its draft cache lacks, so a request that never drafts (a batch
  where the controller keeps L = 0) never pays for the draft's prefill, and one that drafts pays
  it in its first catch-up (the controller weighs that cost, ``pending_seconds``, against what
  drafting would gain over the request's remaining tokens).

Which KV slots hold the draft's KV is tracked per slot (``_valid``, bool over the pool's slots):
a deferred prefill and a skipped extend clear the slots they leave without draft KV, a catch-up
and a drafting round's extend set the slots they write. A prefill whose prefix comes from the
radix cache is marked from the first cached position whose slot lacks draft KV (a finished
request that never drafted left its whole sequence without it), so a later request sharing that
prefix catches it up instead of drafting from whatever those slots held. Every path that gives
a committed position a slot (prefill, L = 0 round, drafting round's extend, catch-up) sets or
clears its flag, so the flags of a sequence's slots are exact.

Which rows each extend runs, and the draft KV layout: ``draft_cache_rows.py``.

Lossless whatever the draft cache holds: every draft still reaches the verifier with the q it
was drawn from. What the catch-up must get right is acceptance, i.e. that the cache it leaves is
the one the skipped extends would have left: ``tests/sglang_plugin/test_draft_catch_up_server.py``
serves the same forced schedule of lengths with and without it and compares per-request rounds
at T = 0, plus greedy equality and the T = 1 law.

After a drafting chain round (``--hsd-draft-extend tail``, the default wherever the catch-up
runs) the draft extend runs only the one or two entries per request the round's draft steps did
not write (``draft_cache_rows.tail_plan``), where SGLang's reruns the whole verify window. It runs
at once, inside the round, by the same batched forward as a catch-up (its first draft sampled
the same way), so the round's measured cost includes it and the controller owes nothing for it;
``tests/sglang_plugin/test_draft_tail_extend_server.py`` compares it with ``window`` (SGLang's
extend) round by round.

Scope: a separate draft language model (``--hsd-draft-kind model``: its extend reads tokens only;
an EAGLE-3 head would need the target's hidden states of the skipped positions), on CPU (no
overlap scheduler, no draft CUDA graph, both of which bypass the hooks used here), with
``--hsd-adaptive`` on. For a tree (``--speculative-eagle-topk`` > 1) the catch-up gives each
caught-up request the next root SGLang's skipped extend would have recorded (``_tree_roots``: the
root q of ``tree_draft.RootQHook``'s transform, SGLang's top-k for its greedy tree); a drafting
tree round keeps SGLang's window extend (the tail extend is for chains; an explicit
``--hsd-draft-extend tail`` with a tree is refused). Elsewhere the default turns itself off
(logged); an explicit ``on`` is refused before models load, naming the flag.

"""

from __future__ import annotations

import logging
import time

import torch

from sglang_hsd.sglang_plugin.draft_cache_rows import STALE_ATTR, CatchUpPlan, stale_plan, tail_plan
from sglang_hsd.sglang_plugin.draft_catch_up_setting import (
    CATCH_UP_FLAG, EXTEND_FLAG, CatchUpSetting, unsupported_reason)

logger = logging.getLogger(__name__)

# Catch-ups of at least this many rows price pending ones (smaller ones cost mostly their fixed
# part: one pass over the draft's weights).
LARGE_CATCH_UP = 32


class DraftCatchUp:
    """Skips the draft extend of rounds that draft nothing and catches the draft cache up later.

    Driven by the HSD worker (``begin_round`` / ``end_round`` around each decode round) and its
    draft worker (``skip_extend`` or, after a drafting round, ``mark_extended`` in the decode-time
    extend, ``defer_prefill`` instead of the prefill-time one, ``run`` before the first draft
    step). See the module docstring.

    Args:
        device: where the batch's tensors live.
        tail: after a drafting chain round, extend only the positions its draft steps did not
            write (``extend_tail``; ``--hsd-draft-extend tail``) instead of SGLang's window.
        topk: k, children per tree node (``--speculative-eagle-topk``; 1: a chain). A tree's
            caught-up requests get their next root (``_tree_roots``), k wide.
        temperature_scale: the draft temperature scale of a tree's root q
            (``--hsd-draft-temperature-scale``, as ``tree_draft.RootQHook`` applies it).
    """

    def __init__(self, device, tail: bool = True, topk: int = 1, temperature_scale: float = 1.0) -> None:
        self.device = device
        self.tail = tail
        self.topk = topk
        self.temperature_scale = temperature_scale
        self._skip = False
        self._plan: CatchUpPlan | None = None
        self._template = None  # the round's draft DECODE ForwardBatch (a tail extend's template)
        # Reported in /server_info.
        self.tail_extends = 0  # drafting rounds whose extend ran only the tail
        self.tail_rows = 0  # rows those tail extends ran
        self.window_rows = 0  # rows SGLang's window extends would have run instead
        self.tail_seconds = 0.0  # their forwards and sampling (inside the rounds' own cost)
        self.skipped_extends = 0  # L = 0 rounds whose extend was skipped
        self.skipped_rows = 0  # request-rounds those extends would have run
        self.deferred_prefills = 0  # prefill batches whose draft prefill was skipped
        self.deferred_rows = 0  # prompt rows those draft prefills would have run
        self.catch_ups = 0  # extends run to catch up
        self.caught_up_tokens = 0  # rows they ran
        self.seconds = 0.0  # their forwards and sampling
        self._large_rows = 0  # rows and seconds of catch-ups of at least LARGE_CATCH_UP rows,
        self._large_seconds = 0.0  # whose cost per row prices a pending catch-up
        self._small = [0, 0, 0.0]  # count, rows and seconds of smaller ones: the fixed part
        self._valid: torch.Tensor | None = None  # bool [slots]: the slot holds the draft's KV

    # -- the round, from the HSD worker ------------------------------------------------------

    def begin_round(self, batch, length: int) -> None:
        """A decode round of ``batch`` (SGLang ``ScheduleBatch``) drafting ``length`` tokens is
        about to run: L = 0 will skip its extend; L > 0 plans the catch-up of marked requests."""
        self._skip = length == 0
        self._plan = None if self._skip else stale_plan(batch, self.device)

    def end_round(self) -> None:
        self._skip = False
        self._plan = None
        self._template = None

    # -- the draft worker's hooks ------------------------------------------------------------

    def skip_extend(self, batch, batch_result) -> bool:
        """In the decode-time draft extend: True (and the round's requests marked, its next-draft
        input stubbed) when this round drafted nothing."""
        if not self._skip or batch.forward_mode.is_idle():
            return False
        for req, committed in zip(batch.reqs, batch.seq_lens.tolist()):
            if getattr(req, STALE_ATTR, None) is None:
                # Before this round the draft cache held positions < committed; the extend
                # would have written position committed (reading the new bonus token).
                setattr(req, STALE_ATTR, int(committed))
        table = batch.req_to_token_pool.req_to_token
        self._set(table[batch.req_pool_indices.to(torch.int64), batch.seq_lens.to(torch.int64)],
                  False)
        _stub_next_draft_input(batch_result.next_draft_input, batch.spec_info, len(batch.reqs), self.topk)
        self.skipped_extends += 1
        self.skipped_rows += len(batch.reqs)
        return True

    def mark_extended(self, batch, accept_lens: torch.Tensor) -> None:
        """After a drafting round's draft extend: it wrote positions n .. n + a of each
        request (n: ``batch.seq_lens`` before the round, a + 1: ``accept_lens`` [B])."""
        if batch.forward_mode.is_idle():
            return
        offsets = torch.arange(int(accept_lens.max()), device=accept_lens.device)
        positions = batch.seq_lens.to(torch.int64).unsqueeze(-1) + offsets  # [B, max a + 1]
        keep = offsets < accept_lens.to(torch.int64).unsqueeze(-1)
        rows = batch.req_pool_indices.to(torch.int64).unsqueeze(-1).expand_as(positions)
        self._set(batch.req_to_token_pool.req_to_token[rows[keep], positions[keep]], True)

    def defer_prefill(self, batch, next_token_ids: torch.Tensor, vocab: int):
        """In the prefill-time draft extend: skip it. Marks each request from the first
        position its draft cache lacks and clears the prefill's slots (module docstring);
        returns the next-draft input (SGLang ``EagleDraftInput``) with zero stubs of the usual
        shapes (``vocab``: q's width), which ``run`` replaces before any draft reads them."""
        from sglang.srt.speculative.eagle_info import EagleDraftInput

        self._set(batch.out_cache_loc, False)
        valid = self._slots()
        table = batch.req_to_token_pool.req_to_token
        for req, pool_row, prefix in zip(batch.reqs, batch.req_pool_indices.tolist(),
                                         batch.prefix_lens):
            missing = (~valid[table[pool_row, :prefix].to(torch.int64)]).nonzero()
            setattr(req, STALE_ATTR, int(missing[0, 0]) if missing.numel() else int(prefix))
        self.deferred_prefills += 1
        self.deferred_rows += int(sum(batch.extend_lens))
        return EagleDraftInput(
            **_zero_stubs(len(batch.reqs), vocab, next_token_ids.device, self.topk), hidden_states=None,
            bonus_tokens=next_token_ids, num_tokens_per_req=1, num_tokens_for_logprob_per_req=1)

    def pending_seconds(self, batch) -> tuple[float, float]:
        """What catching up ``batch``'s marked requests would cost now, as (the part that
        scales with rows, the fixed part): their missing rows times the cost per row of past
        large catch-ups (0 before one ran), and what past small catch-ups cost beyond their
        rows at that price (0 before one ran; 0 when nothing is missing)."""
        if self._large_rows == 0:
            return 0.0, 0.0
        rows = 0
        for req, committed in zip(batch.reqs, batch.seq_lens.tolist()):
            stale = getattr(req, STALE_ATTR, None)
            if stale is not None:
                rows += max(int(committed) - stale, 0)
        if rows == 0:
            return 0.0, 0.0
        per_row = self._large_seconds / self._large_rows
        count, small_rows, small_seconds = self._small
        fixed = max(small_seconds - per_row * small_rows, 0.0) / count if count else 0.0
        return rows * per_row, fixed

    @torch.no_grad()
    def run(self, draft_worker, forward_batch) -> None:
        """Before the first draft step of a round (``forward_batch``: the draft model's DECODE
        batch, B requests): run the planned catch-up and put each caught-up request's first-draft
        proposal into the round's draft input (``forward_batch.spec_info``). The batch is kept
        until ``end_round`` as the template of the round's tail extend (``extend_tail``)."""
        plan, self._plan = self._plan, None
        if forward_batch.forward_mode.is_idle():
            return
        self._template = forward_batch
        if plan is None:
            return
        started = time.perf_counter()
        spec_info = forward_batch.spec_info
        logits = self._extend(draft_worker, plan)
        if self.topk == 1:
            probs, p, ids = self._first_drafts(logits, plan, forward_batch.sampling_info)
        else:
            probs, p, ids = self._tree_roots(logits, plan, forward_batch.sampling_info)
        if spec_info.draft_probs is not None:  # a stock (topk) tree's draft input carries no q
            spec_info.draft_probs = spec_info.draft_probs.index_copy(
                0, plan.rows, probs.to(spec_info.draft_probs.dtype))
        spec_info.topk_p = spec_info.topk_p.index_copy(0, plan.rows, p.to(spec_info.topk_p.dtype))
        spec_info.topk_index = spec_info.topk_index.index_copy(
            0, plan.rows, ids.to(spec_info.topk_index.dtype))
        for req in plan.reqs:
            setattr(req, STALE_ATTR, None)
        self._set(plan.out_cache_loc, True)
        self.record(int(plan.input_ids.numel()), time.perf_counter() - started)

    @torch.no_grad()
    def extend_tail(self, draft_worker, batch, batch_result) -> bool:
        """In the decode-time draft extend of a drafting chain round: extend the draft cache over
        the positions the round's draft steps did not write (``draft_cache_rows.tail_plan``),
        put each request's first-draft proposal into the round's next-draft input and return
        True; False (SGLang's window extend runs) when ``tail`` is off or the round drew a tree."""
        template = self._template
        if not self.tail or template is None or draft_worker.topk != 1:
            return False
        started = time.perf_counter()
        width = int(draft_worker.speculative_num_draft_tokens)  # W = L + 1
        plan = tail_plan(batch, batch_result, int(draft_worker.speculative_num_steps), width)
        probs, p, ids = self._first_drafts(self._extend(draft_worker, plan), plan, batch.sampling_info)
        next_draft_input = batch_result.next_draft_input
        next_draft_input.topk_p, next_draft_input.topk_index = p, ids
        next_draft_input.draft_probs = probs
        self.mark_extended(batch, batch_result.accept_lens)
        self.tail_extends += 1
        self.tail_rows += int(plan.input_ids.numel())
        self.window_rows += int(plan.rows.numel()) * width
        self.tail_seconds += time.perf_counter() - started
        return True

    def _extend(self, draft_worker, plan: CatchUpPlan) -> torch.Tensor:
        """One EXTEND forward of the draft model over ``plan`` (its rows of the round's draft
        batch): the logits of each request's last row, float [A, V]."""
        from sglang_hsd.sglang_plugin.forward_batches import catch_up_extend_batch

        fb = catch_up_extend_batch(self._template, plan.rows, plan.prefix, plan.lengths,
                                   plan.input_ids, plan.positions, plan.out_cache_loc)
        return draft_worker.draft_runner.forward(fb).logits_output.next_token_logits

    @staticmethod
    def _first_drafts(logits: torch.Tensor, plan: CatchUpPlan, sampling):
        """A chain's first-draft proposal of each request from ``logits`` [A, V], sampled as
        SGLang's decode-time draft extend does (``sample_draft_proposal`` with the request's
        temperature and top-k; a greedy request's top-k of 1 proposes the argmax; seeded streams
        keyed by the committed length). Returns (q [A, V], its probability [A, 1], the draft [A, 1])."""
        from sglang.srt.speculative.spec_utils import sample_draft_proposal

        committed = (plan.prefix + plan.lengths).to(torch.int64)
        # HSD chains run SGLang's rejection-sampling draft path (forced by the server-argument
        # resolution), so every draft input carries q and greedy rows (top_k 1) propose argmax.
        seed = sampling.sampling_seed
        return sample_draft_proposal(
            logits, sampling.temperatures[plan.rows], sampling.top_ks[plan.rows],
            sampling_seed=None if seed is None else seed[plan.rows], positions=committed)

    def _tree_roots(self, logits: torch.Tensor, plan: CatchUpPlan, sampling):
        """A tree's next root of each request from ``logits`` [A, V], as the draft extend SGLang
        skipped leaves it: the root q the sampled tree draws from (``RootQHook``'s transform:
        the request's sampling parameters at the draft temperature scale, plain softmax for
        greedy rows) and SGLang's top-k of the plain softmax (its greedy top-k tree). Returns
        (root q [A, V], topk_p [A, k], topk_index [A, k])."""
        from sglang.srt.utils.common import fast_topk

        from sglang_hsd.sglang_plugin.request_sampling import sampling_probs

        # The transform reads every request's parameters: run it on the whole batch's rows
        # (zeros where nothing was caught up) and keep the caught-up ones.
        full = logits.new_zeros(int(sampling.temperatures.shape[0]), logits.shape[-1])
        full[plan.rows] = logits
        root_q = sampling_probs(full.float(), sampling, greedy_plain=True,
                                temperature_scale=self.temperature_scale)[plan.rows]
        topk_p, topk_index = fast_topk(torch.softmax(logits.float(), -1), self.topk, dim=-1)
        return root_q, topk_p, topk_index

    def record(self, rows: int, seconds: float) -> None:
        """A catch-up of ``rows`` rows took ``seconds`` (what prices the pending ones)."""
        self.catch_ups += 1
        self.caught_up_tokens += rows
        self.seconds += seconds
        if rows >= LARGE_CATCH_UP:
            self._large_rows += rows
            self._large_seconds += seconds
        else:
            self._small[0] += 1
            self._small[1] += rows
            self._small[2] += seconds

    def as_dict(self) -> dict:
        return {"enabled": True, "skipped_extends": self.skipped_extends,
                "skipped_rows": self.skipped_rows, "deferred_prefills": self.deferred_prefills,
                "deferred_rows": self.deferred_rows, "catch_ups": self.catch_ups,
                "caught_up_tokens": self.caught_up_tokens,
                "large_catch_up_ms_per_row": (round(1000 * self._large_seconds / self._large_rows, 3)
                                              if self._large_rows else None),
                "small_catch_ups": self._small[0],
                "small_catch_up_ms_mean": (round(1000 * self._small[2] / self._small[0], 3)
                                           if self._small[0] else None),
                "catch_up_ms": round(1000 * self.seconds, 2),
                "tail_extend": self.tail, "tail_extends": self.tail_extends,
                "tail_rows": self.tail_rows, "window_rows": self.window_rows,
                "tail_ms": round(1000 * self.tail_seconds, 2)}

    # -- internals ---------------------------------------------------------------------------

    def _slots(self, needed: int = 0) -> torch.Tensor:
        """The per-slot flags, grown (new slots: True, never written) to at least ``needed``."""
        if self._valid is None or self._valid.numel() < needed:
            grown = torch.ones(max(needed, 1 << 16, 2 * (0 if self._valid is None
                                                          else self._valid.numel())),
                               dtype=torch.bool, device=self.device)
            if self._valid is not None:
                grown[: self._valid.numel()] = self._valid
            self._valid = grown
        return self._valid

    def _set(self, slots: torch.Tensor, value: bool) -> None:
        slots = slots.to(torch.int64)
        if slots.numel():
            self._slots(int(slots.max()) + 1)[slots] = value


def _zero_stubs(batch_size: int, vocab: int | None, device, topk: int = 1) -> dict:
    """``topk_p`` [B, k], ``topk_index`` [B, k] and ``draft_probs`` [B, vocab] (None without a
    width) of zeros, shaped as SGLang's draft extends leave them (batches merge and filter them;
    none is read before ``run`` replaces it)."""
    # One zero row broadcast over the batch: merges and filters copy it, nothing writes to it.
    probs = (None if vocab is None else
             torch.zeros(1, vocab, dtype=torch.float32, device=device).expand(batch_size, vocab))
    return {"topk_p": torch.zeros(batch_size, topk, dtype=torch.float32, device=device),
            "topk_index": torch.zeros(batch_size, topk, dtype=torch.int64, device=device),
            "draft_probs": probs}


def _stub_next_draft_input(next_draft_input, verify_input, batch_size: int, topk: int = 1) -> None:
    """``_zero_stubs`` on a skipped round's next-draft input; ``verify_input`` (the round's
    verify input) gives the vocabulary width."""
    stubs = _zero_stubs(batch_size, _vocab_width(verify_input), next_draft_input.bonus_tokens.device, topk)
    for name, value in stubs.items():
        setattr(next_draft_input, name, value)


def _vocab_width(verify_input) -> int | None:
    probs = getattr(verify_input, "draft_probs", None)
    return None if probs is None else int(probs.shape[-1])


def build_catch_up(worker, setting: CatchUpSetting, adaptive: bool) -> DraftCatchUp | None:
    # adaptive: whether the worker runs --hsd-adaptive (it logged why not otherwise)
    """The catch-up for a STANDALONE HSD worker (after SGLang's ``__init__``), or None when off
    or unsupported (logged)."""
    if not setting.enabled:
        logger.info("sglang-hsd: %s off: rounds that draft nothing still extend the draft cache",
                    CATCH_UP_FLAG)
        return None
    reason = unsupported_reason(str(worker.device), draft_model=True,
                                adaptive_off=None if adaptive else "--hsd-adaptive not applied")
    if reason is not None:
        logger.info("sglang-hsd: %s not applied with %s", CATCH_UP_FLAG, reason)
        return None
    if getattr(worker, "_draft_worker", None) is None:
        return None
    tree = worker.topk > 1
    logger.info("sglang-hsd: %s on: rounds that draft nothing skip the draft extend; the draft "
                "cache catches up when drafting resumes; %s", CATCH_UP_FLAG,
                "a drafting tree round extends its whole verify window (SGLang's extend)" if tree else
                f"{EXTEND_FLAG} tail: a drafting round extends only what its draft steps did not write"
                if setting.tail else f"{EXTEND_FLAG} window: a drafting round extends its whole verify window")
    return DraftCatchUp(worker.device, tail=setting.tail, topk=worker.topk,
                        temperature_scale=worker.hsd_hooks.config.draft_temperature_scale)
