"""An SGLang batch's sampling parameters, applied through ``sglang_hsd.sampling``.

SGLang keeps them in ``SamplingBatchInfo``: ``temperatures`` float [bs, 1], ``top_ks`` int32 [bs]
(``TOP_K_ALL`` = 2^30 when off; greedy requests run at temperature 1 with top_k 1), ``top_ps``
float [bs], ``min_ps`` float [bs] (0 when off), and which filters the batch needs as Python bools
(``need_top_k_sampling``, ``need_top_p_sampling``, ``need_min_p_sampling``). Every distribution
the plugin builds from logits goes through ``logits_to_probs`` with those parameters and flags,
so it reads nothing back to the host:

* the drafter's q of sampled trees (``sampling_probs``: the tree's every step, and the root's q
  that ``tree_draft.RootQHook`` records);
* the exit level's p (``exit_level.probs_like_sglang_verify``).

* the target rows HSD verifies against (``filter_target_rows``). SGLang's ``eagle_sample``
  builds them as softmax(logits / T), then ``top_k_renorm_prob``, then ``top_p_renorm_prob`` on
  the row renormalised after top-k, and no min-p: another law than its non-speculative sampler's
  whenever a request combines top-k with top-p or asks for min-p. Inside an HSD verify call the
  verify hooks let SGLang's two renormalisations pass the rows through
  (``verify_hook.make_deferred_renorm``) and ``filter_target_rows`` applies
  ``sampling.filter_probs`` to softmax(logits / T): the non-speculative law.

Imports no SGLang module: tests drive it with stand-ins for ``SamplingBatchInfo``.
"""

from __future__ import annotations

import torch

from sglang_hsd.sampling import BatchSamplingParams, SamplingFilters, filter_probs, logits_to_probs
from sglang_hsd.tree_draft.children import greedy_draft_q


def batch_params(sampling_info, repeats: int = 1, temperature_scale: float = 1.0,
                 requests: torch.Tensor | None = None) -> BatchSamplingParams:
    """``BatchSamplingParams`` of ``sampling_info``'s requests.

    Args:
        sampling_info: SGLang's ``SamplingBatchInfo`` (or a stand-in with its four tensors).
        repeats: rows per request (each request's rows contiguous).
        temperature_scale: S > 0; temperatures are multiplied by it.
        requests: int64 [A], which requests (default: all, in order).
    Returns:
        ``BatchSamplingParams`` with [A * repeats] rows; no row is greedy (SGLang's greedy rows
        are temperature 1, top_k 1).
    """
    fields = (sampling_info.temperatures.view(-1) * temperature_scale, sampling_info.top_ks.view(-1).long(),
              sampling_info.top_ps.view(-1).float(), sampling_info.min_ps.view(-1).float())
    params = BatchSamplingParams(*(f if requests is None else f[requests] for f in fields))
    return params if repeats == 1 else params.repeat_interleave(repeats)


def batch_filters(sampling_info) -> SamplingFilters:
    """The filters SGLang's flags say the batch needs (no host sync). No row is greedy in the
    sense of ``sglang_hsd.sampling`` (temperature 0): SGLang's greedy rows are top_k 1."""
    return SamplingFilters(top_k=bool(sampling_info.need_top_k_sampling),
                           top_p=bool(sampling_info.need_top_p_sampling),
                           min_p=bool(sampling_info.need_min_p_sampling),
                           all_greedy=False, any_greedy=False,
                           max_top_k=getattr(sampling_info, "max_top_k", None))


def sampling_probs(logits: torch.Tensor, sampling_info, repeats: int = 1,
                   greedy_plain: bool = False, temperature_scale: float = 1.0) -> torch.Tensor:
    """The requests' sampling distribution of ``logits``: ``logits_to_probs`` with each request's
    temperature, top-k, top-p and min-p.

    Args:
        logits: float [bs * repeats, V], rows of request b at b*repeats .. b*repeats + repeats - 1.
        sampling_info: SGLang's ``SamplingBatchInfo``.
        repeats: rows per request.
        greedy_plain: greedy rows (top_k == 1) get the drafter's plain softmax instead of their
            one-hot transform (the greedy-row rule of ``sglang_hsd.tree_draft.children``).
        temperature_scale: S; the transform runs at temperature T * S
            (``--hsd-draft-temperature-scale``, the drafter's level only).
    Returns:
        float32 [bs * repeats, V].
    """
    params = batch_params(sampling_info, repeats, temperature_scale)
    probs = logits_to_probs(logits, params, batch_filters(sampling_info))
    if greedy_plain:
        greedy = greedy_rows(sampling_info)
        probs = greedy_draft_q(probs, logits, greedy if repeats == 1 else greedy.repeat_interleave(repeats))
    return probs


def greedy_rows(sampling_info) -> torch.Tensor:
    """bool [bs]: rows that take the drafter's top-k (greedy requests: top_k == 1)."""
    return sampling_info.top_ks.view(-1) <= 1


def filter_target_rows(target_probs: torch.Tensor, sampling_info) -> torch.Tensor:
    """The target's verify rows under the requests' top-k, top-p and min-p (``sampling.
    filter_probs``: the non-speculative sampler's law); no host sync.

    Args:
        target_probs: float [bs, N, V], softmax(logits / T) of each request's N verify rows
            (``eagle_sample``'s rows with its renormalisations deferred).
        sampling_info: the batch's ``SamplingBatchInfo``.
    Returns:
        float [bs, N, V]; unchanged when no request has a filter.
    """
    return filter_probs(target_probs, batch_params(sampling_info), batch_filters(sampling_info))
