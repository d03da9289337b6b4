"""Logits -> probabilities with temperature, top-k, top-p and min-p, the same way at every level.

Lossless speculative decoding reproduces the distribution the *target* would sample from, which is
the target's logits after the request's sampling parameters. The drafter's q and every
intermediate level's p must be transformed with the same parameters: a drafter sampled at T = 1
verified against a target at T = 0.7 is still lossless (q only affects speed), but an intermediate
level that forgot top-p would pass a wrong q upward and silently bias the output. Every level in
this project calls ``logits_to_probs`` with one ``SamplingParams``.

Order of operations (as SGLang's speculative verify and vLLM): temperature, then top-k, then
top-p on the renormalised top-k set, then softmax, then min-p: tokens whose probability is below
``min_p`` times the row's largest probability are dropped and the row is renormalised. Because
the largest token survives top-k and top-p and renormalising scales every entry alike, that
min-p set is the one SGLang's non-speculative sampler keeps (``top_k_top_p_min_p_sampling_from_
probs_torch``, which compares the same ratio on the unrenormalised probabilities).
Temperature 0 means greedy: the row becomes one-hot on the argmax.

Host synchronisation: which masks a batch needs is a per-batch decision. ``logits_to_probs``
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
    """

    top_k: bool
    top_p: bool
    min_p: bool
    all_greedy: bool
    any_greedy: bool

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
    """Apply temperature, top-k and top-p, then softmax, then min-p.

    Args:
        logits: float [B, V] or [B, T, V]; all T positions of row b use request b's parameters.
        params: one ``SamplingParams`` for every row, or ``BatchSamplingParams`` with [B] fields.
        filters: the steps the batch needs (``SamplingFilters``); None reads them from ``params``
            (host syncs). With it, no tensor is read back to the host.
    Returns:
        float32 probabilities with the shape of ``logits``.
    """
    if isinstance(params, SamplingParams):
        params = BatchSamplingParams.from_params([params] * logits.shape[0], logits.device)
    if params.temperature.shape[0] != logits.shape[0]:
        raise ValueError(
            f"params has {params.temperature.shape[0]} rows but logits has batch size {logits.shape[0]}"
        )
    if filters is None:
        filters = SamplingFilters.of(params, logits.shape[-1])
    squeeze = logits.dim() == 2
    x = logits.float().unsqueeze(1) if squeeze else logits.float()
    if filters.all_greedy:
        # Every row one-hot on its argmax: the masks and softmax below would be discarded (top-k /
        # top-p / min-p keep the maximum, so the argmax is the same).
        probs = _one_hot_argmax(x)
        return probs.squeeze(1) if squeeze else probs
    temperature = torch.where(params.temperature > 0, params.temperature, 1.0).view(-1, 1, 1)
    x = x / temperature
    # Sorting a 50k-150k vocabulary is the expensive part: skip the masks no row asks for.
    if filters.top_k:
        x = _mask_top_k(x, params.top_k)
    if filters.top_p:
        x = _mask_top_p(x, params.top_p)
    probs = torch.softmax(x, dim=-1)
    if filters.min_p:
        probs = apply_min_p(probs, params.min_p)
    if filters.any_greedy:
        greedy = (params.temperature == 0).view(-1, 1, 1)
        probs = torch.where(greedy, _one_hot_argmax(x), probs)
    return probs.squeeze(1) if squeeze else probs


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
    per_row = min_p.to(probs.dtype).view(-1, *([1] * (probs.dim() - 1)))
    threshold = probs.amax(dim=-1, keepdim=True) * per_row
    kept = probs.masked_fill(probs < threshold, 0.0)
    # Renormalise only the rows min-p applies to, so rows without it keep their exact values.
    return torch.where(per_row > 0, kept / kept.sum(-1, keepdim=True), probs)


def _one_hot_argmax(x: torch.Tensor) -> torch.Tensor:
    """float32 one-hot rows on the argmax of ``x`` [..., V] (the first index among ties); built
    with a scatter, not ``one_hot``, which checks the indices on the host."""
    return torch.zeros(x.shape, dtype=torch.float32, device=x.device).scatter_(-1, x.argmax(-1, keepdim=True), 1.0)


def _mask_top_k(x: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    vocab = x.shape[-1]
    k = torch.where((top_k <= 0) | (top_k > vocab), vocab, top_k).view(-1, 1, 1)
    sorted_desc = torch.sort(x, dim=-1, descending=True).values
    kth = sorted_desc.gather(-1, (k - 1).expand(*x.shape[:-1], 1))
    return x.masked_fill(x < kth, float("-inf"))


def _mask_top_p(x: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    sorted_x, order = torch.sort(x, dim=-1, descending=True)
    sorted_probs = torch.softmax(sorted_x, dim=-1)
    # Mass strictly before each token: a token is kept while that mass is < top_p, so the most
    # likely token is always kept and the kept set is the smallest reaching top_p. Rows with
    # top_p = 1 keep everything (rounding can push the tail's mass before to 1).
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    per_row = top_p.view(-1, 1, 1)
    drop_sorted = (mass_before >= per_row) & (per_row < 1)
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return x.masked_fill(drop, float("-inf"))
