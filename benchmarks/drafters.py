"""Cached transformers models and drafters shared by ``bench_verify.py`` and ``bench_tree.py``.

``CachedLM`` keeps the KV cache of one token sequence and, when asked about a new sequence, keeps
the longest common prefix and runs only the rest (a draft's tokens are dropped on the next call the
same way); ``forward_scratch`` runs extra tokens (a draft tree, with its attention mask) on top of
the cached sequence without keeping them. ``exit_logits`` turns an early exit's hidden state into
logits. ``PrefixModel`` (``bench_tree``) holds one context and returns, memoised, the logits after
any token path from it (``node_logits``: one tree-masked forward for all new paths);
``Eagle3Prefix`` does the same for an EAGLE-3 head fed as the server feeds it. One row, no
batch: the benchmarks walk prompts one round at a time, and the per-token Python here is off any
serving path.

Drafters of ``bench_verify`` (``propose(context, num_draft, params, generator)`` -> tokens int64
[K], q float [K, V] over the target vocabulary, where q[j] is the exact law draft token j was
sampled from):

* ``ExitDrafter``: the target's hidden state after ``layer`` layers -> a trained exit head or,
  without one, final norm + LM head (logit lens). transformers runs the whole target on each
  draft token, so the drafter's cache doubles as the scorer's (``ExitDrafter.lm``).
* ``ModelDrafter``: a separate model with the target's tokenizer (``load_draft_model``).
* ``Eagle3Drafter``: an EAGLE-3 head reading the target's hidden states at its capture layers,
  fed as the runtime feeds it (``sglang_hsd/runtime/eagle3_drafter.py``): entries for committed
  positions read the target's fused aux hidden states, the first draft entry reads the target's
  features of the last committed position, later entries read the head's own previous output.
  Its q lives on the draft vocabulary and is scattered to target ids (``Eagle3Head.target_logits``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from sglang_hsd.runtime.eagle3 import Eagle3Head
from sglang_hsd.sampling import SamplingParams, logits_to_probs
from sglang_hsd.verify import tree_attention_mask

# Head KV slots per context: prompts are capped well below this by ``bench_verify``.
EAGLE_MAX_ENTRIES = 4096


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def exit_logits(hf, hidden: torch.Tensor, head=None) -> torch.Tensor:
    """Logits of an early exit of ``hf``: hidden [T, D] (after L layers) -> [T, V], through a
    trained exit head or, without one, the model's final norm + LM head (logit lens)."""
    if head is not None:
        return head(hidden.unsqueeze(0))[0]
    return hf.lm_head(hf.model.norm(hidden))


def load_draft_model(target, name: str):
    """A separate drafter (``load_model(name)``) after checking it shares ``target``'s tokenizer."""
    from sglang_hsd.runtime.loading import check_same_tokenizer, load_model

    drafter = load_model(name)
    check_same_tokenizer(target.tokenizer, drafter.tokenizer, name)
    return drafter


class CachedLM:
    """A transformers causal LM with a ``DynamicCache`` that tracks one growing sequence.

    ``hidden_layers``: hidden states to keep per position (index L = output of the first L layers,
    0 = embeddings), stored for every cached position in ``hidden`` [n, len(hidden_layers), D].
    ``keep_logits``: keep the logits of positions already run (from ``logits_from`` on), so a
    drafter and the scorer can share one cache without running a position twice.
    ``with_logits``: False runs the decoder stack without the LM head (an exit that only reads
    ``hidden``); the logits returned are then empty.
    """

    def __init__(self, hf, hidden_layers: tuple[int, ...] = (), keep_logits: bool = False,
                 with_logits: bool = True) -> None:
        if not with_logits and (keep_logits or not hidden_layers):
            raise ValueError("with_logits=False needs hidden_layers and keep_logits=False")
        self.hf = hf
        self.hidden_layers = tuple(hidden_layers)
        self.keep_logits = keep_logits
        self.with_logits = with_logits
        self.cache = self._new_cache()
        self.ids: list[int] = []
        self.hidden = torch.zeros(0, len(self.hidden_layers), hf.config.hidden_size)
        self.logits = torch.zeros(0, 0)  # [len(ids) - logits_from, V] when keep_logits
        self.logits_from = 1 << 62  # nothing stored yet

    def _new_cache(self):
        from transformers import DynamicCache

        return DynamicCache(config=self.hf.config)

    def truncate(self, length: int) -> None:
        """Forget every cached position from ``length`` on."""
        if length >= len(self.ids):
            return
        if length == 0:
            self.cache = self._new_cache()
        else:
            self.cache.crop(length)
        self.ids = self.ids[:length]
        self.hidden = self.hidden[:length]
        self.logits = self.logits[: max(0, length - self.logits_from)]

    def _forward(self, ids: list[int], logits_to_keep: int, **kwargs) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run ``ids`` after the cached positions (the cache grows by them). Returns logits float
        [logits_to_keep, V] of the last positions (empty without ``with_logits``) and hidden
        [len(ids), H, D] (None without ``hidden_layers``)."""
        inputs = dict(input_ids=torch.tensor([ids]), past_key_values=self.cache, use_cache=True,
                      output_hidden_states=bool(self.hidden_layers), **kwargs)
        if self.with_logits:
            out = self.hf(logits_to_keep=logits_to_keep, **inputs)
            logits = out.logits[0].float()
        else:
            out = self.hf.model(**inputs)
            logits = torch.zeros(0, 0)
        hidden = (torch.stack([out.hidden_states[layer][0] for layer in self.hidden_layers], 1)
                  if self.hidden_layers else None)
        return logits, hidden

    @torch.inference_mode()
    def feed(self, ids: list[int], need_from: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Bring the cache to ``ids``; return outputs for positions ``need_from .. len(ids) - 1``.

        Returns:
            logits float [len(ids) - need_from, V] and hidden [len(ids) - need_from, H, D]
            (H = len(hidden_layers)).
        """
        if not 0 <= need_from < len(ids):
            raise ValueError(f"need_from must be in [0, {len(ids)}), got {need_from}")
        start = _common_prefix(self.ids, ids)
        stored = self.keep_logits and self.logits_from <= need_from
        if not stored:
            start = min(start, need_from)
        self.truncate(start)
        if start < len(ids):
            first = start if stored else need_from  # first position whose logits are computed
            new_logits, new_hidden = self._forward(ids[start:], logits_to_keep=len(ids) - first)
            if new_hidden is not None:
                self.hidden = torch.cat([self.hidden, new_hidden])
            self.ids = list(ids)
            if not self.keep_logits:
                return new_logits, self.hidden[need_from:]
            if stored and self.logits.shape[0] == first - self.logits_from:
                self.logits = torch.cat([self.logits, new_logits]) if self.logits.numel() else new_logits
            else:
                self.logits, self.logits_from = new_logits, first
        return self.logits[need_from - self.logits_from :], self.hidden[need_from:]

    @torch.inference_mode()
    def forward_scratch(self, ids: list[int], **kwargs) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run ``ids`` after the cached sequence without keeping them (e.g. a draft tree with its
        ``attention_mask`` and ``position_ids``). Returns logits float [len(ids), V] (empty
        without ``with_logits``) and hidden [len(ids), H, D] (None without ``hidden_layers``)."""
        try:
            return self._forward(ids, logits_to_keep=len(ids), **kwargs)
        finally:
            self.cache.crop(len(self.ids))


class PrefixModel:
    """A transformers causal LM, or one of its early exits, holding the KV cache of one context.

    ``exit_layer`` None = the full model; else the hidden state after that many layers, through
    ``head`` (a trained exit head) or the final norm + LM head (logit lens). The cache is a
    ``CachedLM``; tree nodes run on top of it with the tree attention mask (``bench_tree``).
    """

    # "set/id" names of the prompts the drafter was trained on (none for a model or an exit here).
    trained_prompts: frozenset[str] = frozenset()

    def __init__(self, hf, exit_layer: int | None = None, head=None, vocab_size: int | None = None):
        self.exit_layer, self.head = exit_layer, head
        self.vocab_size = vocab_size
        layers = () if exit_layer is None else (exit_layer,)
        self.lm = CachedLM(hf, hidden_layers=layers, with_logits=exit_layer is None)
        self.length = 0
        self.memo: dict[tuple[int, ...], torch.Tensor] = {}  # token path from the root -> logits [V]

    @property
    def hf(self):
        return self.lm.hf

    @torch.inference_mode()
    def _logits(self, logits: torch.Tensor, hidden: torch.Tensor | None) -> torch.Tensor:
        """The model's (or exit's) logits [M, V], V cut to ``vocab_size``."""
        if self.exit_layer is not None:
            logits = exit_logits(self.lm.hf, hidden[:, 0], self.head)
        return logits[:, : self.vocab_size].float()

    def prefill(self, context: list[int]) -> torch.Tensor:
        """Run the context, keep its cache. Returns float [len(context), V]: logits after each token."""
        logits = self._logits(*self.lm.feed(context, 0))  # need_from 0: the whole context runs afresh
        self.length = len(context)
        return logits

    def crop(self, length: int) -> None:
        """Forget the cached context beyond ``length`` tokens."""
        self.lm.truncate(length)
        self.length = length

    def set_context(self, length: int, root_logits: torch.Tensor) -> None:
        """Make the first ``length`` cached tokens the context; root_logits float [V] follow it."""
        self.crop(length)
        self.memo = {(): root_logits}

    def tree_logits(self, tokens: list[int], parents: list[int], depths: list[int]) -> torch.Tensor:
        """Logits after each of M tree nodes appended to the cached context (root = its last token).

        tokens / parents / depths: M entries; parents index this list (-1 = child of the root),
        depths >= 1. Each node attends to the context and its own ancestors. Returns float [M, V];
        the cache is restored to the context afterwards.
        """
        mask = tree_attention_mask(torch.tensor([parents]))[0]  # [M, M]
        allowed = torch.cat([torch.ones(len(tokens), self.length, dtype=torch.bool), mask], dim=1)
        additive = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
        positions = torch.tensor([[self.length - 1 + d for d in depths]])
        return self._logits(*self.lm.forward_scratch(tokens, attention_mask=additive.view(1, 1, *allowed.shape),
                                                     position_ids=positions))

    @torch.inference_mode()
    def path_logits(self, context: list[int], paths: list[tuple[int, ...]]) -> torch.Tensor:
        """Reference: logits after context + path, one plain forward per path (no cache). [M, V]."""
        rows = []
        for path in paths:
            ids = context + list(path)
            fresh = CachedLM(self.lm.hf, self.lm.hidden_layers, with_logits=self.lm.with_logits)
            rows.append(self._logits(*fresh.feed(ids, len(ids) - 1))[-1])
        return torch.stack(rows)


def load_eagle3_head(target, folder: str = ""):
    """The EAGLE-3 head of ``target`` (a ``LoadedModel``): ``folder`` or, when empty, the trained
    head of ``sglang-hsd train-heads --eagle3`` in the heads cache. Returns (head, folder)."""
    from sglang_hsd.assets.heads import heads_dir

    path = Path(folder) if folder else heads_dir(target.path.name) / "eagle3"
    if not (path / "model.safetensors").is_file():
        raise ValueError(f"no EAGLE-3 head in {path} (run sglang-hsd train-heads --model {target.path.name} "
                         "--no-exit --eagle3)")
    return Eagle3Head.from_pretrained(str(path), target.model), path


def head_entries(head: Eagle3Head, cache, ids: list[int], hidden: torch.Tensor) -> torch.Tensor:
    """Append one row's head entries reading ``ids`` [T] with fed hidden [T, D] to ``cache`` (at
    rotary position = slot); returns the head's outputs [T, D]."""
    if int(cache.lengths[0, 0]) + len(ids) > EAGLE_MAX_ENTRIES:
        raise ValueError(f"context too long for the EAGLE-3 bench cache ({EAGLE_MAX_ENTRIES} entries)")
    return head.forward_cached(torch.tensor([ids]), hidden.unsqueeze(0), cache, torch.tensor([len(ids)]))[0]


class Eagle3Prefix:
    """An EAGLE-3 head as ``bench_tree``'s drafter: the ``PrefixModel`` interface (``prefill``,
    ``set_context``, ``memo``, ``tree_logits``), fed as SGLang's EAGLE-3 worker feeds it.

    Head entry e reads token x_{e+1} and a hidden state for position e; its output gives the
    logits of x_{e+2}. A context of n tokens is a verified prefix whose last token (the root: the
    last round's bonus token) the target has not run: entries 0 .. n - 2 read the target's fused
    aux hidden states (its ``capture_layers``), entry n - 2's output is the root's q, and a tree
    node at depth d reads its token with its parent's output (the root's: entry n - 2's) as entry
    n - 2 + d, attending to the context's entries and its ancestors' (SGLang's draft loop feeds
    each beam its parent's hidden output: ``sglang_plugin/tree_draft.py``). The runtime's drafter
    and ``Eagle3Drafter`` here also run the target over the root first (one more target-fed
    entry); the server does not, and this class measures the server's trees.
    """

    def __init__(self, head: Eagle3Head, target_hf, vocab_size: int, trained_prompts: frozenset[str] = frozenset()):
        self.head, self.vocab_size = head, vocab_size
        self.trained_prompts = frozenset(trained_prompts)  # "set/id" names of the head's training prompts
        self.lm = CachedLM(target_hf, hidden_layers=tuple(head.capture_layers), with_logits=False)
        self.cache = head.new_cache(1, EAGLE_MAX_ENTRIES)
        self.out = torch.zeros(0, head.fc.out_features)  # [n - 1, D]: entry outputs of the context
        self.length = 0
        self.memo: dict[tuple[int, ...], torch.Tensor] = {}

    def _logits(self, out: torch.Tensor) -> torch.Tensor:
        return self.head.target_logits(out)[:, : self.vocab_size].float()

    @torch.inference_mode()
    def prefill(self, context: list[int]) -> torch.Tensor:
        """Run the context's entries. Returns float [len(context), V]: row i = the head's logits of
        the token after ``context[: i + 1]`` (row 0, which no entry gives, is zeros)."""
        n = len(context)
        if n < 2:
            raise ValueError("the EAGLE-3 drafter needs a context of at least 2 tokens")
        _, hidden = self.lm.feed(context, 0)  # [n, H, D]
        self.cache.truncate(torch.tensor([0]))
        self.out = head_entries(self.head, self.cache, context[1:], self.head.fuse(hidden[: n - 1].flatten(1)))
        self.length = n
        logits = self._logits(self.out)
        return torch.cat([logits.new_zeros(1, logits.shape[1]), logits])

    def set_context(self, length: int, root_logits: torch.Tensor) -> None:
        """Make the first ``length`` prefilled tokens the context; root_logits float [V] follow it."""
        if not 2 <= length <= self.out.shape[0] + 1:
            raise ValueError(f"length must be in [2, {self.out.shape[0] + 1}] (the prefilled context), got {length}")
        self.cache.truncate(torch.tensor([length - 1]))
        self.length = length
        self.memo = {(): root_logits}

    @torch.inference_mode()
    def tree_logits(self, tokens: list[int], parents: list[int], depths: list[int]) -> torch.Tensor:
        """The head's logits after each of M tree nodes (``PrefixModel.tree_logits``' arguments:
        parents index this list, -1 = a child of the root; depths >= 1). One entry per node, in
        depth-first order, so the cache holds exactly the node's ancestors when it runs. [M, V]."""
        base = self.length - 1  # the context's entries
        children: dict[int, list[int]] = {}
        for i, parent in enumerate(parents):
            children.setdefault(parent, []).append(i)
        outs: list[torch.Tensor | None] = [None] * len(tokens)
        stack = list(reversed(children.get(-1, [])))
        while stack:
            node = stack.pop()
            self.cache.truncate(torch.tensor([base + depths[node] - 1]))
            fed = self.out[base - 1] if parents[node] < 0 else outs[parents[node]]
            outs[node] = head_entries(self.head, self.cache, [tokens[node]], fed.unsqueeze(0))[0]
            stack.extend(reversed(children.get(node, [])))
        self.cache.truncate(torch.tensor([base]))
        return self._logits(torch.stack(outs))


def node_logits(model: "PrefixModel | Eagle3Prefix", paths: list[tuple[int, ...]]) -> torch.Tensor:
    """Logits after each token path from the root (() = the root itself). float [M, V].

    Paths not seen before in this context go through one tree forward (their ancestors included
    as inputs); results are memoised per context, so overlapping trees cost one forward per path.
    """
    index: dict[tuple[int, ...], int] = {}
    tokens, parents, depths = [], [], []
    for path in paths:
        if path in model.memo:
            continue
        for end in range(1, len(path) + 1):
            key = path[:end]
            if key not in index:
                index[key] = len(tokens)
                tokens.append(key[-1])
                parents.append(index.get(key[:-1], -1))
                depths.append(end)
    if tokens:
        rows = model.tree_logits(tokens, parents, depths)
        model.memo.update({path: rows[i] for path, i in index.items()})
    return torch.stack([model.memo[path] for path in paths])


def _sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    return int(torch.multinomial(probs, 1, generator=generator))


def _draft_chain(next_logits, context: list[int], num_draft: int, params: SamplingParams, generator):
    """Sample ``num_draft`` tokens one at a time; ``next_logits(ids)`` -> float [V], the logits of
    the token after ``ids``. Returns (tokens int64 [K], q float [K, V])."""
    draft, q_rows = [], []
    for _ in range(num_draft):
        q_rows.append(logits_to_probs(next_logits(context + draft).view(1, 1, -1), params)[0, -1])
        draft.append(_sample(q_rows[-1], generator))
    return torch.tensor(draft), torch.stack(q_rows)


class ExitDrafter:
    """Draft from the target's first ``layer`` layers (+ ``head``, or the logit lens)."""

    def __init__(self, hf, layer: int, head=None) -> None:
        if not 1 <= layer < hf.config.num_hidden_layers:
            raise ValueError(f"exit layer must be in [1, {hf.config.num_hidden_layers}), got {layer}")
        # The drafter runs the whole target on its draft tokens (transformers cannot stop at
        # layer L), so it shares its cache with the scorer: ``self.lm`` is the scorer too.
        self.lm = CachedLM(hf, hidden_layers=(layer,), keep_logits=True)
        self.head = head

    def _next_logits(self, ids: list[int]) -> torch.Tensor:
        _, hidden = self.lm.feed(ids, len(ids) - 1)
        return exit_logits(self.lm.hf, hidden[:, 0], self.head)[-1]

    @torch.inference_mode()
    def propose(self, context, num_draft, params: SamplingParams, generator):
        return _draft_chain(self._next_logits, context, num_draft, params, generator)


class ModelDrafter:
    """Draft from a separate causal LM (same tokenizer as the target)."""

    def __init__(self, hf) -> None:
        self.lm = CachedLM(hf)

    def _next_logits(self, ids: list[int]) -> torch.Tensor:
        return self.lm.feed(ids, len(ids) - 1)[0][-1]

    @torch.inference_mode()
    def propose(self, context, num_draft, params: SamplingParams, generator):
        return _draft_chain(self._next_logits, context, num_draft, params, generator)


class Eagle3Drafter:
    """Draft with an EAGLE-3 head over ``target`` (a ``CachedLM`` built with the head's
    ``capture_layers`` as ``hidden_layers``, shared with the scorer so each target position runs
    once).

    Head entry e reads token ``seq[e + 1]`` and a hidden state for position e, and its output
    predicts position e + 2; ``self.seq`` is the committed sequence whose entries are cached.
    """

    def __init__(self, head: Eagle3Head, target: CachedLM) -> None:
        if tuple(head.capture_layers) != target.hidden_layers:
            raise ValueError(f"target must keep the head's capture layers {head.capture_layers}, "
                             f"keeps {target.hidden_layers}")
        self.head, self.target = head, target
        self.cache = head.new_cache(1, EAGLE_MAX_ENTRIES)
        self.seq: list[int] = []

    def _entries(self) -> int:
        return int(self.cache.lengths[0, 0])

    def _run(self, ids: list[int], hidden: torch.Tensor) -> torch.Tensor:
        """Append entries reading ``ids`` [T] with fed hidden [T, D]; returns outputs [T, D]."""
        return head_entries(self.head, self.cache, ids, hidden)

    @torch.inference_mode()
    def propose(self, context, num_draft, params: SamplingParams, generator):
        n = len(context)
        if n < 2:
            raise ValueError("the EAGLE-3 drafter needs a context of at least 2 tokens")
        # The target's features for every committed position, the last one included.
        done = _common_prefix(self.target.ids, context)
        if done < n:
            self.target.feed(context, done)
        aux = self.target.hidden[:n].flatten(1)  # [n, 3 D]
        # Keep committed entries, but recompute entry n - 2: its output gives draft token 1.
        keep = min(_common_prefix(self.seq, context) - 1, n - 2)
        self.cache.truncate(torch.tensor([max(0, min(self._entries(), keep))]))
        start = self._entries()
        # Target-fed entries start .. n - 2 (committed), then entry n - 1 reading draft token 1.
        out = self._run(context[start + 1 : n], self.head.fuse(aux[start : n - 1]))[-1:]
        self.seq = list(context)
        draft, q_rows = [], []
        for j in range(num_draft):
            logits = self.head.target_logits(out[-1:])  # [1, V]
            q_rows.append(logits_to_probs(logits, params)[0])
            draft.append(_sample(q_rows[-1], generator))
            if j + 1 < num_draft:
                fed = self.head.fuse(aux[n - 1 : n]) if j == 0 else out[-1:]
                out = self._run([draft[-1]], fed)
        self.cache.truncate(torch.tensor([n - 1]))
        return torch.tensor(draft), torch.stack(q_rows)
