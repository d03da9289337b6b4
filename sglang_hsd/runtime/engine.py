"""Batched hierarchical speculative decoding over a ``CausalLM`` target.

Levels 0..m: level 0 drafts, level m is the target, levels in between are early exits of the
target (or a separate model right above a ``lookup`` drafter). The token sequence of a request is

    committed tokens | buf_{m-1} | ... | buf_1 | buf_0

where buf_k holds tokens level k has produced but level k + 1 has not yet checked, each with
level k's distribution at its position (the q the level above verifies it against).

* ``_fill(k)`` makes buf_k at least ``T_k`` tokens long: the drafter samples ``T_0`` tokens one by
  one; a level k >= 1 repeatedly fills buf_{k-1} and verifies it (``_verify(k)``).
* ``_verify(k)`` runs level k on buf_{k-1} (one forward over the buffer plus its bonus
  position), calls ``verify_chain`` with level k - 1's rows as q and its own as p, keeps the
  accepted prefix plus the corrected/bonus token, rolls every cache back past the first changed
  position and appends the kept tokens, with level k's rows, to buf_k (or commits them, k = m).

Why this is lossless (``docs/hierarchy.md``): each verification is a lossless chain rule, so the
tokens a level appends follow that level's own law whatever the level below proposed; stopping a
buffer "once it holds T_k tokens" (or the drafter by its draft-length rule) is a stopping time.

KV reuse: the target's layers are split into groups at the exit layers (``groups.py``); a position
runs through each group once and every level reads the stored hidden state of its group, so the
full verification of a buffer only runs the layers above the highest exit for it.

Lookup drafter (level kind ``lookup``, ``runtime/lookup_rounds.py``): level 0 copies earlier text
(q one-hot) or finds nothing (the level above then samples its own token); a separate model above
it verifies the copies in one forward, emitting several tokens per forward where it drafts one.

EAGLE-3 drafter (level kind ``eagle3``): extra group boundaries at the head's capture layers store
the hidden states it reads (they are not levels); ``Eagle3Drafter`` (``eagle3_drafter.py``) owns
the head's KV, drafts in ``_draft`` and is rolled back with the target in ``_verify``.

Tree rounds (``HierarchyConfig.tree``, drafter -> target) replace ``_fill`` / ``_verify`` by one
sampled draft tree per request and round (``runtime/tree_rounds.py``). Windowed rounds
(``HierarchyConfig.window``, drafter -> one exit -> target) replace them by the SGLang plugin's
round (``runtime/window.py`` runs ``verify/window_round.py`` with this engine's model work). ``generate(trace_rounds=True)`` records per round what each level
accepted (``GenerationResult.round_trace``).
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from sglang_hsd.runtime.config import HierarchyConfig
from sglang_hsd.runtime.eagle3 import Eagle3Head
from sglang_hsd.runtime.eagle3_drafter import Eagle3Drafter
from sglang_hsd.runtime.groups import LayerGroup, advance, build_groups, truncate_all
from sglang_hsd.runtime.kernel_setup import configure_kernels
from sglang_hsd.runtime.layers import PackedRows
from sglang_hsd.runtime.lookup_rounds import lookup_draft, verify_rows
from sglang_hsd.runtime.model import CausalLM
from sglang_hsd.runtime.stats import GenerationResult, LevelStats, RoundTrace
from sglang_hsd.runtime.tree_rounds import TreeRounds, tree_slots
from sglang_hsd.runtime.window import WindowRounds
from sglang_hsd.sampling import BatchSamplingParams, SamplingParams, logits_to_probs
from sglang_hsd.verify.common import inverse_cdf_sample


class SpeculativeGenerator:
    """Generate with a hierarchy of levels over one target model.

    Args:
        target: the target ``CausalLM``.
        config: the levels (``HierarchyConfig``); validated against the target's depth.
        drafter: a separate small ``CausalLM`` when a level is of kind ``"model"`` (the drafter,
            or the verifier of a ``lookup`` drafter).
        exit_heads: optional trained exit heads by exit layer (hidden [.., D] -> logits [.., V]);
            an exit without one uses the target's final norm + LM head.
        eagle3_head: the ``Eagle3Head`` when the first level is of kind ``"eagle3"`` (default:
            loaded from the level's ``model_path``).
        validate: validate verifier inputs every round (slower; for tests and debugging).
        pack_linears, packed_rows, drafter_precision: the kernels of the target's and a separate
            drafter's projections (:func:`~sglang_hsd.runtime.kernel_setup.configure_kernels`:
            oneDNN pre-packed weights for multi-row calls, the drafter's single rows on a bf16 /
            fp16 weight copy, or ``"auto"``: the faster here, measured); the models are changed in
            place. Off / ``"fp32"`` by default.
    """

    def __init__(
        self,
        target: CausalLM,
        config: HierarchyConfig,
        drafter: CausalLM | None = None,
        exit_heads: dict[int, torch.nn.Module] | None = None,
        validate: bool = False,
        eagle3_head: Eagle3Head | None = None,
        pack_linears: bool = False,
        packed_rows: Callable[[int, int], PackedRows] | None = None,
        drafter_precision: str = "fp32",
    ) -> None:
        config.check_depth(target.num_layers)
        first = config.levels[0]
        has_model = any(level.kind == "model" for level in config.levels)
        if has_model:
            if drafter is None:
                raise ValueError("a level is a separate model: pass drafter=CausalLM(...)")
            if drafter.vocab_size != target.vocab_size:
                raise ValueError(
                    f"drafter vocabulary ({drafter.vocab_size}) differs from the target's "
                    f"({target.vocab_size}): the drafter must share the target's tokenizer"
                )
        if first.kind == "eagle3":
            eagle3_head = eagle3_head or Eagle3Head.from_pretrained(first.model_path, target)
            if not all(1 <= layer <= target.num_layers for layer in eagle3_head.capture_layers):
                raise ValueError(f"EAGLE-3 capture layers {eagle3_head.capture_layers} outside the target's "
                                 f"{target.num_layers} layers")
        self.eagle3_head = eagle3_head if first.kind == "eagle3" else None
        self.target = target
        self.config = config
        self.drafter = drafter
        self.exit_heads = dict(exit_heads or {})
        self.validate = validate
        # The drafter precision in place ("auto" resolved by measuring this machine's kernels).
        self.drafter_precision = configure_kernels(target, drafter if has_model else None,
                                                   pack_linears, packed_rows, drafter_precision)

    @torch.inference_mode()
    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams | list[SamplingParams] = SamplingParams(),
        max_new_tokens: int | list[int] = 32,
        eos_token_id: int | list[int] | None = None,
        seed: int = 0,
        trace_rounds: bool = False,
        progress: Callable[[int], None] | None = None,
    ) -> GenerationResult:
        """Generate for a batch of prompts (token id lists of any lengths).

        Returns the generated tokens per request and per-level statistics; with ``trace_rounds``
        (drafter, at most one exit, target) also ``round_trace``, what every target round of every
        request accepted (``GenerationResult``). ``progress`` is called after every commit with the
        tokens generated so far, summed over the batch (e.g. to move a progress bar).
        """
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("prompts must be a non-empty list of non-empty token id lists")
        if trace_rounds and len(self.config.levels) not in (2, 3):
            names = ",".join(level.name for level in self.config.levels)
            raise ValueError(f"trace_rounds needs two or three levels (drafter, one exit level, target), got {names}")
        run = _Run(self, prompts, params, max_new_tokens, eos_token_id, seed, trace_rounds, progress)
        start = time.perf_counter()
        run.run()
        elapsed = time.perf_counter() - start
        return run.result(elapsed)


class _Run:
    """The state of one ``generate`` call."""

    def __init__(self, gen: SpeculativeGenerator, prompts, params, max_new_tokens, eos_token_id, seed,
                 trace_rounds: bool = False, progress: Callable[[int], None] | None = None):
        self.gen = gen
        self.levels = gen.config.levels
        self.top = len(self.levels) - 1
        target = gen.target
        device = target.embed_tokens.weight.device
        batch = len(prompts)
        params_list = params if isinstance(params, list) else [params] * batch
        max_new = max_new_tokens if isinstance(max_new_tokens, list) else [max_new_tokens] * batch
        if len(params_list) != batch or len(max_new) != batch:
            raise ValueError("params and max_new_tokens lists must have one entry per prompt")
        self.params = BatchSamplingParams.from_params(params_list, device)
        self.max_new = torch.tensor(max_new, device=device)
        eos = [] if eos_token_id is None else ([eos_token_id] if isinstance(eos_token_id, int) else eos_token_id)
        self.eos = torch.tensor(eos, dtype=torch.long, device=device)
        self.generator = torch.Generator(device=device).manual_seed(seed)

        # Buffer capacities: the drafter's is its longest draft; level k may overshoot T_k by a full round.
        rule = gen.config.draft_length
        self.caps = []
        for k in range(self.top):
            self.caps.append(rule.longest(self.levels[0].buffer) if k == 0 else self.levels[k].buffer + self.caps[-1])
        # Per request, the drafter's length cap of the next round (N_d throughout for a fixed rule).
        self.draft_caps = rule.initial_caps(batch, self.levels[0].buffer, device)
        lengths = [len(p) for p in prompts]
        self.max_len = max(lengths) + max(max_new) + sum(self.caps) + tree_slots(gen.config) + 2
        self.tokens = torch.zeros(batch, self.max_len, dtype=torch.long, device=device)
        for row, prompt in enumerate(prompts):
            self.tokens[row, : len(prompt)] = torch.tensor(prompt, device=device)
        self.prompt_len = torch.tensor(lengths, device=device)
        self.seq_len = self.prompt_len.clone()
        self.finished = torch.zeros(batch, dtype=torch.bool, device=device)
        self.buf_start = [self.seq_len.clone() for _ in range(self.top)]
        vocab = target.vocab_size
        self.buf_probs = [torch.zeros(batch, cap, vocab, device=device) for cap in self.caps]
        self.stats = [LevelStats(level.name) for level in self.levels]
        self._build_groups(batch)
        self.target_forwards0 = target.counters.layer_token_forwards
        self.drafter_forwards0 = gen.drafter.counters.layer_token_forwards if gen.drafter else 0
        self.trace = RoundTrace(batch) if trace_rounds else None
        self.progress = progress
        self.window_rounds = WindowRounds(self) if gen.config.window else None
        self.tree_rounds = TreeRounds(self) if gen.config.tree is not None else None

    def _build_groups(self, batch: int) -> None:
        exits = [level.layer for level in self.levels if level.kind == "exit"]
        head = self.gen.eagle3_head
        captures = head.capture_layers if head is not None else []
        target_groups = build_groups(self.gen.target, exits, batch, self.max_len, self.gen.config.reuse_kv, captures)
        by_end = {group.end: group for group in target_groups}
        self.eagle = Eagle3Drafter(head, [by_end[c] for c in captures], batch, self.max_len) if head is not None else None
        self.level_group: list[LayerGroup] = []
        self.level_head: list[torch.nn.Module | None] = []
        self.drafter_group = None
        for level in self.levels:
            if level.kind == "lookup":
                group = None  # no network, no cache
            elif level.kind == "model":
                drafter = self.gen.drafter
                cache = drafter.new_cache(batch, self.max_len)
                group = LayerGroup.create(drafter, 0, drafter.num_layers, cache, None, batch, self.max_len)
                self.drafter_group = group
            elif level.kind == "exit":
                group = by_end[level.layer]
            elif level.kind == "eagle3":
                group = by_end[max(captures)]  # not read: the drafter has its own state
            else:
                group = target_groups[-1]
            self.level_group.append(group)
            self.level_head.append(self.gen.exit_heads.get(level.layer) if level.kind == "exit" else None)
        self.all_groups = target_groups + ([self.drafter_group] if self.drafter_group is not None else [])

    # ------------------------------------------------------------------ driving loop
    def run(self) -> None:
        while not bool(self.finished.all()):
            active = ~self.finished
            if self.top == 0:
                self._autoregressive_step(active)
            elif self.window_rounds is not None:
                self.window_rounds.round(active)
            elif self.tree_rounds is not None:
                self.tree_rounds.round(active)
            else:
                self._fill(self.top - 1, active)
                self._verify(self.top, active)

    def _fill(self, k: int, rows: torch.Tensor) -> None:
        if k == 0:
            self._draft(rows)
            return
        while True:
            short = rows & (self.seq_len - self.buf_start[k] < self.levels[k].buffer)
            if not bool(short.any()):
                return
            self._fill(k - 1, short)
            self._verify(k, short)

    # ------------------------------------------------------------------ level pieces
    def level_logits(self, k: int, idx: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Level k's logits after each of ``positions`` [R, T] of rows ``idx``. float [R, T, V]."""
        group = self.level_group[k]
        hidden = group.hidden[idx.unsqueeze(-1), positions.clamp(0, self.max_len - 1)]
        return group.model.exit_logits(hidden, self.level_head[k])

    def level_probs(self, k: int, idx: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Level k's distribution (``level_logits`` under each request's sampling parameters). [R, T, V]."""
        return logits_to_probs(self.level_logits(k, idx, positions), self.params.rows(idx))

    def _sample(self, probs: torch.Tensor) -> torch.Tensor:
        """One token per row of ``probs`` [R, V] by inverse CDF: one uniform per row instead of the
        V exponentials ``torch.multinomial`` draws. int64 [R]."""
        uniform = torch.rand(probs.shape[0], device=probs.device, generator=self.generator)
        return inverse_cdf_sample(probs, uniform)

    def _draft(self, rows: torch.Tensor) -> None:
        if self.levels[0].kind == "lookup":
            lookup_draft(self, rows)
        else:
            self.draft_tokens(rows, self.buf_start[0], self.buf_start[self.top - 1])

    def draft_tokens(self, rows: torch.Tensor, base: torch.Tensor, features_upto: torch.Tensor) -> None:
        """Level 0 drafts for ``rows`` (bool [B]) one token at a time into ``tokens`` and
        ``buf_probs[0]`` (indexed from ``buf_start[0]``): a row stops when ``seq_len - base``
        reaches its cap (``draft_caps``: N_d for a fixed rule) or when the draft-length rule stops
        on the token it just drew (``DraftLengthRule.stops`` on the drafter's raw confidence:
        a stopping time, the token is kept).

        Args:
            base: int64 [B], where the count of drafted tokens starts.
            features_upto: int64 [B]; an EAGLE-3 drafter reads target features of positions
                before it only.
        """
        start_time = time.perf_counter()
        group, stats, rule = self.level_group[0], self.stats[0], self.gen.config.draft_length
        drafting = rows & (self.seq_len - base < self.draft_caps)
        stats.drafts += int(drafting.sum())
        for _ in range(self.caps[0]):
            idx = (drafting & (self.seq_len - base < self.draft_caps)).nonzero().squeeze(-1)
            if idx.numel() == 0:
                break
            if self.eagle is not None:
                logits = self.eagle.propose(idx, self.tokens, self.seq_len, features_upto)
            else:
                advance(group, self.tokens, self.seq_len)
                logits = self.level_logits(0, idx, (self.seq_len[idx] - 1).unsqueeze(-1))[:, 0]
            q = logits_to_probs(logits, self.params.rows(idx))  # what the verifier divides by
            token = self._sample(q)
            slot = self.seq_len[idx]
            self.tokens[idx, slot] = token
            self.buf_probs[0][idx, slot - self.buf_start[0][idx]] = q
            self.seq_len[idx] += 1
            if rule.adaptive:  # stop on the raw confidence, not on q (one-hot at temperature 0)
                drafting[idx] &= ~rule.stops(rule.confidence(logits, token), self.seq_len[idx] - base[idx])
            stats.rounds += idx.numel()
            stats.proposed += idx.numel()
        stats.seconds += time.perf_counter() - start_time

    def _verify(self, k: int, rows: torch.Tensor) -> None:
        start_time = time.perf_counter()
        idx = rows.nonzero().squeeze(-1)
        start = self.buf_start[k - 1][idx]
        # >= 1 (the level below just filled its buffer), except after a lookup that found nothing
        draft_len = self.seq_len[idx] - start
        width = int(draft_len.max())
        advance(self.level_group[k], self.tokens, self.seq_len)
        offsets = torch.arange(width + 1, device=idx.device)
        p = self.level_probs(k, idx, (start - 1).unsqueeze(-1) + offsets)  # [R, width + 1, V]
        accepted, emitted = verify_rows(self, k, idx, start, draft_len, width, p)
        if k == 1:  # the drafter's round is over: its next cap from this round's outcome
            rule = self.gen.config.draft_length
            self.draft_caps[idx] = rule.next_caps(self.draft_caps[idx], draft_len, accepted)
        new_len = start + accepted + 1
        self.tokens[idx, start + accepted] = emitted
        keep = self.seq_len.clone()
        keep[idx] = start + accepted  # the first changed position
        self.rollback(keep)
        self.seq_len[idx] = new_len
        for lower in range(k):
            self.buf_start[lower][idx] = new_len
        if self.trace is not None:
            self.trace.record(k == self.top, idx, accepted, new_len - start)
        if k < self.top:
            self._append_to_buffer(k, idx, start, accepted, p)
        else:
            self.commit(idx)
        stats = self.stats[k]
        stats.rounds += idx.numel()
        stats.proposed += int(draft_len.sum())
        stats.accepted += int(accepted.sum())
        stats.seconds += time.perf_counter() - start_time

    def _append_to_buffer(self, k, idx, start, accepted, p) -> None:
        """Store level k's rows for the kept tokens (positions start .. start + accepted)."""
        offset = (start - self.buf_start[k][idx]).unsqueeze(-1) + torch.arange(p.shape[1], device=idx.device)
        kept = torch.arange(p.shape[1], device=idx.device).unsqueeze(0) <= accepted.unsqueeze(-1)
        rows = idx.unsqueeze(-1).expand_as(offset)
        self.buf_probs[k][rows[kept], offset[kept]] = p[kept]

    def _autoregressive_step(self, rows: torch.Tensor) -> None:
        start_time = time.perf_counter()
        idx = rows.nonzero().squeeze(-1)
        advance(self.level_group[0], self.tokens, self.seq_len)
        p = self.level_probs(0, idx, (self.seq_len[idx] - 1).unsqueeze(-1))[:, 0]
        self.tokens[idx, self.seq_len[idx]] = self._sample(p)
        self.seq_len[idx] += 1
        self.commit(idx)
        self.stats[0].rounds += idx.numel()
        self.stats[0].seconds += time.perf_counter() - start_time

    def rollback(self, keep: torch.Tensor) -> None:
        """Cut every cache (target groups, a separate drafter, an EAGLE-3 head) so that row b keeps
        positions < ``keep[b]`` (int64 [B])."""
        truncate_all(self.all_groups, keep)
        if self.eagle is not None:
            self.eagle.truncate(keep)

    def commit(self, idx: torch.Tensor) -> None:
        """Finish rows that produced EOS or reached max_new_tokens; cut their output there."""
        generated = self.seq_len[idx] - self.prompt_len[idx]
        done = generated >= self.max_new[idx]
        limit = self.prompt_len[idx] + torch.minimum(generated, self.max_new[idx])
        if self.eos.numel():
            positions = torch.arange(self.max_len, device=idx.device)
            window = (positions >= self.prompt_len[idx].unsqueeze(-1)) & (positions < limit.unsqueeze(-1))
            is_eos = torch.isin(self.tokens[idx], self.eos) & window
            first_eos = torch.where(is_eos, positions, self.max_len).amin(dim=-1)
            done |= first_eos < self.max_len
            limit = torch.minimum(limit, first_eos + 1)
        self.seq_len[idx] = torch.where(done, limit, self.seq_len[idx])
        self.finished[idx] |= done
        if self.progress is not None:
            self.progress(int((self.seq_len - self.prompt_len).clamp(max=self.max_new).sum()))

    def result(self, elapsed: float) -> GenerationResult:
        starts, ends = self.prompt_len.tolist(), self.seq_len.tolist()
        tokens = [self.tokens[row, starts[row] : ends[row]].tolist() for row in range(len(starts))]
        drafter = self.gen.drafter
        return GenerationResult(
            tokens=tokens,
            levels=self.stats,
            seconds=elapsed,
            target_layer_forwards=self.gen.target.counters.layer_token_forwards - self.target_forwards0,
            drafter_layer_forwards=(drafter.counters.layer_token_forwards - self.drafter_forwards0) if drafter else 0,
            round_trace=self.trace.rounds if self.trace is not None else [],
        )
