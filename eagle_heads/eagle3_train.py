"""Training an EAGLE-3 head on CPU from target hidden states (``data.FeatureSet``).

* Draft vocabulary: the ``Vd`` target ids with the highest score = token count in the training
  data + the target's summed next-token probability over a sample of training positions (so
  likely-but-unseen tokens still get in); ``d2t``/``t2d`` follow from it.
* Init: ``lm_head`` = the target's LM-head rows of the draft vocabulary (frozen by default) and
  ``norm`` = the target's final norm, so the head only has to produce a hidden state the target's
  own head reads; ``fc`` starts as the identity on the deepest capture layer.
* Objective (training-time test, ``Eagle3Head.ttt_forward``): for ``steps`` unrolled draft steps,
  the cross-entropy of the head's draft-vocabulary distribution against the target's
  distribution restricted to the draft vocabulary (renormalised), step j weighted ``decay**j``.
* Windows: random windows of ``window`` positions (padding masked) from random sequences.

The training log reports, per step, 1 - TV against the *restricted* target distribution (an
upper bound); ``evaluate_eagle3`` measures it against the full target distribution.
"""

from __future__ import annotations

import os
import time

import torch

from sglang_hsd.runtime.eagle3 import Eagle3Head
from sglang_hsd.runtime.model import CausalLM


@torch.no_grad()
def select_draft_vocab(target: CausalLM, features, size: int, sample_positions: int = 2048, seed: int = 0) -> torch.Tensor:
    """Sorted int64 [size] target ids for the draft vocabulary."""
    vocab = target.vocab_size
    if size >= vocab:
        return torch.arange(vocab)
    score = torch.bincount(features.tokens, minlength=vocab).float()
    gen = torch.Generator().manual_seed(seed)
    sample = torch.randperm(features.num_positions, generator=gen)[:sample_positions]
    final = features.hidden[target.num_layers]
    for chunk in sample.split(512):
        score += torch.softmax(target.lm_head(target.norm(final[chunk])).float(), -1).sum(0)
    return score.topk(size).indices.sort().values


def init_head_from_target(head: Eagle3Head, target: CausalLM, kept: torch.Tensor, seed: int = 0, std: float = 0.02) -> None:
    """Random decoder layer, target-derived fc / norm / lm_head / d2t / t2d (see module doc)."""
    from eagle_heads.eagle3 import draft_vocab_maps

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in head.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=gen) * std)
        dim = target.hidden_size
        head.fc.weight[:, -dim:] += torch.eye(dim)
        head.norm.weight.copy_(target.norm.weight)
        head.lm_head.weight.copy_(target.lm_head.weight[kept])
        d2t, t2d = draft_vocab_maps(kept, target.vocab_size)
        head.d2t.copy_(d2t)
        head.t2d.copy_(t2d)


def make_windows(features, captures: list[int], final_layer: int, seqs: torch.Tensor, starts: torch.Tensor, window: int, steps: int):
    """Batch of training windows.

    Args:
        seqs, starts: int64 [B], sequence index and sequence-local start position s of each window.
    Returns:
        ids int64 [B, W + steps] (x_{s+1} ..), aux [B, W, n_aux * D], final hidden of the label
        positions [B, W + steps, D] (position s + 1 + i at index i), valid bool [B, W + steps]
        (label position inside the sequence).
    """
    base = features.seq_indptr[seqs]
    length = features.seq_indptr[seqs + 1] - base
    offsets = torch.arange(window + steps + 1)
    local = starts[:, None] + offsets  # [B, W + steps + 1]
    valid = local < length[:, None]
    index = base[:, None] + torch.minimum(local, length[:, None] - 1)
    aux = torch.cat([features.hidden[c][index[:, :window]] for c in captures], -1)
    return features.tokens[index[:, 1:]], aux, features.hidden[final_layer][index[:, 1:]], valid[:, 1:]


def _random_windows(features, batch: int, window: int, steps: int, gen: torch.Generator):
    lengths = features.seq_indptr[1:] - features.seq_indptr[:-1]
    seqs = torch.randint(len(lengths), (batch,), generator=gen)
    room = (lengths[seqs] - window - steps - 1).clamp_min(0)
    starts = (torch.rand(batch, generator=gen) * (room + 1).float()).long()
    return seqs, starts


def ttt_loss(head: Eagle3Head, target: CausalLM, ids, aux, final, valid, steps: int, decay: float = 0.8):
    """Weighted TTT cross-entropy and per-step (restricted) 1 - TV, as floats."""
    window = aux.shape[1]
    kept = head.draft_to_target
    outs = head.ttt_forward(ids, aux, steps)
    total, accs = 0.0, []
    for step, out in enumerate(outs):
        with torch.no_grad():
            p = torch.softmax((target.norm(final[:, step : step + window]) @ target.lm_head.weight[kept].T).float(), -1)
        logq = torch.log_softmax(head.draft_logits(out).float(), -1)
        mask = valid[:, step : step + window].float()
        loss = -((p * logq).sum(-1) * mask).sum() / mask.sum().clamp_min(1)
        total = total + decay**step * loss
        with torch.no_grad():
            acc = ((1 - 0.5 * (p - logq.exp()).abs().sum(-1)) * mask).sum() / mask.sum().clamp_min(1)
        accs.append(float(acc))
    return total, accs


def train_eagle3(
    head: Eagle3Head,
    target: CausalLM,
    features,
    budget_minutes: float = 30.0,
    max_steps: int | None = None,
    steps: int = 4,
    batch: int = 4,
    window: int = 64,
    lr: float = 1.5e-3,
    warmup: int = 20,
    train_lm_head: bool = False,
    checkpoint_dir: str | None = None,
    checkpoint_every_s: float = 120.0,
    seed: int = 0,
    progress: bool = True,
    log_every: int = 10,
) -> list[dict]:
    """Train ``head`` in place within ``budget_minutes`` (or ``max_steps``); resumable from
    ``checkpoint_dir/train_state.pt``. Returns the log ``{step, seconds, loss, 1-tv@j}``."""
    from tqdm import tqdm

    head.lm_head.weight.requires_grad_(train_lm_head)
    params = [p for p in head.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: min(1.0, (i + 1) / warmup))
    step, elapsed0, log = 0, 0.0, []
    path = os.path.join(checkpoint_dir, "train_state.pt") if checkpoint_dir else None
    if path and os.path.exists(path):
        state = torch.load(path, weights_only=False)
        head.load_state_dict(state["head"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        step, elapsed0, log = state["step"], state["seconds"], state["log"]

    def save(seconds):
        if path:
            os.makedirs(checkpoint_dir, exist_ok=True)
            torch.save({"head": head.state_dict(), "optimizer": optimizer.state_dict(), "schedule": schedule.state_dict(),
                        "step": step, "seconds": seconds, "log": log}, path + ".tmp")
            os.replace(path + ".tmp", path)

    captures, final_layer = head.capture_layers, target.num_layers
    gen = torch.Generator().manual_seed(seed + step)
    head.train()
    start = last = time.perf_counter()
    window_stats = []
    bar = tqdm(total=max_steps, initial=step, desc="eagle3", disable=not progress)
    while True:
        seconds = elapsed0 + time.perf_counter() - start
        if seconds >= budget_minutes * 60 or (max_steps is not None and step >= max_steps):
            break
        seqs, starts = _random_windows(features, batch, window, steps, gen)
        ids, aux, final, valid = make_windows(features, captures, final_layer, seqs, starts, window, steps)
        loss, accs = ttt_loss(head, target, ids, aux, final, valid, steps)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        step += 1
        bar.update(1)
        window_stats.append((float(loss.detach()), accs))
        if step % log_every == 0:
            entry = {"step": step, "seconds": round(seconds, 1),
                     "loss": round(sum(w[0] for w in window_stats) / len(window_stats), 4)}
            for j in range(steps):
                entry[f"1-tv@{j}"] = round(sum(w[1][j] for w in window_stats) / len(window_stats), 4)
            window_stats.clear()
            log.append(entry)
            bar.set_postfix({k: v for k, v in entry.items() if k != "step"})
        if time.perf_counter() - last > checkpoint_every_s:
            save(seconds)
            last = time.perf_counter()
    bar.close()
    save(elapsed0 + time.perf_counter() - start)
    head.eval().requires_grad_(False)
    return log


@torch.no_grad()
def evaluate_eagle3(head: Eagle3Head, target: CausalLM, features, steps: int = 4, temperature: float = 1.0, mask: torch.Tensor | None = None) -> dict:
    """Per draft step j on ``features`` (held-out): mean 1 - TV(q_j, p) against the *full* target
    distribution at ``temperature`` (q scattered from the draft vocabulary) and top-1 agreement
    (the greedy acceptance), with the previous drafts equal to the target's tokens (teacher
    forced, as in the TTT objective). Step j is draft position j + 1 of a chain.

    ``mask`` (bool [P], e.g. ``features.continuation_mask()``) keeps the predictions made from
    those target positions (the target distribution step j is compared with); default all.
    Returns ``{"step<j>": {"1-tv", "top1", "positions"}}``."""
    if mask is not None and mask.shape != (features.num_positions,):
        raise ValueError(f"mask must be bool [{features.num_positions}], got {tuple(mask.shape)}")
    lengths = (features.seq_indptr[1:] - features.seq_indptr[:-1]).tolist()
    sums = [[0.0, 0.0, 0] for _ in range(steps)]
    for seq, length in enumerate(lengths):
        window = length - steps - 1
        if window < 1:
            continue
        ids, aux, final, valid = make_windows(features, head.capture_layers, target.num_layers,
                                              torch.tensor([seq]), torch.tensor([0]), window, steps)
        base = int(features.seq_indptr[seq])
        for j, out in enumerate(head.ttt_forward(ids, aux, steps)):
            keep = torch.ones(window, dtype=torch.bool)
            if mask is not None:  # step j at entry t is compared with the target at position t + 1 + j
                keep = mask[base + 1 + j : base + 1 + j + window]
            p_logits = target.lm_head(target.norm(final[0, j : j + window][keep])).float() / temperature
            q_logits = head.target_logits(out[0][keep]) / temperature
            p, q = torch.softmax(p_logits, -1), torch.softmax(q_logits, -1)
            sums[j][0] += float((1 - 0.5 * (p - q).abs().sum(-1)).sum())
            sums[j][1] += float((p_logits.argmax(-1) == q_logits.argmax(-1)).sum())
            sums[j][2] += int(keep.sum())
    return {f"step{j}": {"1-tv": round(a / max(n, 1), 4), "top1": round(t / max(n, 1), 4), "positions": n} for j, (a, t, n) in enumerate(sums)}
