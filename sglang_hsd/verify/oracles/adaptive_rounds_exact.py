"""Exact law of the emitted tokens over several rounds with ``BudgetController`` choosing each length.

``sglang_hsd/adaptive.py`` claims that choosing round n's draft length L from rounds 1..n-1 only
keeps the output law the target's. This module enumerates that claim: one request after a
multi-token prompt on a tabular world (p and q depend on the whole prefix, prompt included), and
every round

1. asks the real controller for L (``choose([rate], 1)`` with the request's rate from its
   ``AcceptanceEstimate``), from the state the earlier rounds of *this branch* left;
2. drafts: L = 0 is plain decoding (one token from p); else up to L tokens from q, stopped early by
   the within-round ``DraftLengthRule`` when it is adaptive (its cap also adapts from past rounds);
3. verifies with the exact outcome law of the chain method (``adaptive_exact.counted_round_law``,
   built on ``exact.OUTCOME_LAWS``), keeping the drafted and accepted counts;
4. feeds the counts to the estimate, ``observe_rates``, ``observe_stops`` and ``observe_round`` (deterministic fake
   seconds ``1 + 0.3 L``), on a copy of the branch's state per outcome.

Each branch carries its own deep copy of the controller and estimate, so a branch's L is exactly
what the server would choose after that branch's history; the law of the first ``length`` emitted
tokens is summed over all branches in float64 with no sampling. A lossless policy gives the
target's law (TV ~1e-16). The policy is a parameter, so the same enumeration measures plausible
wrong controllers (``truncating_round``, ``peeking_round``) that let a round's own drafts decide
how long that round's draft is; they are biased (TV > 1e-3).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import torch

from sglang_hsd.adaptive import AcceptanceEstimate, AdaptiveConfig, BudgetController
from sglang_hsd.draft_length import DraftLengthRule
from sglang_hsd.verify.oracles.adaptive_exact import counted_round_law, draft_outcome_law, stopped_drafts
from sglang_hsd.verify.oracles.exact import TabularWorld, random_world

__all__ = ["ControlledLaw", "ControllerSetup", "PromptedWorld", "RoundState", "budget_round", "next_cap", "peek_rate",
           "controlled_prefix_distribution", "finish_round", "peeking_round", "prompted_world",
           "truncated", "truncating_round"]


@dataclass(frozen=True, eq=False)
class PromptedWorld:
    """A ``TabularWorld`` seen after a fixed ``prompt``: ``p(prefix)`` is the base world's row after
    ``prompt + prefix``, so prefixes here are the emitted tokens only and every oracle written for
    worlds (``stopped_drafts``, ``target_prefix_distribution``) works unchanged. Hashed by
    identity, like ``TabularWorld`` (the round laws are cached per world)."""

    base: TabularWorld
    prompt: tuple[int, ...]

    @property
    def vocab_size(self) -> int:
        return self.base.vocab_size

    @property
    def max_len(self) -> int:
        """Longest emitted prefix (drafts included) with a row."""
        return self.base.max_len - len(self.prompt)

    def p(self, prefix: tuple[int, ...]) -> np.ndarray:
        return self.base.p(self.prompt + tuple(prefix))

    def q(self, prefix: tuple[int, ...]) -> np.ndarray:
        return self.base.q(self.prompt + tuple(prefix))


def prompted_world(prompt: tuple[int, ...], length: int, longest: int, vocab_size: int = 3, seed: int = 0,
                   draft: str = "mixture") -> PromptedWorld:
    """A ``random_world`` large enough for ``length`` emitted tokens with drafts of up to ``longest``
    after ``prompt``."""
    base = random_world(vocab_size, len(prompt) + length - 1 + longest, seed=seed, draft=draft)
    return PromptedWorld(base, tuple(prompt))


@dataclass
class RoundState:
    """What one request's rounds leave behind: the controller (one per scheduler; here the request
    is alone in its batch), the request's acceptance estimate and its within-round length cap."""

    controller: BudgetController
    estimate: AcceptanceEstimate
    cap: int


@dataclass(frozen=True)
class ControllerSetup:
    """Fields:
        config: the controller's ``AdaptiveConfig`` (``candidates[-1]`` is the longest draft).
        rule: the within-round ``DraftLengthRule``; ``fixed`` drafts exactly L tokens.
        warmup: lengths of rounds the controller observed before this request's first (their
            costs are measured, so the first choices already compare lengths).
        base_seconds, seconds_per_token: the fake round seconds ``base + per_token * L``.
    """

    config: AdaptiveConfig
    rule: DraftLengthRule = field(default_factory=DraftLengthRule)
    warmup: tuple[int, ...] = ()
    base_seconds: float = 1.0
    seconds_per_token: float = 0.3

    @property
    def longest(self) -> int:
        return self.config.candidates[-1]

    def seconds(self, length: int) -> float:
        return self.base_seconds + self.seconds_per_token * length

    def new_controller(self, batch: int = 1) -> BudgetController:
        """A controller that has observed the ``warmup`` rounds at ``batch`` requests."""
        controller = BudgetController(self.config)
        for length in self.warmup:
            controller.observe_round(batch, length, self.seconds(length))
        return controller

    def new_state(self) -> RoundState:
        return RoundState(self.new_controller(), AcceptanceEstimate(), self.rule.longest(self.longest))


def finish_round(controller: BudgetController, setup: ControllerSetup, length: int,
                 estimates: list[AcceptanceEstimate], counts: list[tuple[int, int]]) -> None:
    """After a round of ``len(counts)`` requests at draft length ``length``: each request's estimate
    observes its (drafted, accepted), then the server rate, where the chains stopped and the
    round's fake seconds."""
    for estimate, (drafted, accepted) in zip(estimates, counts, strict=True):
        estimate.observe(drafted, accepted, setup.config.memory)
    drafted_rounds = sum(1 for d, _ in counts if d > 0)
    controller.observe_rates(sum(a for _, a in counts), drafted_rounds, sum(1 for d, a in counts if a < d))
    controller.observe_stops(counts)
    controller.observe_round(len(counts), length, setup.seconds(length))


def next_cap(rule: DraftLengthRule, cap: int, drafted: int, accepted: int) -> int:
    """The within-round cap after a round (unchanged after a round that did not draft)."""
    if drafted == 0:
        return cap
    return int(rule.next_caps(torch.tensor([cap]), torch.tensor([drafted]), torch.tensor([accepted]))[0])


# A round policy: (world, method, setup, state before the round, emitted prefix, choose) ->
# {(L, emitted block, drafted, accepted): probability}. ``choose(rate)`` is the controller's
# ``choose([rate], 1)`` from the branch's state before the round.
RoundPolicy = Callable[..., dict[tuple[int, tuple[int, ...], int, int], float]]


def _plain_round(world, prefix) -> dict[tuple[tuple[int, ...], int, int], float]:
    """L = 0: plain decoding, one token from p."""
    p = world.p(prefix)
    return {((int(token),), 0, 0): float(p[token]) for token in np.nonzero(p)[0]}


def budget_round(world, method: str, setup: ControllerSetup, state: RoundState, prefix, choose):
    """The real controller: L from the past rounds' state, then a draft of up to L tokens (the
    within-round rule may stop it earlier) and the chain verifier."""
    length = choose(state.controller.request_rate(state.estimate))
    if length == 0:
        law = _plain_round(world, prefix)
    else:
        law = counted_round_law(world, method, setup.rule, prefix, min(length, state.cap))
    return {(length, *key): prob for key, prob in law.items()}


def truncated(policy: RoundPolicy) -> RoundPolicy:
    """WRONG: ``policy``'s round, shortened after the fact on a rejection at position j to the
    accepted j tokens, as if L = j had been chosen: the rejected position is dropped and a bonus
    token from p at position j replaces the residual token (and the controller is told j of j
    accepted). Works for any round whose outcome is (L, accepted tokens + one more token)."""

    def truncating(world, method: str, setup: ControllerSetup, state: RoundState, prefix, choose):
        out: dict[tuple[int, tuple[int, ...], int, int], float] = {}
        for (length, block, drafted, accepted), prob in policy(world, method, setup, state, prefix, choose).items():
            if accepted == drafted:
                out[(length, block, drafted, accepted)] = out.get((length, block, drafted, accepted), 0.0) + prob
                continue
            p = world.p(prefix + block[:-1])
            for token in np.nonzero(p)[0]:
                key = (length, block[:-1] + (int(token),), accepted, accepted)
                out[key] = out.get(key, 0.0) + prob * float(p[token])
        return out

    return truncating


def truncating_round(world, method: str, setup: ControllerSetup, state: RoundState, prefix, choose):
    """WRONG: ``budget_round`` shortened after the fact (``truncated``)."""
    return truncated(budget_round)(world, method, setup, state, prefix, choose)


def peek_rate(world, prefix: tuple[int, ...], draft: tuple[int, ...]) -> float:
    """The mean token-wise acceptance probability min(1, p/q) of this round's drafted tokens."""
    ratios = [min(1.0, float(world.p(prefix + draft[:t])[x] / world.q(prefix + draft[:t])[x]))
              for t, x in enumerate(draft)]
    return float(np.mean(ratios))


@lru_cache(maxsize=None)
def _peeked_drafts(world, rule: DraftLengthRule, prefix: tuple[int, ...], cap: int):
    """Every draft the rule can stop at, with its probability and ``peek_rate``."""
    return [(draft, prob, peek_rate(world, prefix, draft)) for draft, prob in stopped_drafts(world, rule, prefix, cap)]


def peeking_round(world, method: str, setup: ControllerSetup, state: RoundState, prefix, choose):
    """WRONG: draft the longest length first (the within-round rule may stop it), then ask the
    controller for L with this round's own drafts' acceptance as the rate (``peek_rate``) and verify
    only the first L drafted tokens (L = 0: plain decoding)."""
    out: dict[tuple[int, tuple[int, ...], int, int], float] = {}
    for draft, draft_prob, rate in _peeked_drafts(world, setup.rule, prefix, min(setup.longest, state.cap)):
        length = choose(rate)
        kept = draft[:length]
        if not kept:
            law = _plain_round(world, prefix)
        else:
            law = {(kept[:n] + (token,), len(kept), n): prob
                   for (n, token), prob in draft_outcome_law(world, method, prefix, kept).items()}
        for (block, drafted, accepted), prob in law.items():
            key = (length, block, drafted, accepted)
            out[key] = out.get(key, 0.0) + draft_prob * prob
    return out


@dataclass
class ControlledLaw:
    """Fields:
        emitted: {first ``length`` emitted tokens: probability}.
        choices: {(round index, L): probability that the round ran and chose L}.
        branches: number of (prefix, controller state) branches enumerated.
    """

    emitted: dict[tuple[int, ...], float]
    choices: dict[tuple[int, int], float]
    branches: int


class _Chooser:
    """``choose(rate)`` for one branch: the length the controller chooses from the branch's state
    (``decide``), with, per length, a copy of the state on which ``choose`` recorded it."""

    def __init__(self, state: RoundState) -> None:
        self.state = state
        self.after: dict[int, RoundState] = {}

    def __call__(self, rate: float) -> int:
        length = self.state.controller.decide([rate], 1)
        if length not in self.after:
            chosen = copy.deepcopy(self.state)
            if chosen.controller.choose([rate], 1) != length:
                raise RuntimeError("BudgetController.choose disagrees with decide on the same state")
            self.after[length] = chosen
        return length


def _branch_outcomes(world, method, setup, state, prefix, policy):
    """[(L, block, drafted, accepted, probability, state after the choice)] of one branch's round."""
    chooser = _Chooser(state)
    law = policy(world, method, setup, state, prefix, chooser)
    return [(length, block, drafted, accepted, prob, chooser.after[length])
            for (length, block, drafted, accepted), prob in law.items()]


def controlled_prefix_distribution(world, method: str, setup: ControllerSetup, length: int,
                                   policy: RoundPolicy = budget_round) -> ControlledLaw:
    """Exact law of the first ``length`` emitted tokens over as many controlled rounds as it takes
    (module docstring), starting from ``setup.new_state()``."""
    if world.max_len < length - 1 + setup.longest:
        raise ValueError(f"length {length} with drafts of {setup.longest} needs prefixes of "
                         f"{length - 1 + setup.longest} tokens; the world has {world.max_len}")
    done: dict[tuple[int, ...], float] = {}
    choices: dict[tuple[int, int], float] = {}
    frontier = [((), 1.0, setup.new_state())]
    branches, round_index = 0, 0
    while frontier:
        next_frontier = []
        for prefix, mass, state in frontier:
            branches += 1
            for chosen, block, drafted, accepted, prob, after in _branch_outcomes(
                    world, method, setup, state, prefix, policy):
                choices[(round_index, chosen)] = choices.get((round_index, chosen), 0.0) + mass * prob
                extended = (prefix + block)[:length]
                if len(extended) == length:
                    done[extended] = done.get(extended, 0.0) + mass * prob
                    continue
                new = copy.deepcopy(after)
                finish_round(new.controller, setup, chosen, [new.estimate], [(drafted, accepted)])
                new.cap = next_cap(setup.rule, new.cap, drafted, accepted)
                next_frontier.append((extended, mass * prob, new))
        frontier, round_index = next_frontier, round_index + 1
    return ControlledLaw(done, choices, branches)
