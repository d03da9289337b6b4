"""Batched Monte-Carlo runs of a real verifier on a ``TabularWorld``.

Where ``exact.py`` computes laws, this module *runs* ``verify_chain`` / ``verify_tree`` on many
sequences at once (drafting from q, verifying against p, appending what is emitted, repeating), so
the batched implementation itself, not only its math, can be compared with the exact target
distribution (``stats.chi_square_p_value``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_hsd.verify import verify_chain, verify_tree
from sglang_hsd.verify.oracles.full_tree_draft import sample_tree, topk_tree
from sglang_hsd.verify.oracles.exact import TabularWorld, prefix_offset


@dataclass
class SimulationResult:
    """Fields:
    prefixes: int64 [S, length], the first ``length`` tokens of each simulated sequence.
    first_round_accepted: int64 [S], accepted drafts in each sequence's first round.
    """

    prefixes: torch.Tensor
    first_round_accepted: torch.Tensor

    def prefix_counts(self, vocab_size: int) -> torch.Tensor:
        """Counts of each prefix, indexed by its base-V value. int64 [V ** length]."""
        length = self.prefixes.shape[1]
        weights = vocab_size ** torch.arange(length - 1, -1, -1)
        return torch.bincount(self.prefixes @ weights, minlength=vocab_size**length)


def simulate_chain(
    world: TabularWorld,
    method: str,
    num_draft: int,
    length: int,
    num_sequences: int,
    generator: torch.Generator,
    dtype: torch.dtype = torch.float32,
) -> SimulationResult:
    """Run speculative rounds until every sequence has ``length`` tokens.

    Every round drafts ``num_draft`` tokens from q for all unfinished sequences, verifies them in
    one ``verify_chain`` call and appends the emitted tokens.
    """
    vocab = world.vocab_size
    p_table = torch.as_tensor(world.target, dtype=dtype)
    q_table = torch.as_tensor(world.draft, dtype=dtype)
    offsets = torch.tensor([prefix_offset(vocab, n) for n in range(world.max_len + 1)])
    tokens = torch.zeros(num_sequences, length, dtype=torch.long)
    seq_len = torch.zeros(num_sequences, dtype=torch.long)
    value = torch.zeros(num_sequences, dtype=torch.long)  # base-V value of the committed prefix
    first_round = None
    while bool((seq_len < length).any()):
        active = (seq_len < length).nonzero().squeeze(-1)
        draft, draft_probs, target_probs = _draft_round(
            world, p_table, q_table, offsets, seq_len[active], value[active], num_draft, generator
        )
        result = verify_chain(draft, draft_probs, target_probs, method=method, generator=generator)
        if first_round is None:
            first_round = result.num_accepted.clone()
        _append_emitted(tokens, seq_len, value, active, result.tokens, vocab)
    return SimulationResult(tokens, first_round)


def _append_emitted(tokens, seq_len, value, active, emitted_rows, vocab) -> None:
    """Append each active sequence's emitted tokens (-1 padded [R, S]) up to its target length, in place."""
    length = tokens.shape[1]
    for slot in range(emitted_rows.shape[1]):
        emitted = emitted_rows[:, slot]
        write = (emitted >= 0) & (seq_len[active] < length)
        rows = active[write]
        tokens[rows, seq_len[rows]] = emitted[write]
        value[rows] = value[rows] * vocab + emitted[write]
        seq_len[rows] += 1


def _draft_round(world, p_table, q_table, offsets, seq_len, value, num_draft, generator):
    """Sample a draft from q and gather the q and p rows of every position. Shapes as verify_chain."""
    vocab = world.vocab_size
    if int(seq_len.max()) + num_draft > world.max_len:
        raise ValueError("the world's max_len is too small for this simulation length and num_draft")
    draft = torch.empty(seq_len.shape[0], num_draft, dtype=torch.long)
    q_rows, p_rows = [], []
    cur_value, cur_len = value.clone(), seq_len.clone()
    for t in range(num_draft + 1):
        code = offsets[cur_len] + cur_value
        p_rows.append(p_table[code])
        if t == num_draft:
            break
        q_row = q_table[code]
        q_rows.append(q_row)
        draft[:, t] = torch.multinomial(q_row, 1, generator=generator).squeeze(-1)
        cur_value = cur_value * vocab + draft[:, t]
        cur_len = cur_len + 1
    return draft, torch.stack(q_rows, 1), torch.stack(p_rows, 1)


def target_prefix_probs(world: TabularWorld, length: int) -> torch.Tensor:
    """Exact target probabilities of every ``length``-token prefix, indexed by base-V value. [V ** length]."""
    vocab = world.vocab_size
    probs = torch.ones(1, dtype=torch.float64)
    for position in range(length):
        # Rows of every prefix of this length, in base-V order.
        first = prefix_offset(vocab, position)
        rows = torch.as_tensor(world.target[first : first + vocab**position])
        probs = (probs.unsqueeze(-1) * rows).reshape(-1)
    return probs


def simulate_tree(
    world: TabularWorld,
    method: str,
    topk: int,
    depth: int,
    length: int,
    num_sequences: int,
    generator: torch.Generator,
    drafting: str = "without-replacement",
    dtype: torch.dtype = torch.float32,
    draft_fn=None,
    draft_mode: str | None = None,
) -> SimulationResult:
    """Tree version of ``simulate_chain``: each round drafts a full tree (``sample_tree`` or, for
    ``drafting="top-k"``, ``topk_tree``) and verifies it with one ``verify_tree`` call.

    ``draft_fn(q_fn, root_tokens, generator) -> DraftTree`` replaces the full-tree drafter (e.g.
    budgeted trees from ``tree/expand.py``, whose unused columns are unreachable, hence
    ``validate=False``); ``depth`` must bound its trees' depth. ``draft_mode``: what
    ``verify_tree`` is told (None: the one ``drafting`` names)."""
    vocab = world.vocab_size
    p_table = torch.as_tensor(world.target, dtype=dtype)
    q_table = torch.as_tensor(world.draft, dtype=dtype)
    offsets = torch.tensor([prefix_offset(vocab, n) for n in range(world.max_len + 1)])
    tokens = torch.zeros(num_sequences, length, dtype=torch.long)
    seq_len = torch.zeros(num_sequences, dtype=torch.long)
    value = torch.zeros(num_sequences, dtype=torch.long)
    first_round = None
    while bool((seq_len < length).any()):
        active = (seq_len < length).nonzero().squeeze(-1)
        if int(seq_len[active].max()) + depth > world.max_len:
            raise ValueError("the world's max_len is too small for this simulation length and depth")
        base_len, base_value = seq_len[active], value[active]

        def rows_of(table, paths):  # paths [B, M, d + 1]; column 0 is the root placeholder
            drafted = paths[..., 1:]
            place = vocab ** torch.arange(drafted.shape[-1] - 1, -1, -1)
            code_value = base_value[:, None] * vocab ** drafted.shape[-1] + (drafted * place).sum(-1)
            return table[offsets[base_len[:, None] + drafted.shape[-1]] + code_value]

        roots = torch.zeros(active.shape[0], dtype=torch.long)
        q_fn = lambda paths: rows_of(q_table, paths)  # noqa: E731
        if draft_fn is not None:
            tree = draft_fn(q_fn, roots, generator)
        elif drafting == "top-k":
            tree = topk_tree(q_fn, topk, depth, root_tokens=roots)
        else:
            tree = sample_tree(q_fn, topk, depth, generator, replacement=(drafting == "iid"), root_tokens=roots)
        target_probs = _node_rows(p_table, tree, base_len, base_value, offsets, vocab, depth)
        result = verify_tree(
            tree.candidates, tree.retrive_next_token, tree.retrive_next_sibling, tree.draft_probs, target_probs,
            method=method, generator=generator, validate=False,
            draft_mode=draft_mode or ("iid" if drafting == "iid" else "without-replacement"),
        )
        if first_round is None:
            first_round = result.num_accepted.clone()
        _append_emitted(tokens, seq_len, value, active, result.tokens, vocab)
    return SimulationResult(tokens, first_round)


def _node_rows(table, tree, base_len, base_value, offsets, vocab, depth) -> torch.Tensor:
    """Rows of ``table`` after the committed prefix plus each node's path. float [B, N, V]."""
    parents, tokens = tree.parents, tree.candidates
    path_value = torch.zeros_like(tokens)
    for _ in range(depth):  # after d rounds every node of depth <= d has its full path value
        path_value = torch.where(parents >= 0, path_value.gather(1, parents.clamp_min(0)) * vocab + tokens, 0)
    node_depth = tree.depths
    code = offsets[base_len[:, None] + node_depth] + base_value[:, None] * vocab**node_depth + path_value
    return table[code]

