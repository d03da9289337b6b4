"""Batched Monte-Carlo runs of controlled rounds: ``BudgetController`` with the real ``verify_chain``.

Where ``adaptive_rounds_exact.py`` enumerates one request's law, this module *runs* the serving
pattern on many sequences at once: requests in groups of ``batch``, one controller per group (a
scheduler), one draft length L per group and round (``choose`` with the rates of the group's
unfinished requests, as the server does), drafting from q with the within-round rule, one
``verify_chain`` call per length in use (ragged ``draft_lengths`` when the rule stops drafts early),
and the same updates as the exact oracle (``finish_round``, fake seconds ``1 + 0.3 L``). A request
leaves its group once it has ``length`` tokens. The first ``length`` tokens of every sequence are
compared with the exact target law by ``stats.chi_square_p_value``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from sglang_hsd.adaptive import AcceptanceEstimate
from sglang_hsd.verify import verify_chain
from sglang_hsd.verify.oracles.adaptive_rounds_exact import ControllerSetup, PromptedWorld, finish_round
from sglang_hsd.verify.oracles.exact import prefix_offset, target_prefix_distribution
from sglang_hsd.verify.oracles.simulate import SimulationResult, _append_emitted

__all__ = ["ControlledSimulation", "RoundFn", "Tables", "plain_rows", "simulate_controlled_chain", "target_law_probs"]


@dataclass
class ControlledSimulation(SimulationResult):
    """``SimulationResult`` plus ``request_rounds_by_length``: {L: request-rounds run at draft length L},
    summed over the groups' controllers."""

    request_rounds_by_length: dict[int, int] = field(default_factory=dict)


def target_law_probs(world, length: int) -> torch.Tensor:
    """Exact target probabilities of every ``length``-token emitted prefix, indexed by its base-V
    value (the order of ``SimulationResult.prefix_counts``). float64 [V ** length]."""
    vocab = world.vocab_size
    probs = torch.zeros(vocab**length, dtype=torch.float64)
    for prefix, mass in target_prefix_distribution(world, length).items():
        probs[sum(token * vocab ** (length - 1 - i) for i, token in enumerate(prefix))] = mass
    return probs


class Tables:
    """The base world's rows as tensors, looked up by (context length, base-V value of the context)."""

    def __init__(self, world: PromptedWorld, dtype: torch.dtype) -> None:
        base = world.base
        self.vocab = base.vocab_size
        self.p = torch.as_tensor(base.target, dtype=dtype)
        self.q = torch.as_tensor(base.draft, dtype=dtype)
        self.offsets = torch.tensor([prefix_offset(self.vocab, n) for n in range(base.max_len + 1)])

    def code(self, context_len: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        return self.offsets[context_len] + value


def _draft(tables: Tables, rule, context_len, value, limit, num_draft: int, generator):
    """Draft up to ``limit`` [R] (<= ``num_draft``) tokens per row from q, stopping a row after a
    token the rule stops on. Returns draft [R, K], q rows [R, K, V], p rows [R, K + 1, V] (row
    ``drafted`` is the bonus row) and drafted [R] (>= 1); positions past a row's draft are unused."""
    rows = context_len.shape[0]
    draft = torch.zeros(rows, num_draft, dtype=torch.long)
    drafted = torch.zeros(rows, dtype=torch.long)
    going = torch.ones(rows, dtype=torch.bool)
    q_rows, p_rows = [], []
    for t in range(num_draft + 1):
        code = tables.code(context_len + t, value)
        p_rows.append(tables.p[code])
        if t == num_draft:
            break
        q_row = tables.q[code]
        q_rows.append(q_row)
        token = torch.where(going, torch.multinomial(q_row, 1, generator=generator).squeeze(-1), 0)
        draft[:, t] = token
        drafted += going.long()
        confidence = q_row.gather(1, token.unsqueeze(-1)).squeeze(-1)
        going = going & (drafted < limit) & ~rule.stops(confidence, drafted)
        value = value * tables.vocab + token
    return draft, torch.stack(q_rows, 1), torch.stack(p_rows, 1), drafted


def _group_rows(active: list[int], batch: int):
    """(group, positions in ``active``) for each group with an active request."""
    for group, items in itertools.groupby(enumerate(active), key=lambda item: item[1] // batch):
        yield group, [position for position, _ in items]


# One round of the active rows at their groups' lengths: (tables, world, method, setup, state,
# active [R], lengths [R], generator, truncate_on_reject) -> (emitted [R, longest + 1] -1 padded,
# drafted [R], accepted [R] as the controller is told them).
RoundFn = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def plain_rows(tables: "Tables", context_len: torch.Tensor, value: torch.Tensor, generator) -> torch.Tensor:
    """One token from p per row (a round of length 0: plain decoding). int64 [R]."""
    return torch.multinomial(tables.p[tables.code(context_len, value)], 1, generator=generator).squeeze(-1)


def _round(tables, world, method, setup, state, active, lengths, generator, truncate_on_reject):
    """One round for the ``active`` rows at their group's ``lengths``. Returns emitted [R, K + 1]
    (-1 padded), drafted [R] and accepted [R] as the controller is told them."""
    seq_len, value, caps = state["seq_len"][active], state["value"][active], state["caps"][active]
    context_len = seq_len + len(world.prompt)
    rows = active.shape[0]
    emitted = torch.full((rows, setup.longest + 1), -1, dtype=torch.long)
    drafted = torch.zeros(rows, dtype=torch.long)
    accepted = torch.zeros(rows, dtype=torch.long)
    plain = (lengths == 0).nonzero().squeeze(-1)
    if plain.numel():
        emitted[plain, 0] = plain_rows(tables, context_len[plain], value[plain], generator)
    for length in sorted(set(lengths.tolist()) - {0}):
        sel = (lengths == length).nonzero().squeeze(-1)
        limit = torch.minimum(caps[sel], torch.tensor(length))
        draft, q_rows, p_rows, n_drafted = _draft(tables, setup.rule, context_len[sel], value[sel], limit, length,
                                                  generator)
        result = verify_chain(draft, q_rows, p_rows, method=method, generator=generator,
                              draft_lengths=n_drafted if setup.rule.adaptive else None)
        n_accepted, tokens = result.num_accepted, result.tokens
        if truncate_on_reject:  # WRONG: drop the rejected position, bonus from p there
            rejected = (n_accepted < n_drafted).nonzero().squeeze(-1)
            bonus_rows = p_rows[rejected, n_accepted[rejected]]
            tokens[rejected, n_accepted[rejected]] = torch.multinomial(bonus_rows, 1, generator=generator).squeeze(-1)
            n_drafted = torch.where(n_accepted < n_drafted, n_accepted, n_drafted)
        emitted[sel, : length + 1] = tokens
        drafted[sel], accepted[sel] = n_drafted, n_accepted
    return emitted, drafted, accepted


def simulate_controlled_chain(
    world: PromptedWorld,
    method: str,
    setup: ControllerSetup,
    length: int,
    num_groups: int,
    batch: int,
    generator: torch.Generator,
    truncate_on_reject: bool = False,
    dtype: torch.dtype = torch.float64,
    round_fn: RoundFn | None = None,
) -> ControlledSimulation:
    """Run controlled rounds (module docstring) until every sequence has ``length`` tokens.

    ``truncate_on_reject``: the WRONG controller of ``adaptive_rounds_exact.truncating_round``.
    ``round_fn``: what one round of the chosen lengths runs (``RoundFn``; None: chains drafted
    from q and verified by ``verify_chain``; ``adaptive_tree_simulate.tree_round``: sampled trees).
    Returns the first ``length`` tokens of the ``num_groups * batch`` sequences (group g holds
    sequences g * batch .. g * batch + batch - 1) and each one's accepted drafts in its first round.
    """
    if world.max_len < length - 1 + setup.longest:
        raise ValueError(f"the world's max_len {world.max_len} is too small for length {length} and "
                         f"drafts of {setup.longest}")
    round_fn = _round if round_fn is None else round_fn
    tables = Tables(world, dtype)
    total = num_groups * batch
    prompt_value = sum(t * tables.vocab ** (len(world.prompt) - 1 - i) for i, t in enumerate(world.prompt))
    state = {"seq_len": torch.zeros(total, dtype=torch.long), "value": torch.full((total,), prompt_value),
             "caps": setup.rule.initial_caps(total, setup.longest)}
    tokens = torch.zeros(total, length, dtype=torch.long)
    controllers = [setup.new_controller(batch) for _ in range(num_groups)]
    estimates = [AcceptanceEstimate() for _ in range(total)]
    first_round = None
    while bool((state["seq_len"] < length).any()):
        active = (state["seq_len"] < length).nonzero().squeeze(-1)
        active_list = active.tolist()
        lengths = torch.zeros(active.shape[0], dtype=torch.long)
        groups = list(_group_rows(active_list, batch))
        for group, positions in groups:
            rates = [controllers[group].request_rate(estimates[active_list[i]]) for i in positions]
            lengths[positions] = controllers[group].choose(rates, len(positions))
        emitted, drafted, accepted = round_fn(tables, world, method, setup, state, active, lengths, generator,
                                              truncate_on_reject)
        if first_round is None:
            first_round = accepted.clone()
        drafted_list, accepted_list = drafted.tolist(), accepted.tolist()
        for group, positions in groups:
            finish_round(controllers[group], setup, int(lengths[positions[0]]),
                         [estimates[active_list[i]] for i in positions],
                         [(drafted_list[i], accepted_list[i]) for i in positions])
        did_draft = drafted > 0
        new_caps = setup.rule.next_caps(state["caps"][active], drafted, accepted)
        state["caps"][active] = torch.where(did_draft, new_caps, state["caps"][active])
        _append_emitted(tokens, state["seq_len"], state["value"], active, emitted, tables.vocab)
    by_length: dict[int, int] = {}
    for controller in controllers:
        for chosen, rounds in controller.request_rounds_by_length.items():
            by_length[chosen] = by_length.get(chosen, 0) + rounds
    return ControlledSimulation(tokens, first_round, by_length)
