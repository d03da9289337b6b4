"""End-to-end head training for a registered model: features -> training -> evaluation -> save.

``sglang-hsd train-heads`` (``eagle_heads/cli.py``) is a thin wrapper over these functions.
Everything lands under ``heads_dir(model)`` = ``<cache>/heads/<model>/``:

* ``features-train.pt``    ShareGPT + AlpacaEval prompts with target continuations
* ``features-heldout.pt``  MT-Bench prompts (held out, evaluation only)
* ``exit/``                exit heads (``exit_heads.save_exit_heads``) + ``train_state.pt``
* ``eagle3/``              EAGLE-3 head in SGLang's format (``eagle3.save_eagle3_head``)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from eagle_heads.data import FeatureSet, collect_features


@dataclass
class FeatureSpec:
    """Which prompts the features come from.

    Fields:
        train_sets / heldout_sets: prompt sets (``load_prompts`` names); held-out sets are never
            trained on.
        train_prompts / heldout_prompts: prompts taken per set.
        train_new_tokens / heldout_new_tokens: target continuation length per prompt (0 = teacher
            forcing on the prompt text alone; on this 2-core CPU the continuations of the
            training prompts cost more than the training itself, so the default trains on
            prompt text and evaluates on prompt + target continuation).
        max_prompt_tokens: prompts longer than this are skipped.
    """

    train_sets: list[str] = field(default_factory=lambda: ["sharegpt", "alpacaeval"])
    heldout_sets: list[str] = field(default_factory=lambda: ["mtbench"])
    train_prompts: int = 64
    heldout_prompts: int = 16
    train_new_tokens: int = 0
    heldout_new_tokens: int = 32
    max_prompt_tokens: int = 256


def heads_dir(model: str, cache_dir: str | None = None) -> Path:
    from sglang_hsd.assets.archives import resolve_cache_dir

    return resolve_cache_dir(cache_dir) / "heads" / model


def load_target(model: str):
    """(CausalLM, tokenizer) of a registered model, fetched on first use."""
    from transformers import AutoTokenizer

    from sglang_hsd.assets.fetch import fetch_model
    from sglang_hsd.runtime.model import CausalLM

    path = str(fetch_model(model))
    return CausalLM.from_pretrained(path).eval().requires_grad_(False), AutoTokenizer.from_pretrained(path)


def eagle3_capture_layers(num_layers: int) -> list[int]:
    """SGLang's default EAGLE-3 capture points [2, N // 2, N - 3]: the hidden state entering
    those layers, i.e. after that many layers (config ids = capture - 1)."""
    return [2, num_layers // 2, num_layers - 3]


def prepare_features(target, tokenizer, out: Path, spec: FeatureSpec, boundaries: list[int], progress: bool = True) -> tuple[FeatureSet, FeatureSet]:
    """Load (or collect and cache) the training and held-out ``FeatureSet``s."""
    result = []
    splits = (("train", spec.train_sets, spec.train_prompts, spec.train_new_tokens),
              ("heldout", spec.heldout_sets, spec.heldout_prompts, spec.heldout_new_tokens))
    for split, sets, count, new_tokens in splits:
        path = out / f"features-{split}-{'+'.join(sets)}-{count}x{new_tokens}.pt"
        if path.exists():
            features = FeatureSet.load(str(path))
            if set(boundaries) <= set(features.hidden):
                result.append(features)
                continue
        features = collect_features(target, tokenizer, sets, count, boundaries, new_tokens, spec.max_prompt_tokens, progress=progress)
        features.save(str(path))
        result.append(features)
    return result[0], result[1]


def train_and_save_exit_heads(target, model: str, train: FeatureSet, heldout: FeatureSet, layers: list[int], out: Path, budget_minutes: float, progress: bool = True) -> dict:
    """Train exit heads, evaluate them (greedy-agnostic 1-TV and top-1 at T=1), save; returns metrics."""
    from eagle_heads.exit_heads import evaluate_exit_heads, save_exit_heads, train_exit_heads

    heads, log = train_exit_heads(target, train, layers, budget_minutes=budget_minutes, checkpoint_dir=str(out), progress=progress)
    metrics = evaluate_exit_heads(target, heldout, heads)
    manifest = {
        "model": model,
        "budget_minutes": budget_minutes,
        "steps": log[-1]["step"] if log else 0,
        "train_data": train.meta | {"names": len(train.meta.get("names", [])), "positions": train.num_positions},
        "heldout_data": heldout.meta | {"names": len(heldout.meta.get("names", [])), "positions": heldout.num_positions},
        "heldout_metrics": metrics,
        "training_log": log,
    }
    save_exit_heads(str(out), heads, manifest)
    return metrics


def build_eagle3_head(target, train: FeatureSet, draft_vocab: int, seed: int = 0):
    """A target-initialised ``Eagle3Head`` (see ``eagle3_train``) and its ``Eagle3HeadConfig``."""
    from eagle_heads.eagle3 import Eagle3HeadConfig
    from eagle_heads.eagle3_train import init_head_from_target, select_draft_vocab
    from sglang_hsd.runtime.eagle3 import Eagle3Head

    captures = eagle3_capture_layers(target.num_layers)
    kept = select_draft_vocab(target, train, draft_vocab)
    config = Eagle3HeadConfig.for_target(target.config, len(kept), aux_layer_ids=[c - 1 for c in captures])
    head = Eagle3Head(config.to_hf_dict(), target)
    init_head_from_target(head, target, kept, seed)
    return head, config


def train_and_save_eagle3(target, model: str, train: FeatureSet, heldout: FeatureSet, out: Path, budget_minutes: float, draft_vocab: int = 8192, progress: bool = True) -> dict:
    """Train an EAGLE-3 head (resuming from ``out/train_state.pt``), evaluate it on the held-out
    features, export it in SGLang's format to ``out`` with a ``training.json``; returns metrics."""
    import json

    from eagle_heads.eagle3 import save_eagle3_head
    from eagle_heads.eagle3_train import evaluate_eagle3, train_eagle3

    head, config = build_eagle3_head(target, train, draft_vocab)
    untrained = evaluate_eagle3(head, target, heldout)
    log = train_eagle3(head, target, train, budget_minutes=budget_minutes, checkpoint_dir=str(out), progress=progress)
    metrics = {"T=1": evaluate_eagle3(head, target, heldout), "untrained_T=1": untrained}
    save_eagle3_head(str(out), config, {k: v.detach().contiguous() for k, v in head.state_dict().items()})
    with open(out / "training.json", "w") as f:
        json.dump({"model": model, "budget_minutes": budget_minutes, "draft_vocab": draft_vocab,
                   "steps": log[-1]["step"] if log else 0, "heldout_metrics": metrics,
                   "train_positions": train.num_positions, "heldout_positions": heldout.num_positions,
                   "training_log": log}, f, indent=2)
    return metrics
