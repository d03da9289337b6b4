"""Logits -> probabilities with temperature, top-k, top-p and min-p, the same way at every level.

Lossless speculative decoding reproduces the distribution the *target* would sample from, which is
the target's logits after the request's sampling parameters, exactly as the server without
speculation applies them. The drafter's q and every intermediate level's p go through the same
transform: a drafter sampled at T = 1 verified against a target at T = 0.7 is still lossless (q
only affects speed), but a level whose filters differ from the target's passes a wrong q upward
and silently biases the output. Every level in this project calls ``logits_to_probs`` (or, on rows
already through temperature and softmax, ``filter_probs``) with one set of parameters.

Semantics: those of SGLang's non-speculative sampler (``top_k_top_p_min_p_sampling_from_probs_
torch``, the CPU server's; FlashInfer's joint top-k / top-p filter on GPU keeps the same set).
Temperature, then softmax of the whole row, then one sort of that row, and a token is kept when

* its rank in the sorted row is below top_k (ties broken by the sort, not kept together),
* the mass of the tokens sorted before it in the ORIGINAL row is at most top_p, and
* its probability is not below min_p times the row's largest probability;

the kept tokens are renormalised. Top-p is NOT applied to the row renormalised after top-k, which
is what SGLang's speculative verify (``top_k_renorm_prob`` then ``top_p_renorm_prob``) and vLLM do:
with top_k 40 and top_p 0.95 the two laws differ (total variation 0.017 on 60-token rows, up to 0.2
on random ones). Temperature 0 means greedy: the row becomes one-hot on the argmax.

Host synchronisation: which filters a batch needs is a per-batch decision. ``logits_to_probs``
reads it from the parameters (a few ``bool(tensor)`` syncs) unless the caller passes
``SamplingFilters`` it already knows as Python bools (SGLang's ``need_*_sampling`` flags, a
captured CUDA graph): then it never reads a tensor back to the host.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling parameters.

    Fields:
        temperature: >= 0; 0 means greedy (one-hot on the argmax).
        top_k: keep the k most likely tokens; 0 or -1 disables.
        top_p: keep the smallest set of tokens with cumulative probability >= top_p; 1 disables.
        min_p: in [0, 1]; drop tokens below ``min_p`` times the most likely token's probability
            (after top-k and top-p); 0 disables.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1, 0 (disabled) or positive, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1] (0 disables), got {self.min_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class BatchSamplingParams:
    """Sampling parameters of a batch as tensors, one entry per request.

    Fields:
        temperature: float32 [B]; top_k: int64 [B]; top_p: float32 [B]; min_p: float32 [B]
        (meanings as in ``SamplingParams``).
    """

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    min_p: torch.Tensor

    @classmethod
    def from_params(cls, params: list[SamplingParams], device: torch.device | str = "cpu") -> "BatchSamplingParams":
        return cls(
            temperature=torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device),
            top_k=torch.tensor([p.top_k for p in params], dtype=torch.long, device=device),
            top_p=torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device),
            min_p=torch.tensor([p.min_p for p in params], dtype=torch.float32, device=device),
        )

    def _map(self, fn) -> "BatchSamplingParams":
        return BatchSamplingParams(**{f.name: fn(getattr(self, f.name)) for f in dataclasses.fields(self)})

    def rows(self, idx: torch.Tensor) -> "BatchSamplingParams":
        """Parameters of rows ``idx`` (int64 [R]) only."""
        return self._map(lambda values: values[idx])

    def repeat_interleave(self, repeats: int) -> "BatchSamplingParams":
        """Parameters for [B * repeats] rows (each request's rows contiguous)."""
        return self._map(lambda values: values.repeat_interleave(repeats))


@dataclass(frozen=True)
class SamplingFilters:
    """Which steps of ``logits_to_probs`` a batch needs, as Python bools (no host sync to read).

    A step whose flag is False is skipped for every row, so a flag may be True for a batch that
    does not need it (slower, same result) but must not be False when a row needs it.

    Fields:
        top_k: some row keeps fewer tokens than the vocabulary (0 < top_k < V).
        top_p: some row has top_p < 1.
        min_p: some row has min_p > 0.
        all_greedy: every row has temperature 0.
        any_greedy: some row has temperature 0.
        max_top_k: None, or a bound on every row's top_k (SGLang's ``SamplingBatchInfo.
            max_top_k``): below V, the filters sort only that many leading entries
            (``torch.topk``, as SGLang's sampler does), not the whole row.
    """

    top_k: bool
    top_p: bool
    min_p: bool
    all_greedy: bool
    any_greedy: bool
    max_top_k: int | None = None

    @classmethod
    def of(cls, params: BatchSamplingParams, vocab_size: int) -> "SamplingFilters":
        """The flags ``params`` needs, read from its tensors (five host syncs)."""
        greedy = params.temperature == 0
        return cls(
            top_k=bool(((params.top_k > 0) & (params.top_k < vocab_size)).any()),
            top_p=bool((params.top_p < 1).any()),
            min_p=bool((params.min_p > 0).any()),
            all_greedy=bool(greedy.all()),
            any_greedy=bool(greedy.any()),
        )


def logits_to_probs(logits: torch.Tensor, params: BatchSamplingParams | SamplingParams,
                    filters: SamplingFilters | None = None) -> torch.Tensor:
    """Temperature, softmax, then the non-speculative sampler's filters (``filter_probs``).

    Args:
        logits: float [B, V] or [B, T, V]; all T positions of row b use request b's parameters.
        params: one ``SamplingParams`` for every row, or ``BatchSamplingParams`` with [B] fields.
        filters: the steps the batch needs (``SamplingFilters``); None reads them from ``params``
            (host syncs). With it, no tensor is read back to the host.
    Returns:
        float32 probabilities with the shape of ``logits``.
    """
    params = _batch_params(params, logits)
    if filters is None:
        filters = SamplingFilters.of(params, logits.shape[-1])
    x = logits.float()
    if filters.all_greedy:
        # Every row one-hot on its argmax: the filters and softmax would be discarded (they keep
        # the maximum, so the argmax is the same).
        return _one_hot_argmax(x)
    temperature = torch.where(params.temperature > 0, params.temperature, 1.0).float()
    probs = torch.softmax(x / _per_row(temperature, x), dim=-1)
    probs = filter_probs(probs, params, filters)
    if filters.any_greedy:
        greedy = _per_row(params.temperature == 0, x)
        probs = torch.where(greedy, _one_hot_argmax(x), probs)
    return probs


def filter_probs(probs: torch.Tensor, params: BatchSamplingParams | SamplingParams,
                 filters: SamplingFilters | None = None) -> torch.Tensor:
    """Top-k, top-p and min-p of the requests on rows already through temperature and softmax,
    with the semantics of SGLang's non-speculative sampler (module docstring): one sort of the
    original row; a token is kept when its rank is below top_k, the mass of the tokens sorted
    before it in the ORIGINAL row is at most top_p, and it is not below min_p times the row's
    largest probability; the kept tokens are renormalised. Temperature and greedy rows are not
    this function's business (``logits_to_probs`` handles them).

    Args:
        probs: float [B, V] or [B, T, V], each row a distribution; row b's T rows use request
            b's parameters.
        params: one ``SamplingParams`` for every row, or ``BatchSamplingParams`` with [B] fields.
        filters: the steps the batch needs; None reads them from ``params`` (host syncs).
    Returns:
        probabilities with the shape and dtype of ``probs``; rows of requests no filter applies
        to are returned unchanged (bit for bit).
    """
    params = _batch_params(params, probs)
    if filters is None:
        filters = SamplingFilters.of(params, probs.shape[-1])
    if not (filters.top_k or filters.top_p or filters.min_p):
        return probs
    vocab = probs.shape[-1]
    kept = probs
    # Sorting a 50k-150k vocabulary is the expensive part: only for top-k / top-p, once for both.
    if filters.top_k or filters.top_p:
        if filters.top_k and filters.max_top_k is not None and filters.max_top_k < vocab:
            # Every entry past max_top_k is dropped by top-k, and the mass before each of the
            # first max_top_k entries is the same in the whole sorted row.
            sorted_probs, order = torch.topk(probs, k=filters.max_top_k, dim=-1, sorted=True)
        else:
            sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        drop = torch.zeros_like(sorted_probs, dtype=torch.bool)
        if filters.top_k:
            rank = torch.arange(sorted_probs.shape[-1], device=probs.device)
            drop |= rank >= _per_row(_top_k_or_vocab(params.top_k, vocab), probs)
        if filters.top_p:
            # Mass before each token in the ORIGINAL row (not renormalised after top-k), as
            # SGLang's sampler computes it; rows with top_p = 1 keep everything (rounding can
            # push the tail's mass before above 1).
            mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
            top_p = _per_row(params.top_p.to(probs.dtype), probs)
            drop |= (mass_before > top_p) & (top_p < 1)
        kept = torch.zeros_like(probs).scatter(-1, order, sorted_probs.masked_fill(drop, 0.0))
    if filters.min_p:
        # The largest probability always survives top-k and top-p, so the threshold is the
        # original row's maximum times min_p, as in SGLang's sampler.
        kept = _drop_below_min_p(kept, probs.amax(dim=-1, keepdim=True), params.min_p)
    # Renormalise only the rows some filter applies to, so the others keep their exact values.
    return torch.where(_per_row(_filtered_rows(params, vocab), probs), kept / kept.sum(-1, keepdim=True), probs)


def _batch_params(params: BatchSamplingParams | SamplingParams, rows: torch.Tensor) -> BatchSamplingParams:
    if isinstance(params, SamplingParams):
        return BatchSamplingParams.from_params([params] * rows.shape[0], rows.device)
    if params.temperature.shape[0] != rows.shape[0]:
        raise ValueError(
            f"params has {params.temperature.shape[0]} rows but the input has batch size {rows.shape[0]}"
        )
    return params


def _per_row(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """[B] -> [B, 1] or [B, 1, 1], broadcasting against ``like`` [B, V] or [B, T, V]."""
    return values.view(-1, *([1] * (like.dim() - 1)))


def _top_k_or_vocab(top_k: torch.Tensor, vocab: int) -> torch.Tensor:
    """int64 [B]: each row's top_k, with the vocabulary size for rows without one (<= 0 or > V)."""
    top_k = top_k.long()
    return torch.where((top_k <= 0) | (top_k > vocab), vocab, top_k)


def _filtered_rows(params: BatchSamplingParams, vocab: int) -> torch.Tensor:
    """bool [B]: rows whose request asks for top-k, top-p or min-p."""
    return (_top_k_or_vocab(params.top_k, vocab) < vocab) | (params.top_p < 1) | (params.min_p > 0)


def apply_min_p(probs: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drop entries below ``min_p`` times their row's largest entry and renormalise those rows.

    Args:
        probs: float [B, V] or [B, T, V], each row a distribution (already through temperature,
            top-k and top-p); all T rows of request b use ``min_p[b]``.
        min_p: float [B] in [0, 1]; rows of requests with 0 are returned unchanged.
    Returns:
        float probabilities with the shape and dtype of ``probs``.
    """
    if min_p.shape[0] != probs.shape[0]:
        raise ValueError(f"min_p has {min_p.shape[0]} rows but probs has batch size {probs.shape[0]}")
    kept = _drop_below_min_p(probs, probs.amax(dim=-1, keepdim=True), min_p)
    # Renormalise only the rows min-p applies to, so rows without it keep their exact values.
    return torch.where(_per_row(min_p > 0, probs), kept / kept.sum(-1, keepdim=True), probs)


def _drop_below_min_p(probs: torch.Tensor, row_max: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """``probs`` [B, (T,) V] with the entries below ``min_p`` [B] times ``row_max`` [B, (T,) 1]
    zeroed (not renormalised)."""
    return probs.masked_fill(probs < row_max * _per_row(min_p.to(probs.dtype), probs), 0.0)


def _one_hot_argmax(x: torch.Tensor) -> torch.Tensor:
    """One-hot rows (``x``'s float dtype) on the argmax of ``x`` [..., V] (the first index among
    ties); built with a scatter, not ``one_hot``, which checks the indices on the host."""
    return torch.zeros(x.shape, dtype=x.dtype, device=x.device).scatter_(-1, x.argmax(-1, keepdim=True), 1.0)
