"""HSD verify results written into SGLang's verify outputs, and the results of rounds that drafted
nothing (``--hsd-adaptive`` chose plain decoding): what both verify hooks (``verify_hook.py``)
hand back to SGLang in the layout its own kernels use.
"""

from __future__ import annotations

import torch

from sglang_hsd.verify.chain.types import ChainVerifyResult
from sglang_hsd.verify.common import assemble_emitted, inverse_cdf_sample


def write_chain_result(predicts, accept_index, accept_token_num, retrive_index, result) -> None:
    """Store a ``ChainVerifyResult`` in SGLang's verify outputs, as its chain kernel does.

    Args:
        predicts: int32 [bs * (K + 1)]; ``predicts[retrive_index[b, j]]`` receives the token that
            follows node j of request b (j = 0 is the root) for j <= num_accepted[b].
        accept_index: int32 [bs, >= K + 1]; global node indices of the root and accepted drafts,
            -1 after them.
        accept_token_num: int32 [bs]; accepted draft tokens (bonus excluded).
        retrive_index: int [bs, K + 1]; global node index of each chain slot.
        result: ``ChainVerifyResult`` with num_accepted [bs] and tokens [bs, K + 1].
    """
    width = result.tokens.shape[1]
    num_accepted = result.num_accepted.to(torch.int64)
    slot = torch.arange(width, device=num_accepted.device).unsqueeze(0)
    emitted = slot <= num_accepted.unsqueeze(1)
    chain_index = retrive_index[:, :width].to(torch.int64)
    accept_index[:, :width] = torch.where(emitted, chain_index, -1).to(accept_index.dtype)
    predicts[chain_index[emitted]] = result.tokens[emitted].to(predicts.dtype)
    accept_token_num.copy_(num_accepted.to(accept_token_num.dtype))


def empty_chain_result(target_probs: torch.Tensor, sample: torch.Tensor) -> ChainVerifyResult:
    """A round that drafted nothing: one token per row from ``target_probs`` [bs, V] by inverse
    CDF with ``sample`` [bs] (the same draw a chain's bonus token makes), nothing accepted."""
    token = inverse_cdf_sample(target_probs, sample)
    num_accepted = torch.zeros_like(token)
    no_drafts = token.new_empty((token.shape[0], 0))
    return ChainVerifyResult(num_accepted, assemble_emitted(no_drafts, num_accepted, token))


def write_tree_result(predicts, accept_index, accept_token_num, retrive_index, result) -> None:
    """Store a ``TreeVerifyResult`` in SGLang's verify outputs, as its tree kernels do.

    Args:
        predicts: int32 [bs * N]; ``predicts[retrive_index[b, n]]`` receives the token that follows
            accepted node n (the next accepted draft, or the corrected / bonus token).
        accept_index: int32 [bs, >= D + 1]; global node indices of the accepted path, -1 after.
        accept_token_num: int32 [bs]; accepted draft tokens (bonus excluded).
        retrive_index: int [bs, N]; global node index of each verify node.
        result: ``TreeVerifyResult`` (accept_index in verify-node indices, num_accepted, tokens).
    """
    path = result.accept_index
    width = min(path.shape[1], accept_index.shape[1])
    accepted = path[:, :width] >= 0
    global_index = retrive_index.to(torch.int64).gather(1, path[:, :width].clamp_min(0))
    accept_index[:, :width] = torch.where(accepted, global_index, -1).to(accept_index.dtype)
    accept_index[:, width:] = -1
    predicts[global_index[accepted]] = result.tokens[:, :width][accepted].to(predicts.dtype)
    accept_token_num.copy_(result.num_accepted.to(accept_token_num.dtype))


def plain_round_tree(draft_probs: torch.Tensor):
    """The one-node tree of a round that drafted nothing (``--hsd-adaptive`` chose depth 0): the
    root alone, with the all-zero q [bs, 1, V] SGLang's tree sampler already hands in
    (``draft_probs``), which no method reads (a leaf's row), so the verifier draws the token
    from the target's row: plain decoding."""
    from sglang_hsd.sglang_plugin.tree_draft import DraftTree

    batch, device = draft_probs.shape[0], draft_probs.device
    none = torch.full((batch, 1), -1, dtype=torch.int64, device=device)
    return DraftTree(draft_probs, none, none.clone(), torch.zeros(batch, dtype=torch.int64, device=device))
