"""Draft-tree layout helpers shared by the tree verifiers, the drafter and the attention mask.

Layout (SGLang's): per request, N nodes; node 0 is the root (the last verified token) and its
token is ``candidates[:, 0]``. ``retrive_next_token[b, n]`` is the first child of node n and
``retrive_next_sibling[b, n]`` the next child of n's parent, -1 meaning none. Children are listed
in the order they were drafted; the without-replacement verifiers rely on that order.
"""

from __future__ import annotations

import torch

NO_NODE = -1


def parents_from_links(next_token: torch.Tensor, next_sibling: torch.Tensor) -> torch.Tensor:
    """Parent of every node from first-child / next-sibling links. int64 [B, N], -1 for the root.

    Vectorised over the batch: a first child learns its parent directly, a later sibling copies
    its previous sibling's parent; N rounds of copying cover the longest sibling list.
    Nodes no link reaches (orphans) keep -1; ``check_tree_layout`` rejects those.
    """
    batch, num_nodes = next_token.shape
    node = torch.arange(num_nodes, device=next_token.device).expand(batch, num_nodes)
    parent = _scatter_links(next_token, node)
    prev_sibling = _scatter_links(next_sibling, node)
    has_prev = prev_sibling >= 0
    for _ in range(num_nodes):
        parent = torch.where(has_prev, parent.gather(1, prev_sibling.clamp_min(0)), parent)
    return parent


def depths_from_parents(parents: torch.Tensor) -> torch.Tensor:
    """Depth of every node (root 0). int64 [B, N]; assumes a valid tree."""
    depth = torch.zeros_like(parents)
    for _ in range(parents.shape[1]):
        depth = torch.where(parents >= 0, depth.gather(1, parents.clamp_min(0)) + 1, 0)
    return depth


def links_from_parents(parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """First child and next sibling (int64 [B, N], -1 none) from parents; children in index order."""
    num = parents.shape[1]
    slot = torch.arange(num, device=parents.device)
    child_of = parents.unsqueeze(-2) == slot.view(1, -1, 1)  # [B, n, m]: m is a child of n
    first = torch.where(child_of, slot, num).amin(-1)
    same_parent = (parents.unsqueeze(-1) == parents.unsqueeze(-2)) & (parents.unsqueeze(-1) >= 0)
    later = slot.view(1, 1, -1) > slot.view(1, -1, 1)
    sibling = torch.where(same_parent & later, slot, num).amin(-1)
    return torch.where(first < num, first, -1), torch.where(sibling < num, sibling, -1)


def _scatter_links(links: torch.Tensor, node: torch.Tensor) -> torch.Tensor:
    """out[b, links[b, n]] = n for every valid link; -1 elsewhere."""
    batch, num_nodes = links.shape
    out = torch.full((batch, num_nodes + 1), NO_NODE, dtype=torch.long, device=links.device)
    target = torch.where(links >= 0, links.long(), num_nodes)  # invalid links land in a spare column
    out.scatter_(1, target, node)
    return out[:, :num_nodes]


def check_tree_layout(next_token: torch.Tensor, next_sibling: torch.Tensor, name: str = "retrive_next_token",
                      num_kept: torch.Tensor | None = None) -> None:
    """Raise ``ValueError`` unless every request's links describe one tree rooted at node 0.

    Rejects: links outside [-1, N), a sibling for the root, cycles, a node reached twice (two
    parents, or a sibling list that revisits a node) and orphans (nodes unreachable from the root).
    ``num_kept`` (int [B], optional) declares filler: request b's tree is nodes 0..num_kept[b]
    and every later column must be filler, unlinked (both links -1) and unreachable (tree links
    stay inside [-1, num_kept[b] + 1)), as the level drafter leaves when q's support runs out.
    Walks each request on the host (validation only, never on the hot path).
    """
    if next_token.shape != next_sibling.shape or next_token.dim() != 2:
        raise ValueError(
            f"retrive_next_token and retrive_next_sibling must both be [B, N], got "
            f"{list(next_token.shape)} and {list(next_sibling.shape)}"
        )
    for label, links in (("retrive_next_token", next_token), ("retrive_next_sibling", next_sibling)):
        if links.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"{label} must be int64 (or int32), got dtype {links.dtype}")
    batch, num_nodes = next_token.shape
    kept = [num_nodes - 1] * batch if num_kept is None else _kept_counts(num_kept, batch, num_nodes)
    for b, (first, sibling) in enumerate(zip(next_token.tolist(), next_sibling.tolist())):
        size = kept[b] + 1
        _check_filler(b, first[size:], sibling[size:], size)
        _check_one_tree(b, first[:size], sibling[:size], size)


def _kept_counts(num_kept: torch.Tensor, batch: int, num_nodes: int) -> list[int]:
    if not isinstance(num_kept, torch.Tensor) or num_kept.dtype not in (torch.int64, torch.int32) \
            or tuple(num_kept.shape) != (batch,):
        raise ValueError(f"num_kept must be an int64 tensor of shape [B] = [{batch}], got "
                         f"{getattr(num_kept, 'dtype', type(num_kept))} {list(getattr(num_kept, 'shape', []))}")
    counts = num_kept.tolist()
    bad = [b for b, kept in enumerate(counts) if not 0 <= kept < num_nodes]
    if bad:
        raise ValueError(f"num_kept[{bad[0]}] = {counts[bad[0]]} is outside [0, {num_nodes})")
    return counts


def _check_filler(b: int, first: list[int], sibling: list[int], start: int) -> None:
    linked = [n for n, (child, nxt) in enumerate(zip(first, sibling)) if child != NO_NODE or nxt != NO_NODE]
    if linked:
        raise ValueError(f"request {b}: node {start + linked[0]} is filler (after num_kept) but has links")


def _check_one_tree(b: int, first: list[int], sibling: list[int], num_nodes: int) -> None:
    for label, links in (("retrive_next_token", first), ("retrive_next_sibling", sibling)):
        bad = [n for n, link in enumerate(links) if not -1 <= link < num_nodes]
        if bad:
            raise ValueError(f"{label}[{b}, {bad[0]}] = {links[bad[0]]} is outside [-1, {num_nodes})")
    if sibling[0] != NO_NODE:
        raise ValueError(f"retrive_next_sibling[{b}, 0] must be -1: the root has no siblings")
    seen = {0}
    stack = [0]
    while stack:
        node = stack.pop()
        child = first[node]
        while child != NO_NODE:
            if child in seen:
                raise ValueError(
                    f"request {b}: node {child} is reached twice (a cycle, two parents or a sibling "
                    f"list that revisits a node) in retrive_next_token / retrive_next_sibling"
                )
            seen.add(child)
            stack.append(child)
            child = sibling[child]
    if len(seen) != num_nodes:
        orphan = min(set(range(num_nodes)) - seen)
        raise ValueError(f"request {b}: node {orphan} is an orphan (not reachable from the root node 0)")
