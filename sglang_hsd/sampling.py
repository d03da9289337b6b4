"""Logits -> probabilities with temperature, top-k and top-p, the same way at every level.

Lossless speculative decoding reproduces the distribution the *target* would sample from, which is
the target's logits after the request's sampling parameters. The drafter's q and every
intermediate level's p must be transformed with the same parameters: a drafter sampled at T = 1
verified against a target at T = 0.7 is still lossless (q only affects speed), but an intermediate
level that forgot top-p would pass a wrong q upward and silently bias the output. Every level in
this project calls ``logits_to_probs`` with one ``SamplingParams``.

Order of operations (as in SGLang / vLLM): temperature, then top-k, then top-p, then softmax.
Temperature 0 means greedy: the row becomes one-hot on the argmax.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling parameters.

    Fields:
        temperature: >= 0; 0 means greedy (one-hot on the argmax).
        top_k: keep the k most likely tokens; 0 or -1 disables.
        top_p: keep the smallest set of tokens with cumulative probability >= top_p; 1 disables.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1, 0 (disabled) or positive, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class BatchSamplingParams:
    """Sampling parameters of a batch as tensors. Each field is [B]: float32, int64, float32."""

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor

    @classmethod
    def from_params(cls, params: list[SamplingParams], device: torch.device | str = "cpu") -> "BatchSamplingParams":
        return cls(
            temperature=torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device),
            top_k=torch.tensor([p.top_k for p in params], dtype=torch.long, device=device),
            top_p=torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device),
        )

    def rows(self, idx: torch.Tensor) -> "BatchSamplingParams":
        """Parameters of rows ``idx`` (int64 [R]) only."""
        return BatchSamplingParams(self.temperature[idx], self.top_k[idx], self.top_p[idx])

    def repeat_interleave(self, repeats: int) -> "BatchSamplingParams":
        """Parameters for [B * repeats] rows (each request's rows contiguous)."""
        return BatchSamplingParams(
            self.temperature.repeat_interleave(repeats),
            self.top_k.repeat_interleave(repeats),
            self.top_p.repeat_interleave(repeats),
        )


def logits_to_probs(logits: torch.Tensor, params: BatchSamplingParams | SamplingParams) -> torch.Tensor:
    """Apply temperature, top-k and top-p, then softmax.

    Args:
        logits: float [B, V] or [B, T, V]; all T positions of row b use request b's parameters.
        params: one ``SamplingParams`` for every row, or ``BatchSamplingParams`` with [B] fields.
    Returns:
        float32 probabilities with the shape of ``logits``.
    """
    if isinstance(params, SamplingParams):
        params = BatchSamplingParams.from_params([params] * logits.shape[0], logits.device)
    if params.temperature.shape[0] != logits.shape[0]:
        raise ValueError(
            f"params has {params.temperature.shape[0]} rows but logits has batch size {logits.shape[0]}"
        )
    squeeze = logits.dim() == 2
    x = logits.float().unsqueeze(1) if squeeze else logits.float()
    greedy = (params.temperature == 0).view(-1, 1, 1)
    if bool(greedy.all()):
        # Every row one-hot on its argmax: the masks and softmax below would be discarded (top-k /
        # top-p keep the maximum, so the argmax is the same).
        probs = torch.nn.functional.one_hot(x.argmax(-1), x.shape[-1]).to(torch.float32)
        return probs.squeeze(1) if squeeze else probs
    temperature = torch.where(params.temperature > 0, params.temperature, 1.0).view(-1, 1, 1)
    x = x / temperature
    # Sorting a 50k-150k vocabulary is the expensive part: skip the masks no row asks for.
    # (One host sync each; cheap next to the sort it avoids.)
    if bool(((params.top_k > 0) & (params.top_k < x.shape[-1])).any()):
        x = _mask_top_k(x, params.top_k)
    if bool((params.top_p < 1).any()):
        x = _mask_top_p(x, params.top_p)
    probs = torch.softmax(x, dim=-1)
    if bool(greedy.any()):
        one_hot = torch.nn.functional.one_hot(x.argmax(-1), x.shape[-1]).to(probs.dtype)
        probs = torch.where(greedy, one_hot, probs)
    return probs.squeeze(1) if squeeze else probs


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
    # likely token is always kept and the kept set is the smallest reaching top_p.
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    drop_sorted = mass_before >= top_p.view(-1, 1, 1)
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return x.masked_fill(drop, float("-inf"))
