"""Seeded requests on an HSD server: the same seed gives the same tokens, on the default server.

SGLang draws a request's randomness from keyed streams only under ``--enable-deterministic-
inference`` (GPU attention backends only): ``SamplingBatchInfo.sampling_seed`` then holds one seed
per request, and every draw of the request hashes (seed, position, column). Without it a request's
``seed`` is ignored. HSD servers honour it themselves (``--hsd-request-seeds``, default ``auto``:
on wherever SGLang's sampler takes seeds, its torch sampler, the CPU default):
``install_request_seeds`` wraps ``SamplingBatchInfo.from_schedule_batch`` so that an HSD batch in
which some request carries a seed (OpenAI ``seed``, native ``sampling_seed``) gets
``sampling_seed``: each request's own seed, and for the others a stream of their own derived from
the server's ``--random-seed`` (0 without one) and the request id (``request_stream_seed``; a hash,
the same on every tensor-parallel rank). Batches without a seeded request are untouched. SGLang
merges seeds only when both batches carry them, so ``ScheduleBatch.merge_batch`` seeds the side
without (``seeded_merge_batch``), and ``filter_batch`` drops the seeds once no request left carries
one (``seeded_filter_batch``).

A seeded batch is verified by the coupled rule (``verify/coupled.py`` through the verify hooks):
every token is the target's keyed Gumbel-max draw of its row, keyed by (seed, position, token id)
as SGLang's seeded sampler keys its draws, so a seeded request emits what plain seeded decoding
emits whatever was drafted: the draft lengths the adaptive controller picks from timings, its
batch-mates, an exit level or a lookup in between change its speed, never its text. The first token
comes from SGLang's own seeded sampler. Drafts are drawn with the same keys
(``coupled_draft_sample``: the draft that follows the token at position t is
``argmax(log q + G(seed, t, ·))``), which is what makes them agree with the target's draws. The unseeded requests of a seeded batch are
verified the same way for that round: their law is unchanged.

Needs SGLang's torch sampler (``--sampling-backend pytorch``, the CPU default): FlashInfer's takes
no seed (``auto`` is then off; ``on`` is refused). SGLang's seeded torch sampler refuses min-p;
``min_p_before_seeded_sampling`` applies it first (zeroing the tokens below min_p times the row's
maximum keeps exactly the set SGLang's top-k / top-p / min-p keeps, and the seeded Gumbel draw
needs no normalisation), so min-p requests are served too.
"""

from __future__ import annotations

import functools
import hashlib
import os

import torch

from sglang_hsd.sampling import apply_min_p
from sglang_hsd.sglang_plugin.config import ALGORITHM_NAME
from sglang_hsd.verify.coupled import keyed_draw

REQUEST_SEEDS_ENV = "SGLANG_HSD_REQUEST_SEEDS"
REQUEST_SEEDS_FLAG = "--hsd-request-seeds"
REQUEST_SEEDS_CHOICES = ("auto", "on", "off")
# Stream seeds stay non-negative int64 below 2^62: domain tags and indices are XORed in above.
_SEED_MASK = 2**62 - 1


def request_seeds_setting() -> str:
    """``--hsd-request-seeds`` (environment ``SGLANG_HSD_REQUEST_SEEDS``): auto (default), on or off."""
    value = os.environ.get(REQUEST_SEEDS_ENV, "auto").strip().lower()
    if value not in REQUEST_SEEDS_CHOICES:
        raise ValueError(f"{REQUEST_SEEDS_FLAG} ({REQUEST_SEEDS_ENV}) must be one of "
                         f"{', '.join(REQUEST_SEEDS_CHOICES)}, got {value!r}")
    return value


def sampler_takes_seeds(device: str | None, sampling_backend: str | None) -> bool:
    """True when SGLang's sampler of this server draws from seeds: its torch sampler, chosen by
    ``--sampling-backend pytorch`` or by default on CPU (FlashInfer's elsewhere)."""
    return sampling_backend == "pytorch" or (sampling_backend is None and device in ("cpu", None))


def request_seeds_enabled(device: str | None = "cpu", sampling_backend: str | None = None) -> bool:
    """Whether seeded requests are honoured on a server with this device and sampling backend:
    ``on``, or ``auto`` where the sampler takes seeds (``sampler_takes_seeds``)."""
    setting = request_seeds_setting()
    return setting == "on" or (setting == "auto" and sampler_takes_seeds(device, sampling_backend))


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
    """Wrap ``SamplingBatchInfo.from_schedule_batch`` (seeds for HSD batches with a seeded
    request), SGLang's draft draw ``spec_utils.fast_sample`` (``coupled_draft_sample``) and its
    torch top-k / top-p / min-p sampler (min-p before a seeded draw); idempotent."""
    from sglang.srt.layers import sampler
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
    from sglang.srt.speculative import spec_utils

    original = SamplingBatchInfo.__dict__["from_schedule_batch"].__func__
    if getattr(original, "__sglang_hsd_original__", None) is None:
        wrapped = seeded_from_schedule_batch(original, server_seed, seeds_honoured)
        # The bound original, as the signature check reads it: (batch, vocab_size).
        wrapped.__sglang_hsd_original__ = SamplingBatchInfo.from_schedule_batch
        SamplingBatchInfo.from_schedule_batch = classmethod(wrapped)
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    wrappers = {"merge_batch": lambda method: seeded_merge_batch(method, server_seed, seeds_honoured),
                "filter_batch": lambda method: seeded_filter_batch(method, seeds_honoured)}
    for name, wrap in wrappers.items():
        method = ScheduleBatch.__dict__[name]
        if getattr(method, "__sglang_hsd_original__", None) is None:
            setattr(ScheduleBatch, name, wrap(method))
    if not getattr(spec_utils.fast_sample, "__sglang_hsd_coupled__", False):
        spec_utils.fast_sample = coupled_draft_sample(spec_utils.fast_sample)
    torch_sampler = sampler.top_k_top_p_min_p_sampling_from_probs_torch
    if getattr(torch_sampler, "__sglang_hsd_original__", None) is None:
        sampler.top_k_top_p_min_p_sampling_from_probs_torch = min_p_before_seeded_sampling(torch_sampler)


def seeds_honoured() -> bool:
    """``request_seeds_enabled`` for the server of this process (SGLang's runtime context);
    False under ``--enable-deterministic-inference``, where SGLang seeds every batch itself."""
    from sglang.srt.runtime_context import get_server_args

    args = get_server_args()
    if getattr(args, "enable_deterministic_inference", False):
        return False
    return request_seeds_enabled(args.device, args.sampling_backend)


def _has_own_seed(reqs) -> bool:
    return any(req.sampling_params.sampling_seed is not None for req in reqs)


def server_seed() -> int:
    """The server's ``--random-seed`` (SGLang's runtime context), or 0 where the scheduler's
    context holds none (a server started without ``--random-seed``, as ``sglang-hsd serve``
    starts it). 0 is safe: a request without a seed of its own hashes the seed with its request
    id, a fresh random id per request that every tensor-parallel rank shares."""
    from sglang.srt.runtime_context import get_server_args

    seed = get_server_args().random_seed
    return 0 if seed is None else int(seed)


def seeded_from_schedule_batch(original, read_server_seed, read_enabled):
    """``from_schedule_batch(cls, batch, vocab_size)`` that gives an HSD batch its requests'
    stream seeds (``sampling_seed`` int64 [bs]) when one of its requests carries a seed,
    ``read_enabled()`` says seeds are honoured and SGLang set none."""

    def from_schedule_batch(cls, batch, vocab_size):
        info = original(cls, batch, vocab_size)
        if (info.sampling_seed is None and _is_hsd_batch(batch) and _has_own_seed(batch.reqs)
                and read_enabled()):
            info.sampling_seed = batch_stream_seeds(batch.reqs, read_server_seed(), batch.device)
        return info

    return from_schedule_batch


def seeded_merge_batch(original, read_server_seed, read_enabled):
    """``ScheduleBatch.merge_batch(self, other)`` that seeds the side without seeds when the other
    has them (SGLang's merge keeps ``sampling_seed`` only when both sides carry one: a seeded
    request joining a running batch would lose its seed, or the seeds would not match the rows)."""

    @functools.wraps(original)
    def merge_batch(self, other):
        infos = (self.sampling_info, other.sampling_info)
        if (_is_hsd_batch(self) and any(info.sampling_seed is not None for info in infos)
                and read_enabled()):
            for batch in (self, other):
                if batch.sampling_info.sampling_seed is None:
                    batch.sampling_info.sampling_seed = batch_stream_seeds(batch.reqs, read_server_seed(),
                                                                           batch.device)
        return original(self, other)

    merge_batch.__sglang_hsd_original__ = original
    return merge_batch


def seeded_filter_batch(original, read_enabled):
    """``ScheduleBatch.filter_batch`` that drops the batch's seeds once no request left in it
    carries a seed of its own (its unseeded requests go back to the configured verifier)."""

    @functools.wraps(original)
    def filter_batch(self, *args, **kwargs):
        original(self, *args, **kwargs)
        info = self.sampling_info
        if (info is not None and info.sampling_seed is not None and _is_hsd_batch(self)
                and not _has_own_seed(self.reqs) and read_enabled()):
            info.sampling_seed = None

    filter_batch.__sglang_hsd_original__ = original
    return filter_batch


def coupled_draft_sample(original):
    """``spec_utils.fast_sample`` whose seeded single draws on an HSD server take the target's
    keys: the HSD draft paths pass the position of the draft row's input token (the root's for a
    round's first draft), the key of the target's verify row that draws the same token, so the
    draw is ``keyed_draw(probs, seed, positions)`` (module docstring; the server test checks the
    alignment through acceptance). Everything else goes to ``original``.

    Returns ``(probs[r, X_r], X)``: float [R, 1] and int64 [R, 1], as SGLang's."""
    from sglang_hsd.sglang_plugin import verify_hook

    def fast_sample(probs, num_samples=1, *, sampling_seed=None, positions=None, draft_step=0):
        if (sampling_seed is None or num_samples != 1 or positions is None
                or not verify_hook.hsd_is_active()):
            return original(probs, num_samples, sampling_seed=sampling_seed, positions=positions,
                            draft_step=draft_step)
        index = keyed_draw(probs, sampling_seed.view(-1), positions.view(-1)).unsqueeze(1)
        return probs.gather(1, index), index

    fast_sample.__sglang_hsd_original__ = getattr(original, "__sglang_hsd_original__", original)
    fast_sample.__sglang_hsd_coupled__ = True
    return fast_sample


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
