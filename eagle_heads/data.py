"""Training and evaluation data for heads: target hidden states on real prompts.

``collect_features`` takes chat-templated prompts, lets the target continue each one (batched
autoregressive decoding with the runtime, greedy for even rows and T=1 for odd rows, so both
regimes the heads are used in are represented), then runs the target once over every
prompt + continuation and keeps its hidden state after each requested number of layers.

Ragged layout (one convention for the whole module): sequences are concatenated along one
position axis; ``seq_indptr`` int64 [S + 1] starts at 0 and sequence ``s`` occupies positions
``seq_indptr[s] .. seq_indptr[s + 1] - 1``.

The final-layer hidden state (boundary ``N``, before the final norm) is always kept: the target's
distribution at a position is ``lm_head(norm(h_N))``, computed on the fly by the trainers so the
[P, V] teacher never has to be stored.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from sglang_hsd.runtime.model import CausalLM


@dataclass
class FeatureSet:
    """Target activations over a set of sequences.

    Fields:
        tokens: int64 [P], every sequence's tokens, concatenated.
        seq_indptr: int64 [S + 1], sequence offsets into the position axis.
        prompt_lens: int64 [S], prompt length of each sequence (the rest is the continuation).
        hidden: boundary b -> float32 [P, D], the hidden state after the target's first b layers
            (b = N is the last layer's output, before the final norm).
        meta: where the data came from (prompt sets, counts, generation settings).
    """

    tokens: torch.Tensor
    seq_indptr: torch.Tensor
    prompt_lens: torch.Tensor
    hidden: dict[int, torch.Tensor]
    meta: dict

    @property
    def num_positions(self) -> int:
        return int(self.tokens.numel())

    def save(self, path: str) -> None:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        torch.save(self.__dict__, path + ".tmp")
        os.replace(path + ".tmp", path)

    @classmethod
    def load(cls, path: str) -> "FeatureSet":
        return cls(**torch.load(path, weights_only=False))

    @classmethod
    def concat(cls, parts: list["FeatureSet"]) -> "FeatureSet":
        """One ``FeatureSet`` holding the sequences of ``parts`` in order (same boundaries).

        ``meta`` is the first part's, with ``names`` joined and ``seconds`` summed."""
        if not parts:
            raise ValueError("parts must hold at least one FeatureSet")
        bounds = set(parts[0].hidden)
        if any(set(p.hidden) != bounds for p in parts):
            raise ValueError(f"parts have different boundaries: {[sorted(p.hidden) for p in parts]}")
        lengths = torch.cat([p.seq_indptr[1:] - p.seq_indptr[:-1] for p in parts])
        indptr = torch.zeros(len(lengths) + 1, dtype=torch.long)
        indptr[1:] = lengths.cumsum(0)
        meta = dict(parts[0].meta)
        meta["names"] = [n for p in parts for n in p.meta.get("names", [])]
        meta["seconds"] = round(sum(p.meta.get("seconds", 0.0) for p in parts), 1)
        return cls(torch.cat([p.tokens for p in parts]), indptr, torch.cat([p.prompt_lens for p in parts]),
                   {b: torch.cat([p.hidden[b] for p in parts]) for b in bounds}, meta)

    def continuation_mask(self) -> torch.Tensor:
        """bool [P]: positions whose next token is a target continuation token (local position
        >= prompt length - 1), i.e. the positions a drafter is asked about during generation."""
        lengths = self.seq_indptr[1:] - self.seq_indptr[:-1]
        seq = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
        local = torch.arange(self.num_positions) - self.seq_indptr[seq]
        return local >= self.prompt_lens[seq] - 1

    def next_token_pairs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions t whose next position t + 1 lies in the same sequence, and t + 1.

        Returns two int64 [M] index tensors into the position axis.
        """
        valid = torch.ones(self.num_positions, dtype=torch.bool)
        valid[self.seq_indptr[1:] - 1] = False  # the last position of each sequence
        pos = valid.nonzero().squeeze(-1)
        return pos, pos + 1


def encode_prompt_sets(tokenizer, set_names: list[str], limit: int, max_prompt_tokens: int, offset: int = 0) -> tuple[list[list[int]], list[str]]:
    """Chat-templated prompts of ``set_names`` with at most ``max_prompt_tokens`` tokens.

    Takes up to ``limit`` prompts per set, skipping the first ``offset`` usable ones.
    Returns the token id lists and ``"set/id"`` names.
    """
    from sglang_hsd.assets.prompts import load_prompts

    ids, names = [], []
    for set_name in set_names:
        taken = skipped = 0
        for prompt in load_prompts(set_name, limit=(limit + offset) * 4, tokenizer=tokenizer):
            tokens = tokenizer(prompt.text, add_special_tokens=False)["input_ids"]
            if not 8 <= len(tokens) <= max_prompt_tokens:
                continue
            if skipped < offset:
                skipped += 1
                continue
            ids.append(tokens)
            names.append(f"{set_name}/{prompt.id}")
            taken += 1
            if taken == limit:
                break
    return ids, names


@torch.inference_mode()
def generate_continuations(target: CausalLM, prompts: list[list[int]], max_new_tokens: int, eos_token_id, batch_size: int = 16, seed: int = 0, progress: bool = True) -> list[list[int]]:
    """Target continuations (greedy for even rows, T=1 for odd rows), batched autoregressive
    decoding with the runtime (``batch_size`` 16 is the fastest on a CPU core; wider batches pay
    for padded attention). Returns one list per prompt."""
    from tqdm import tqdm

    from sglang_hsd.runtime.config import parse_levels
    from sglang_hsd.runtime.engine import SpeculativeGenerator
    from sglang_hsd.sampling import SamplingParams

    generator = SpeculativeGenerator(target, parse_levels("target"))
    out: list[list[int]] = []
    for start in tqdm(range(0, len(prompts), batch_size), desc="generate", disable=not progress):
        batch = prompts[start : start + batch_size]
        params = [SamplingParams(temperature=0.0 if (start + i) % 2 == 0 else 1.0) for i in range(len(batch))]
        result = generator.generate(batch, params, max_new_tokens, eos_token_id, seed=seed + start)
        out.extend(result.tokens)
    return out


@torch.inference_mode()
def target_hidden_states(target: CausalLM, tokens: list[int], boundaries: list[int]) -> dict[int, torch.Tensor]:
    """Hidden states [T, D] after each boundary (number of layers run) for one sequence."""
    bounds = sorted(set(boundaries) | {target.num_layers})
    cache = target.new_cache(1, len(tokens))
    hidden = target.embed(torch.tensor([tokens]))
    out, start = {}, 0
    for end in bounds:
        cache.lengths[start:end] = 0
        hidden = target.forward_layers(hidden, start, end, cache)
        out[end] = hidden[0].clone()
        start = end
    return out


def collect_features(target: CausalLM, tokenizer, set_names: list[str], num_prompts: int, boundaries: list[int], max_new_tokens: int = 96, max_prompt_tokens: int = 256, offset: int = 0, progress: bool = True, shard: tuple[int, int] = (0, 1), seed: int = 0) -> FeatureSet:
    """Prompts of ``set_names`` (``num_prompts`` per set) + target continuations -> ``FeatureSet``.

    ``shard = (i, n)`` keeps prompts i, i + n, i + 2n, ... (parallel collection in ``n``
    processes; ``FeatureSet.concat`` of the shards in order of i holds every prompt).
    ``meta["seconds"]`` is the wall time spent here.
    """
    import time

    from tqdm import tqdm

    begin = time.perf_counter()
    index, count = shard
    if not 0 <= index < count:
        raise ValueError(f"shard must be (i, n) with 0 <= i < n, got {shard}")
    prompts, names = encode_prompt_sets(tokenizer, set_names, num_prompts, max_prompt_tokens, offset)
    prompts, names = prompts[index::count], names[index::count]
    if max_new_tokens > 0:
        continuations = generate_continuations(target, prompts, max_new_tokens, tokenizer.eos_token_id, seed=seed + 1000 * index, progress=progress)
    else:
        continuations = [[] for _ in prompts]
    bounds = sorted(set(boundaries) | {target.num_layers})
    tokens, hidden = [], {b: [] for b in bounds}
    lengths = []
    for prompt, cont in tqdm(list(zip(prompts, continuations)), desc="hidden states", disable=not progress):
        seq = prompt + cont
        states = target_hidden_states(target, seq, bounds)
        tokens.append(torch.tensor(seq))
        for b in bounds:
            hidden[b].append(states[b])
        lengths.append(len(seq))
    indptr = torch.zeros(len(lengths) + 1, dtype=torch.long)
    indptr[1:] = torch.tensor(lengths).cumsum(0)
    return FeatureSet(
        tokens=torch.cat(tokens),
        seq_indptr=indptr,
        prompt_lens=torch.tensor([len(p) for p in prompts]),
        hidden={b: torch.cat(v) for b, v in hidden.items()},
        meta={"sets": set_names, "prompts_per_set": num_prompts, "offset": offset, "names": names,
              "max_new_tokens": max_new_tokens, "max_prompt_tokens": max_prompt_tokens,
              "continuations": "target, greedy (even rows) / T=1 (odd rows)" if max_new_tokens else "none (teacher forcing on the prompt)",
              "seconds": round(time.perf_counter() - begin, 1)},
    )
