"""Layer-range forward for SGLang's Llama / Qwen2 model classes, and an exit head.

SGLang 0.5.23 runs a decoder stack as ``model.model.layers[i](positions, hidden, forward_batch,
capture_output=...)`` with the residual stream kept on ``forward_batch.residual_stream`` (the
``layer_boundary.residual`` package). ``run_layer_range`` runs layers [start, end) of that stack
for one ``ForwardBatch`` (its attention backend, KV pool and ``out_cache_loc``), like the
models' own ``forward_split_prefill``, but

* it can stop at any layer and hand the residual stream out as a ``StreamState`` (the pair
  SGLang's replay handoff uses: layer output ``value`` [T, D] and ``residual`` [T, D]);
* it can start at any layer from a ``StreamState`` -- possibly a row subset of an earlier one, for
  a different ``ForwardBatch`` over fewer tokens -- so layer ``start`` applies exactly the fused
  add + norm it would have applied in one uninterrupted forward;
* it records the EAGLE-3 aux hidden states of the layers in ``model.model.layers_to_capture``
  that fall in the range, by layer index.

No model file is forked: the layers, norms, LM head and residual helpers are SGLang's own.
``override_forward`` swaps ``model.forward`` for one call so the range runs inside SGLang's own
``ModelRunner.forward`` (attention metadata, forward context, padding). Works for every model
whose ``model.model`` has ``embed_tokens``, ``layers``, ``norm`` and ``layers_to_capture`` and
whose layers take ``capture_output`` (``LlamaForCausalLM``, ``Qwen2ForCausalLM`` and their
subclasses); ``check_layer_range_model`` refuses others.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch


@dataclass
class StreamState:
    """The residual stream between two layer ranges, for T tokens.

    Fields:
        value: [T, D], the last layer's output (or, when ``written``, the full stream).
        residual: [T, D] or None (None: ``value`` is the full stream).
        update: SGLang's residual update the next layer applies (plain add for these models).
        written: ``value`` already is the updated residual.
        aux: {layer index: [T, D]} EAGLE-3 captures taken so far (stream entering that layer).
    """

    value: torch.Tensor
    residual: torch.Tensor | None
    update: object
    written: bool
    aux: dict[int, torch.Tensor] = field(default_factory=dict)

    def select(self, rows: torch.Tensor) -> "StreamState":
        """The same state for the tokens ``rows`` (int64 [T']) only."""
        return StreamState(
            self.value[rows], None if self.residual is None else self.residual[rows],
            self.update, self.written, {k: v[rows] for k, v in self.aux.items()},
        )

    def overwrite(self, rows: torch.Tensor, other: "StreamState") -> None:
        """Replace the tokens ``rows`` (int64 [T']) by ``other``'s T' tokens, in place (a later
        forward over the same positions, e.g. an exit sub-round re-running rejected ones)."""
        if (other.residual is None) != (self.residual is None) or other.written != self.written:
            raise ValueError("cannot merge stream states of different layouts")
        self.value[rows] = other.value
        if self.residual is not None:
            self.residual[rows] = other.residual
        for layer, captured in other.aux.items():
            self.aux[layer][rows] = captured

    def hidden(self) -> torch.Tensor:
        """The full residual stream h = value + residual, [T, D] (what an exit head reads)."""
        if self.residual is None or self.written:
            return self.value
        if not getattr(self.update, "is_plain_add", True):
            raise NotImplementedError("exit heads need a plain residual add between layers")
        return self.value + self.residual


def check_layer_range_model(model) -> int:
    """Raise unless ``model`` is a causal LM this module can split; return its depth."""
    inner = getattr(model, "model", None)
    missing = [name for name in ("embed_tokens", "layers", "norm") if not hasattr(inner, name)]
    if missing or not hasattr(model, "lm_head") or not hasattr(model, "logits_processor"):
        raise TypeError(
            f"{type(model).__name__} has no Llama/Qwen2-style decoder stack "
            f"(missing {missing or ['lm_head/logits_processor']}); the HSD exit level supports "
            "LlamaForCausalLM, Qwen2ForCausalLM and their subclasses"
        )
    if getattr(inner, "start_layer", 0) != 0 or inner.end_layer != len(inner.layers):
        raise NotImplementedError("the HSD exit level does not support pipeline parallelism")
    return len(inner.layers)


def run_layer_range(model, positions: torch.Tensor, forward_batch, start: int, end: int, *,
                    input_ids: torch.Tensor | None = None,
                    state: StreamState | None = None) -> StreamState:
    """Run decoder layers [start, end) of ``model`` for the tokens of ``forward_batch``.

    Args:
        positions: int64 [T], each token's position.
        forward_batch: SGLang ``ForwardBatch`` over the same T tokens (attention metadata must be
            initialised for it, as ``ModelRunner.forward`` does; see ``override_forward``).
        start, end: 0 <= start < end <= number of layers.
        input_ids: int64 [T] when ``start == 0`` (embedded with the model's own embedding).
        state: the stream entering layer ``start`` when ``start > 0``.
    Returns:
        The stream leaving layer ``end - 1`` (``state.aux`` gains this range's captures).
    """
    from sglang.srt.layers.aux_hidden_states import AuxHiddenStateList
    from sglang.srt.layers.layer_boundary.residual import batch as residual_batch

    inner = model.model
    if not 0 <= start < end <= len(inner.layers):
        raise ValueError(f"layer range [{start}, {end}) outside the model's {len(inner.layers)} layers")
    aux = dict(state.aux) if state is not None else {}
    if start == 0:
        if input_ids is None:
            raise ValueError("input_ids is required when the range starts at layer 0")
        residual_batch.start(forward_batch)
        hidden = inner.embed_tokens(input_ids)
    else:
        if state is None:
            raise ValueError(f"state (the stream entering layer {start}) is required")
        handoff = residual_batch.ReplayHandoff(state.value, state.residual, state.update, state.written)
        hidden = residual_batch.import_replay_handoff(handoff, forward_batch)
    capture_layers = set(getattr(inner, "layers_to_capture", ()) or ())
    for i in range(start, end):
        captured = AuxHiddenStateList() if i in capture_layers else None
        hidden = inner.layers[i](positions, hidden, forward_batch,
                                 capture_output=captured.capture if captured is not None else None)
        if captured is not None:
            aux[i] = captured[0]
    value, residual, update, written = residual_batch.export_replay_handoff(hidden, forward_batch)
    return StreamState(value, residual, update, written, aux)


def finish_stack(model, state: StreamState, forward_batch) -> torch.Tensor:
    """Apply the model's final norm to a stream that left the last layer. Returns [T, D]."""
    from sglang.srt.layers.layer_boundary.residual import batch as residual_batch

    handoff = residual_batch.ReplayHandoff(state.value, state.residual, state.update, state.written)
    hidden = residual_batch.import_replay_handoff(handoff, forward_batch)
    return residual_batch.final_norm(hidden, forward_batch, model.model.norm)


def lm_head_logits(model, normed: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """float32 [T, V] logits of normalised hidden states [T, D] through the model's LM head.

    Single tensor-parallel rank only (no logits gather); the worker refuses TP > 1.
    """
    processor = model.logits_processor
    logits = processor._compute_lm_head(normed, model.lm_head, None)[:, :vocab_size]
    if getattr(processor, "logit_scale", None) is not None:
        logits = logits * processor.logit_scale
    return logits.float()


@contextlib.contextmanager
def override_forward(model, forward):
    """Make ``model.forward`` call ``forward(input_ids, positions, forward_batch, **kwargs)``
    inside the block (an instance attribute shadowing the class method), so that SGLang's
    ``ModelRunner.forward`` plans attention and sets the forward context around our range."""
    model.forward = forward
    try:
        yield
    finally:
        del model.forward
