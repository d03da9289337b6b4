"""Seeded requests on an HSD server: the same seed gives the same tokens (``--hsd-request-seeds on``).

SGLang draws a request's randomness from keyed streams only under ``--enable-deterministic-
inference`` (GPU attention backends only): ``SamplingBatchInfo.sampling_seed`` then holds one seed
per request, and every draw of the request hashes (seed, position, column). Without it a request's
``seed`` is ignored. With ``--hsd-request-seeds on`` HSD sets ``sampling_seed`` on every batch of
its server itself (``install_request_seeds`` wraps ``SamplingBatchInfo.from_schedule_batch``):

* the request's own seed (OpenAI ``seed``, native ``sampling_seed``) when it gives one;
* otherwise a stream of its own, derived from the server's ``--random-seed`` and the request id
  (``request_stream_seed``; a hash, the same on every tensor-parallel rank).

Every random draw of the request then comes from its stream: the first token (SGLang's sampler,
``multinomial_with_seed``), chain drafts (``sample_draft_proposal`` / ``fast_sample`` with the
seed), the verification coins (``_seeded_verify_coins``), the exit level's draws
(``seeds.sub_round_seed``) and the sampled tree's noise (``tree_draft.round_noise``), each in a
domain of its own. A request with a seed is reproducible, with trees and with chains.

Needs SGLang's torch sampler (``--sampling-backend pytorch``, the CPU default): FlashInfer's takes
no seed. SGLang's seeded torch sampler refuses min-p; ``min_p_before_seeded_sampling`` applies it
first (zeroing the tokens below min_p times the row's maximum keeps exactly the set SGLang's
top-k / top-p / min-p keeps, and the seeded Gumbel draw needs no normalisation), so min-p requests
are served too.
"""

from __future__ import annotations

import hashlib
import os

import torch

from sglang_hsd.sampling import apply_min_p
from sglang_hsd.sglang_plugin.config import ALGORITHM_NAME

REQUEST_SEEDS_ENV = "SGLANG_HSD_REQUEST_SEEDS"
REQUEST_SEEDS_FLAG = "--hsd-request-seeds"
REQUEST_SEEDS_CHOICES = ("off", "on")
# Stream seeds stay non-negative int64 below 2^62: domain tags and indices are XORed in above.
_SEED_MASK = 2**62 - 1


def request_seeds_enabled() -> bool:
    """``--hsd-request-seeds`` (environment ``SGLANG_HSD_REQUEST_SEEDS``): "on" or "off" (default)."""
    value = os.environ.get(REQUEST_SEEDS_ENV, "off").strip().lower()
    if value not in REQUEST_SEEDS_CHOICES:
        raise ValueError(f"{REQUEST_SEEDS_FLAG} ({REQUEST_SEEDS_ENV}) must be on or off, got {value!r}")
    return value == "on"


def request_stream_seed(rid: str, sampling_seed: int | None, server_seed: int) -> int:
    """A request's stream seed: its own ``sampling_seed`` if given, else a hash of the server seed
    and the request id (stable across processes and ranks, unlike Python's ``hash``)."""
    if sampling_seed is not None:
        return int(sampling_seed)
    digest = hashlib.blake2b(f"{server_seed}:{rid}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & _SEED_MASK


def batch_stream_seeds(reqs, server_seed: int, device) -> torch.Tensor:
    """int64 [len(reqs)]: the stream seed of every request of a batch (SGLang ``Req`` objects)."""
    seeds = [request_stream_seed(str(r.rid), r.sampling_params.sampling_seed, server_seed) for r in reqs]
    return torch.tensor(seeds, dtype=torch.int64).to(device)


def _is_hsd_batch(batch) -> bool:
    algorithm = getattr(batch, "spec_algorithm", None)
    return algorithm is not None and str(getattr(algorithm, "name", algorithm)).upper() == ALGORITHM_NAME


def install_request_seeds() -> None:
    """Wrap ``SamplingBatchInfo.from_schedule_batch`` (seeds for HSD batches when the flag is on)
    and SGLang's torch top-k / top-p / min-p sampler (min-p before a seeded draw); idempotent."""
    from sglang.srt.layers import sampler
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

    original = SamplingBatchInfo.__dict__["from_schedule_batch"].__func__
    if getattr(original, "__sglang_hsd_original__", None) is None:
        wrapped = seeded_from_schedule_batch(original, server_seed)
        # The bound original, as the signature check reads it: (batch, vocab_size).
        wrapped.__sglang_hsd_original__ = SamplingBatchInfo.from_schedule_batch
        SamplingBatchInfo.from_schedule_batch = classmethod(wrapped)
    torch_sampler = sampler.top_k_top_p_min_p_sampling_from_probs_torch
    if getattr(torch_sampler, "__sglang_hsd_original__", None) is None:
        sampler.top_k_top_p_min_p_sampling_from_probs_torch = min_p_before_seeded_sampling(torch_sampler)


def server_seed() -> int:
    """The server's ``--random-seed`` (SGLang's runtime context), or 0 where the scheduler's
    context holds none (a server started without ``--random-seed``, as ``sglang-hsd serve``
    starts it). 0 is safe: a request without a seed of its own hashes the seed with its request
    id, a fresh random id per request that every tensor-parallel rank shares."""
    from sglang.srt.runtime_context import get_server_args

    seed = get_server_args().random_seed
    return 0 if seed is None else int(seed)


def seeded_from_schedule_batch(original, read_server_seed):
    """``from_schedule_batch(cls, batch, vocab_size)`` that gives an HSD batch its requests' stream
    seeds (``sampling_seed`` int64 [bs]) when ``--hsd-request-seeds`` is on and SGLang set none."""

    def from_schedule_batch(cls, batch, vocab_size):
        info = original(cls, batch, vocab_size)
        if info.sampling_seed is None and _is_hsd_batch(batch) and request_seeds_enabled():
            info.sampling_seed = batch_stream_seeds(batch.reqs, read_server_seed(), batch.device)
        return info

    return from_schedule_batch


def min_p_before_seeded_sampling(original):
    """SGLang's ``top_k_top_p_min_p_sampling_from_probs_torch`` that accepts min-p with a seed:
    the min-p filter is applied to ``probs`` first and the original runs without it (module
    docstring); unseeded calls are passed through unchanged."""

    def top_k_top_p_min_p_sampling_from_probs_torch(probs, top_ks, top_ps, min_ps, need_min_p_sampling,
                                                    sampling_seed, positions, **kwargs):
        if need_min_p_sampling and sampling_seed is not None:
            probs, need_min_p_sampling = apply_min_p(probs, min_ps.view(-1)), False
        return original(probs, top_ks, top_ps, min_ps, need_min_p_sampling, sampling_seed, positions, **kwargs)

    top_k_top_p_min_p_sampling_from_probs_torch.__sglang_hsd_original__ = original
    return top_k_top_p_min_p_sampling_from_probs_torch
