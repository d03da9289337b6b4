"""Training and evaluation of early-exit heads (tuned-lens style): a trained map from the
target's hidden state at layer L to next-token logits,

    ExitHead(h) = lm_head(final_norm(h + A h + b))

whose math and file format are ``sglang_hsd.runtime.exit_heads``'s (``ExitHead``, ``save_exit_heads``,
``load_exit_heads``); only the D x D matrix ``A`` and the bias ``b`` train.

Training starts (``init="lstsq"``) from the ridge least-squares map that sends the RMS-normalised
exit hidden state x = h_L / rms(h_L) to the normalised final one, x + A x ~ h_N / rms(h_N) (no
bias, so the fit is scale-free under the final norm: a few seconds of linear algebra that beats
hundreds of KL steps on a 2-core CPU), then minimises KL(p_final || p_exit) at temperature 1 over target hidden states on real
prompts (``data.FeatureSet``); acceptance of an exit level against the level above is
alpha = 1 - TV(p_exit, p_final) (docs/hierarchy.md), which ``evaluate_exit_heads`` reports
next to top-1 agreement, for the logit lens and the trained head.
"""

from __future__ import annotations

import os
import time

import torch

from sglang_hsd.runtime.exit_heads import ExitHead
from sglang_hsd.runtime.model import CausalLM


def exit_and_target_logprobs(target: CausalLM, head: ExitHead | None, hidden_exit: torch.Tensor, hidden_final: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """log-softmax of the exit's and the target's logits, float32 [M, V] each."""
    exit_logits = head(hidden_exit) if head is not None else target.lm_head(target.norm(hidden_exit))
    with torch.no_grad():
        final_logits = target.lm_head(target.norm(hidden_final))
    return torch.log_softmax(exit_logits.float(), -1), torch.log_softmax(final_logits.float(), -1)


def kl_final_exit(logp_exit: torch.Tensor, logp_final: torch.Tensor) -> torch.Tensor:
    """KL(p_final || p_exit) per row, float32 [M]."""
    return (logp_final.exp() * (logp_final - logp_exit)).sum(-1)


# ----------------------------------------------------------------------------- training
@torch.no_grad()
def lstsq_init(head: ExitHead, hidden_exit: torch.Tensor, hidden_final: torch.Tensor, ridge: float = 1e-3) -> None:
    """Set ``head.A`` to the ridge least-squares solution of x + A x ~ y (module doc), b = 0.

    Args:
        hidden_exit, hidden_final: float [M, D], the exit's and the last layer's hidden states.
    """
    x = hidden_exit.double() * torch.rsqrt(hidden_exit.double().pow(2).mean(-1, keepdim=True) + 1e-6)
    y = hidden_final.double() * torch.rsqrt(hidden_final.double().pow(2).mean(-1, keepdim=True) + 1e-6)
    gram = x.T @ x
    gram += ridge * gram.diagonal().mean() * torch.eye(gram.shape[0], dtype=gram.dtype)
    solution = torch.linalg.solve(gram, x.T @ (y - x))  # [D, D]: (y - x) ~ x @ solution
    head.A.copy_(solution.T.to(head.A.dtype))
    head.b.zero_()


def train_exit_heads(
    target: CausalLM,
    features,
    layers: list[int],
    budget_minutes: float = 10.0,
    max_steps: int | None = None,
    batch_positions: int = 128,
    lr: float = 3e-4,
    weight_decay: float = 0.0,
    checkpoint_dir: str | None = None,
    checkpoint_every_s: float = 60.0,
    seed: int = 0,
    progress: bool = True,
    log_every: int = 10,
    init: str = "lstsq",
) -> tuple[dict[int, ExitHead], list[dict]]:
    """Train one ``ExitHead`` per layer on ``features`` (a ``data.FeatureSet``) within a budget.

    All layers share each batch (and its teacher distribution). Stops at ``budget_minutes`` of
    wall time or ``max_steps``. With ``checkpoint_dir``, resumes from ``checkpoint_dir/train_state.pt``
    when present and writes it every ``checkpoint_every_s`` seconds and at the end.

    ``init``: ``"lstsq"`` (``lstsq_init`` on all training positions) or ``"zero"`` (logit lens).
    ``lr``: AdamW's first steps move every entry of ``A`` by about ``lr``; at 2e-3 the first
    20 steps undid the least-squares init (held-out continuation top-1 of exit:16 0.26 -> 0.20),
    hence the small default.

    Returns the heads and a log: dicts ``{step, seconds, kl[layer], one_minus_tv[layer]}`` on the
    training batches (moving average over ``log_every`` steps).
    """
    from tqdm import tqdm

    torch.manual_seed(seed)
    heads = {layer: ExitHead(target, layer) for layer in layers}
    if init == "lstsq":
        for layer, head in heads.items():
            lstsq_init(head, features.hidden[layer], features.hidden[target.num_layers])
    elif init != "zero":
        raise ValueError(f"init must be 'lstsq' or 'zero', got {init!r}")
    params = [p for head in heads.values() for p in head.trainable_parameters()]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    pos, _ = features.next_token_pairs()
    step, elapsed0, log = 0, 0.0, []
    state_path = os.path.join(checkpoint_dir, "train_state.pt") if checkpoint_dir else None
    if state_path and os.path.exists(state_path):
        state = torch.load(state_path, weights_only=False)
        for layer, head in heads.items():
            head.load_state_dict(state["heads"][layer])
        optimizer.load_state_dict(state["optimizer"])
        step, elapsed0, log = state["step"], state["seconds"], state["log"]

    def save_state(seconds):
        if state_path:
            os.makedirs(checkpoint_dir, exist_ok=True)
            torch.save({"heads": {l: h.state_dict() for l, h in heads.items()}, "optimizer": optimizer.state_dict(),
                        "step": step, "seconds": seconds, "log": log}, state_path + ".tmp")
            os.replace(state_path + ".tmp", state_path)

    gen = torch.Generator().manual_seed(seed + step)
    start, last_ckpt = time.perf_counter(), time.perf_counter()
    window: dict[int, list] = {layer: [] for layer in layers}
    bar = tqdm(total=max_steps, initial=step, desc="exit heads", disable=not progress)
    while True:
        seconds = elapsed0 + time.perf_counter() - start
        if seconds >= budget_minutes * 60 or (max_steps is not None and step >= max_steps):
            break
        batch = pos[torch.randint(len(pos), (batch_positions,), generator=gen)]
        with torch.no_grad():
            logp_final = torch.log_softmax(target.lm_head(target.norm(features.hidden[target.num_layers][batch])).float(), -1)
        optimizer.zero_grad(set_to_none=True)
        for layer, head in heads.items():
            logp_exit = torch.log_softmax(head(features.hidden[layer][batch]).float(), -1)
            loss = kl_final_exit(logp_exit, logp_final).mean()
            loss.backward()
            with torch.no_grad():
                tv = 0.5 * (logp_exit.exp() - logp_final.exp()).abs().sum(-1).mean()
            window[layer].append((float(loss.detach()), 1.0 - float(tv)))
        optimizer.step()
        step += 1
        bar.update(1)
        if step % log_every == 0:
            entry = {"step": step, "seconds": round(seconds, 1)}
            for layer in layers:
                kl = sum(w[0] for w in window[layer]) / len(window[layer])
                acc = sum(w[1] for w in window[layer]) / len(window[layer])
                entry[f"kl@{layer}"], entry[f"1-tv@{layer}"] = round(kl, 4), round(acc, 4)
                window[layer].clear()
            log.append(entry)
            bar.set_postfix({k: v for k, v in entry.items() if k.startswith("1-tv")})
        if time.perf_counter() - last_ckpt > checkpoint_every_s:
            save_state(seconds)
            last_ckpt = time.perf_counter()
    bar.close()
    save_state(elapsed0 + time.perf_counter() - start)
    for head in heads.values():
        head.eval().requires_grad_(False)
    return heads, log


# ----------------------------------------------------------------------------- evaluation
@torch.no_grad()
def evaluate_exit_heads(target: CausalLM, features, heads: dict[int, ExitHead], layers: list[int] | None = None, chunk: int = 512, temperature: float = 1.0, mask: torch.Tensor | None = None) -> dict[str, dict]:
    """Per exit layer on ``features`` (held-out): mean 1 - TV(p_exit, p_final) and top-1
    agreement, for the logit lens and (when a head is given) the trained head.

    ``temperature`` is applied to both distributions (1.0 = sampling at T=1). ``mask`` (bool
    [P], e.g. ``features.continuation_mask()``) restricts the positions; default all.
    Returns ``{"exit:L": {"lens_1-tv", "lens_top1", "head_1-tv", "head_top1", "positions"}}``.
    """
    layers = layers or sorted(heads)
    totals: dict[int, dict[str, float]] = {l: {} for l in layers}
    if mask is not None and mask.shape != (features.num_positions,):
        raise ValueError(f"mask must be bool [{features.num_positions}], got {tuple(mask.shape)}")
    index = mask.nonzero().squeeze(-1) if mask is not None else torch.arange(features.num_positions)
    count = max(int(index.numel()), 1)
    final_hidden = features.hidden[target.num_layers]
    for rows in index.split(chunk):
        final = target.lm_head(target.norm(final_hidden[rows])).float() / temperature
        p_final, top_final = torch.softmax(final, -1), final.argmax(-1)
        for layer in layers:
            variants = {"lens": None, "head": heads.get(layer)}
            for name, head in variants.items():
                if name == "head" and head is None:
                    continue
                hidden = features.hidden[layer][rows]
                logits = (head(hidden) if head is not None else target.lm_head(target.norm(hidden))).float() / temperature
                p_exit = torch.softmax(logits, -1)
                acc = (1 - 0.5 * (p_exit - p_final).abs().sum(-1)).sum()
                agree = (logits.argmax(-1) == top_final).sum()
                t = totals[layer]
                t[f"{name}_1-tv"] = t.get(f"{name}_1-tv", 0.0) + float(acc)
                t[f"{name}_top1"] = t.get(f"{name}_top1", 0.0) + float(agree)
    return {f"exit:{l}": {**{k: round(v / count, 4) for k, v in totals[l].items()}, "positions": int(index.numel())} for l in layers}
