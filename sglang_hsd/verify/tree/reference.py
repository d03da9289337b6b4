"""Tree (topk > 1) verification rules in plain torch: the CPU path and the kernels' oracle.

``hsd`` is traversal verification (Weng et al., arXiv 2505.12398) paired with the drafting mode.
Each node keeps a residual target Mb (initially its target row p) and draft row Ms (initially q)
and a weight w (root: always 1). Entering a child c of P sets w_c = min(1, w_P Mb_P(c) / Ms_P(c)).
Leaves of the current tree are tested in post-order (children in drafting order) with one coin:
accept -> emit the path to the leaf, then sample one token from the leaf's Mb; reject -> fold the
leaf into its parent P:

    r = max(0, w_P Mb_P - Ms_P),  S = sum(r),  w_P <- S / (S + 1 - w_P)  (0 when the denominator
    is 0: nothing left to resample),  Mb_P <- r / S,  Ms_P <- Ms_P without c, renormalised
    (``draft_mode="without-replacement"``; ``"iid"`` keeps Ms_P), delete c.

When P's last child is gone, P is a leaf and is tested next; the root always accepts. On a chain
this is block verification, i.e. chain ``hsd`` (same coins, same tokens).

``draft_mode="argmax-first"`` (``tree_draft.CHILD_SAMPLERS["argmax_first"]``): a node's first
child c_1 is q's argmax, a deterministic function of the node's path, and its later siblings are
drawn without replacement from q without c_1. Each child is tested against the proposal it was
drawn from: one-hot e_{c_1} for the first child (entering: w = min(1, w_P Mb_P(c_1)); a fold uses
r = max(0, w_P Mb_P - e_{c_1}), i.e. w_P Mb_P with c_1 zeroed) and, as without replacement, Ms_P
(q without the earlier siblings, renormalised) for the others; a fold of c_1 leaves
Ms_P = q without c_1, the later siblings' proposal. In ``rrs`` the first child is accepted with
probability Mb(c_1) and a rejection leaves Mb without c_1, renormalised. Why lossless: recursive
rejection is exact for any sequence of proposals in which candidate j's proposal is a function
of the path and of candidates 1 .. j - 1 (each test maps the residual r to
min(r, s) + the rejection mass times the new residual = r); a one-hot proposal is one such
(accept c_1 with r(c_1), otherwise r without c_1: their mixture is r). The same holds for the
folds of traversal verification; ``tests/tree_draft/test_exact.py`` enumerates the whole round
(TV < 1e-12 for both methods) and finds the pairing that tests c_1 against q, as if it had been
sampled, biased.

Why lossless: the exact-enumeration tests (``tests/verify/tree/test_exact.py``) compute the law of
the first 3 emitted tokens over repeated rounds for topk 2-3, depth 2-3, V 3-4 and context-
dependent p, q and find TV < 1e-12 to the target; the q update must match the drafting mode (the
same tests show the mismatched pairings are lossy). Cost per node: one entry (O(1)) and at most
one fold (O(V) on the parent's rows), so O(N V) per request, like one pass over the target rows.

Where it loses to ``target-only``: on deterministic top-k trees target-only is already optimal
(expected tokens = 1 + the target mass of every drafted path) and hsd cannot run there (the tree
is not a sample from q). Against the stock top-k tree + target-only with the same drafter the two
trees are scored differently: a top-k node is accepted with the target mass p(x) of q's top-k
tokens, a sampled one with roughly the overlap sum_x min(p(x), q(x)) (plus the residual for later
siblings). One child, p = (0.9, 0.1), q = (0.6, 0.4): top-k accepts 0.9, a sampled child 0.7. So
the stock tree wins wherever the drafter *ranks* the target's tokens right but is less confident
than the target, and sampling wins where q's ranking is wrong but q still covers the target's
tokens. On random tiny worlds sampled hsd wins on average and loses in 2 of 8 peaked worlds
(-0.28 and -0.14 tokens per round; ``tests/verify/tree/test_expected_accepted.py``). On
distributions recorded from real models (``benchmarks/bench_tree.py``, depth 3, tables in
``benchmarks/results/tree_*.md``) sampled hsd also wins on average in every (topk, T) measured
but one (Qwen2.5-Coder 0.5B -> 1.5B, topk 3, T = 0.6: -0.001 +- 0.070 over only 4 contexts, a
tie), and loses in single contexts, most often at T = 0.6 (SmolLM2 with its exit:16 head, topk 2:
hsd below the exact stock value in 8 of 18 contexts, 4 of them by more than 2 SE; in the exact
recorded tiny worlds 5 of 18). The likely reason is the first case above: the drafter's top-k
are the target's likely tokens but q is flatter than p, and T = 0.6 sharpens p's top token
(not checked context by context). hsd never fell below rrs in an exact world; with real rows at T = 0.6 the two
tie within the Monte Carlo error (the cap of block verification only helps when a path's ratio
p/q exceeds 1 and then falls, which sharper rows make rarer).

Other methods (one registry, ``TREE_METHODS`` in ``methods.py``): ``rrs`` top-down recursive
rejection sampling with real q (arXiv 2402.14160), ``target-only`` SGLang's
``tree_speculative_sampling_target_only`` semantics (nodes treated as one-hot, one coin per
accepted node walks its children by cumulative target mass, ``threshold_single = threshold_acc =
1``; lossless for any tree whose siblings are distinct), ``greedy`` (follow the argmax).

Every rule here is a ``TreeRule``: ``(TreeBatch, TreeUniforms) -> (accepted node int64 [B],
next-token weights float [B, V])``; ``api.verify_tree`` turns that into emitted tokens. Inputs are
assumed valid (``verify_tree`` checks them).
"""

from __future__ import annotations

import torch

from sglang_hsd.verify.tree.types import TreeBatch, TreeUniforms


def _nonempty_or(weights: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """A residual that rounding left empty falls back to the target row (as the chain verifier)."""
    return torch.where(weights.sum(-1, keepdim=True) > 0, weights, fallback)


def _remove_token(ms: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """Ms without ``token`` [B], renormalised (zero rows stay zero). float [B, V]."""
    kept = ms.scatter(1, token.unsqueeze(-1), 0.0)
    total = kept.sum(-1, keepdim=True)
    return torch.where(total > 0, kept / total.clamp_min(torch.finfo(kept.dtype).tiny), kept)


def _first_of_argmax_first(tree: TreeBatch, rows: torch.Tensor, node: torch.Tensor, parent: torch.Tensor) -> torch.Tensor:
    """bool [R]: node ``node`` [R] of batch row ``rows`` [R] is its parent's first child in an
    argmax-first tree (drafted from the one-hot row at its token); all False otherwise."""
    if not tree.argmax_first:
        return torch.zeros_like(node, dtype=torch.bool)
    return (tree.first_child[rows, parent] == node) & (node > 0)


def _fold(ms_parent: torch.Tensor, mb_parent: torch.Tensor, w_parent: torch.Tensor, parent: torch.Tensor,
          token: torch.Tensor, one_hot: torch.Tensor, remove_rejected: bool, tiny: float):
    """Fold rejected leaves into their parents (R rows): the parents' rows Ms, Mb float [R, V] and
    weight [R], the parent index and the leaf's token int64 [R], whether the leaf was drafted
    one-hot (bool [R]). Returns the parents' new (weight [R], Mb [R, V], Ms [R, V])."""
    proposal = torch.where(one_hot.unsqueeze(-1), torch.zeros_like(ms_parent).scatter(1, token.unsqueeze(-1), 1.0),
                           ms_parent)  # the row the leaf was drawn from
    residual = (w_parent.unsqueeze(-1) * mb_parent - proposal).clamp_min(0)  # old Ms, then drop the token
    mass = residual.sum(-1)
    denom = mass + 1.0 - w_parent
    weight = torch.where(parent == 0, 1.0, torch.where(denom > tiny, mass / denom.clamp_min(tiny), 0.0))
    mb = torch.where(mass.unsqueeze(-1) > tiny, residual / mass.clamp_min(tiny).unsqueeze(-1), residual)
    return weight, mb, _remove_token(ms_parent, token) if remove_rejected else ms_parent


def _fold_rejected(state, flat_parent, w_parent, parent, token, one_hot, reject, remove_rejected: bool, tiny: float,
                   only_rejected: bool) -> None:
    """Fold each rejected leaf (bool [B]) into its parent in place: ``state`` = (Mb, Ms float
    [B * N, V], weights float [B * N]), the parents' flat rows int64 [B] and weights [B], the
    leaves' parent index, token and one-hot flag [B]. ``only_rejected``: fold just those rows
    (host synchronisation); else fold every row and keep the rejected rows' folds (static)."""
    mb_flat, ms_flat, weight_flat = state
    if only_rejected:
        folding = reject.nonzero().squeeze(-1)
        if folding.numel():
            at = flat_parent[folding]
            weight_flat[at], mb_flat[at], ms_flat[at] = _fold(
                ms_flat[at], mb_flat[at], w_parent[folding], parent[folding], token[folding], one_hot[folding],
                remove_rejected, tiny)
        return
    mb_parent, ms_parent = mb_flat.index_select(0, flat_parent), ms_flat.index_select(0, flat_parent)
    folded_w, folded_mb, folded_ms = _fold(ms_parent, mb_parent, w_parent, parent, token, one_hot, remove_rejected, tiny)
    weight_flat.index_copy_(0, flat_parent, torch.where(reject, folded_w, w_parent))
    mb_flat.index_copy_(0, flat_parent, torch.where(reject.unsqueeze(-1), folded_mb, mb_parent))
    ms_flat.index_copy_(0, flat_parent, torch.where(reject.unsqueeze(-1), folded_ms, ms_parent))


def _compute_dtype(tree: TreeBatch) -> torch.dtype:
    return torch.promote_types(tree.target_probs.dtype, torch.float32)


def hsd_final_node(tree: TreeBatch, uniforms: TreeUniforms) -> tuple[torch.Tensor, torch.Tensor]:
    """Traversal verification as a batched state machine: one node entered or tested per step.

    Each node is entered at most once and tested at most once, so 2N steps finish every request
    with a fixed trip count. On an accelerator (and under ``torch.compile``) every step folds every
    row and keeps the folds of the rows that rejected (no host synchronisation: the loop can be
    captured); in eager CPU code, where a host synchronisation costs nothing, a step folds only
    the rows that rejected (the O(V) work), the same arithmetic on fewer rows: at batch 8 over
    49,152 tokens a (5, 4, 8) tree took 25 ms folding every row at every step.
    """
    dtype = _compute_dtype(tree)
    mb = tree.target_probs.to(dtype).clone()
    ms = tree.draft_probs.to(dtype).clone()
    batch, num_nodes, _ = mb.shape
    rows = torch.arange(batch, device=mb.device)
    weight = torch.zeros(batch, num_nodes, dtype=dtype, device=mb.device)
    weight[:, 0] = 1.0
    enter, test, done = 0, 1, 2
    first = tree.first_child[:, 0]
    node = first.clamp_min(0)
    phase = torch.where(first >= 0, enter, test)
    tiny = torch.finfo(dtype).tiny
    mb_flat, ms_flat, weight_flat = mb.view(-1, mb.shape[-1]), ms.view(-1, ms.shape[-1]), weight.view(-1)
    row_base = rows * num_nodes
    coins = uniforms.accept.to(dtype)
    # The static path on an accelerator and whenever the round is being compiled (a captured or
    # compiled round must not wait for the host: ``tests/tree_draft/test_capturable.py``).
    only_rejected = mb.device.type == "cpu" and not torch.compiler.is_compiling()
    for _ in range(2 * num_nodes):
        parent = tree.parents.gather(1, node.unsqueeze(-1)).squeeze(-1).clamp_min(0)
        token = tree.candidates.gather(1, node.unsqueeze(-1)).squeeze(-1)
        flat_parent, flat_node = row_base + parent, row_base + node
        w_parent, w_node = weight_flat.index_select(0, flat_parent), weight_flat.index_select(0, flat_node)
        one_hot = _first_of_argmax_first(tree, rows, node, parent)
        # Enter: the node's weight from its parent's current state (the proposal at its token:
        # 1 for a one-hot first child, Ms otherwise).
        ms_tok = torch.where(one_hot, 1.0, ms_flat[flat_parent, token])
        ratio = mb_flat[flat_parent, token] / ms_tok.clamp_min(tiny)
        entered = torch.where(ms_tok > 0, torch.clamp(w_parent * ratio, max=1.0), 0.0)
        entering = phase == enter
        w_node = torch.where(entering, entered, w_node)
        # Test a leaf of the current tree; the root always accepts.
        testing = phase == test
        accept = testing & ((node == 0) | (coins.gather(1, node.unsqueeze(-1)).squeeze(-1) < w_node))
        reject = testing & ~accept
        weight_flat.index_copy_(0, flat_node, w_node)
        _fold_rejected((mb_flat, ms_flat, weight_flat), flat_parent, w_parent, parent, token, one_hot, reject,
                       tree.remove_rejected, tiny, only_rejected)
        # Next state.
        child = tree.first_child.gather(1, node.unsqueeze(-1)).squeeze(-1)
        sibling = tree.next_sibling.gather(1, node.unsqueeze(-1)).squeeze(-1)
        next_node = torch.where(entering & (child >= 0), child, node)
        next_phase = torch.where(entering, torch.where(child >= 0, enter, test), phase)
        next_node = torch.where(reject, torch.where(sibling >= 0, sibling, parent), next_node)
        next_phase = torch.where(reject, torch.where(sibling >= 0, enter, test), next_phase)
        phase = torch.where(accept, done, next_phase)
        node = next_node
    target_rows = tree.target_probs.to(dtype)[rows, node]
    return node, _nonempty_or(mb[rows, node], target_rows)


def rrs_final_node(tree: TreeBatch, uniforms: TreeUniforms) -> tuple[torch.Tensor, torch.Tensor]:
    """Recursive rejection sampling, top-down; at most N children are tested per request."""
    dtype = _compute_dtype(tree)
    p = tree.target_probs.to(dtype)
    q = tree.draft_probs.to(dtype)
    rows = torch.arange(p.shape[0], device=p.device)
    node = torch.zeros_like(rows)
    mb, ms = p[:, 0].clone(), q[:, 0].clone()
    child = tree.first_child[:, 0]
    tiny = torch.finfo(dtype).tiny
    for _ in range(p.shape[1]):
        active = child >= 0
        c = child.clamp_min(0)
        token = tree.candidates[rows, c].unsqueeze(-1)
        one_hot = _first_of_argmax_first(tree, rows, c, node)  # the row the child was drafted from
        proposal = torch.where(one_hot.unsqueeze(-1), torch.zeros_like(ms).scatter(1, token, 1.0), ms)
        accept = active & (uniforms.accept[rows, c] * proposal.gather(1, token).squeeze(-1) < mb.gather(1, token).squeeze(-1))
        reject = active & ~accept
        residual = (mb - proposal).clamp_min(0)
        mass = residual.sum(-1, keepdim=True)
        rejected_mb = torch.where(mass > tiny, residual / mass.clamp_min(tiny), residual)
        rejected_ms = _remove_token(ms, token.squeeze(-1)) if tree.remove_rejected else ms
        mb = torch.where(accept.unsqueeze(-1), p[rows, c], torch.where(reject.unsqueeze(-1), rejected_mb, mb))
        ms = torch.where(accept.unsqueeze(-1), q[rows, c], torch.where(reject.unsqueeze(-1), rejected_ms, ms))
        node = torch.where(accept, c, node)
        child = torch.where(accept, tree.first_child[rows, c], torch.where(reject, tree.next_sibling[rows, c], child))
    return node, _nonempty_or(mb, p[rows, node])


def target_only_final_node(tree: TreeBatch, uniforms: TreeUniforms) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang's target-only walk: one coin per accepted node against the children's cumulative p.

    As SGLang's kernel: the coin of node n is ``uniforms.accept[:, n]``, child j is accepted when
    the coin falls below p(x_1) + ... + p(x_j), and when every child fails the next token comes
    from p with the children's tokens removed. The comparison is strict (SGLang: ``<=``) so that a
    coin of exactly 0 can never accept a child the target gives probability 0.
    """
    dtype = _compute_dtype(tree)
    p = tree.target_probs.to(dtype)
    rows = torch.arange(p.shape[0], device=p.device)
    node = torch.zeros_like(rows)
    child = tree.first_child[:, 0]
    cumulative = torch.zeros(p.shape[0], dtype=dtype, device=p.device)
    kept = torch.ones_like(p[:, 0], dtype=torch.bool)  # tokens of the node's children tried so far: False
    for _ in range(p.shape[1]):
        active = child >= 0
        c = child.clamp_min(0)
        token = tree.candidates[rows, c]
        reached = cumulative + p[rows, node, token]
        accept = active & (uniforms.accept[rows, node] < reached)
        reject = active & ~accept
        cumulative = torch.where(accept, 0.0, torch.where(reject, reached, cumulative))
        tried = kept.scatter(1, token.unsqueeze(-1), False)
        kept = torch.where(accept.unsqueeze(-1), True, torch.where(reject.unsqueeze(-1), tried, kept))
        node = torch.where(accept, c, node)
        child = torch.where(accept, tree.first_child[rows, c], torch.where(reject, tree.next_sibling[rows, c], child))
    row = p[rows, node]
    return node, _nonempty_or(row * kept, row)


def greedy_final_node(tree: TreeBatch, uniforms: TreeUniforms) -> tuple[torch.Tensor, torch.Tensor]:
    """Follow the child whose token is the target argmax; emit the argmax where none matches."""
    argmax = tree.target_probs.argmax(dim=-1)  # [B, N]
    rows = torch.arange(argmax.shape[0], device=argmax.device)
    node = torch.zeros_like(rows)
    child = tree.first_child[:, 0]
    for _ in range(argmax.shape[1]):
        active = child >= 0
        c = child.clamp_min(0)
        accept = active & (tree.candidates[rows, c] == argmax[rows, node])
        reject = active & ~accept
        node = torch.where(accept, c, node)
        child = torch.where(accept, tree.first_child[rows, c], torch.where(reject, tree.next_sibling[rows, c], child))
    return node, tree.target_probs[rows, node]
