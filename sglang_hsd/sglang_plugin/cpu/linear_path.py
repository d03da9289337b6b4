"""Which CPU kernel SGLang's unquantized linear layers and lm_head run (``--hsd-cpu-linear``).

SGLang 0.5.23 on a CPU without AMX computes every unquantized linear layer with ``F.linear`` and
the lm_head with ``torch.matmul``. On an AVX2 core those cost nearly ``rows`` times one row for
the few rows of a verification forward (bf16 worst of all: it has no AVX2 kernel), so verifying
K + 1 drafted tokens costs about K + 1 decodes and speculation cannot win (``docs/cpu.md``).

``--hsd-cpu-linear onednn-packed`` (``SGLANG_HSD_CPU_LINEAR``) keeps, after the model loads, a
oneDNN pre-packed copy of every float32 linear weight and of the lm_head
(``runtime.layers.pack_linear_weight``, the runtime's packed path) and computes those layers with
it for every row count. On Qwen2.5-1.5B's gate/up and LM head shapes with 2 threads, five rows
then cost about one MKL row instead of 3.6-4.3 (``docs/cpu.md``;
``benchmarks/results/linear_paths_qwen2.5-coder-1.5b.md``). It is the same float32 product up to
summation order; it applies to every server in the process (no speculation, STANDALONE, HSD, the
draft model too), so a comparison between them runs the same kernels.

Once a linear layer is packed its float32 weight is released (``release_unpacked_weights``):
the packed copy computes every call. With both copies the speculative server held 18.5 GB of the
2-core host's 24 GB, and its target's linear layers took 352 ms a round against a plain server's
259 ms for the same calls (``benchmarks/results/profile_server_c4_*_l0_sharegpt.md``; memory
pressure is the likely cause). Released, it holds 12.8 GB. A released weight keeps its shape and dtype (a
one-element NaN expanded) and the layer a mark: the patched apply refuses to compute with it. The
LM head keeps its weight (with tied embeddings it is the embedding table). A draft model's layers
are released after their weight copies are built from them (``worker_setup.setup_draft_copies``).

Few-row calls are padded with zero rows where oneDNN measured faster for more rows
(``runtime.row_padding``; on the Zen 4 EPYC one row of the 1.5B's 1536 x 8960 projection costs
2.73 ms and four 1.75 ms): the choice is measured on each model's largest packed layer when it
loads, logged, and applies to every packed layer of that model (``--hsd-cpu-linear-padding``,
``PADDING_ENV``: ``auto``, the default, or ``off``).

Limits: float32 models only (``--dtype float32``; refused before the weights load otherwise);
weights changed after loading would leave the packed copies stale, so SGLang's weight-update
requests are answered with a failure naming the flag (``WEIGHT_UPDATES``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from dataclasses import dataclass
from typing import Iterator

import torch

logger = logging.getLogger(__name__)

from sglang_hsd.runtime.kernel_paths import PATH_MKL, PATH_PACKED
from sglang_hsd.runtime.layers import pack_linear_weight
from sglang_hsd.runtime.row_padding import (
    NO_PADDING, PADDING_CHOICES, RowPadding, padded_linear, probe_row_padding)

CPU_LINEAR_ENV = "SGLANG_HSD_CPU_LINEAR"
CPU_LINEAR_FLAG = "--hsd-cpu-linear"
# ``mkl``: SGLang's own F.linear / matmul (nothing is patched).
CPU_LINEAR_PATHS = (PATH_MKL, PATH_PACKED)
PADDING_ENV = "SGLANG_HSD_CPU_LINEAR_PADDING"
PADDING_FLAG = "--hsd-cpu-linear-padding"
# Attribute holding a layer's packed weight (set after loading, read by the patched apply).
PACKED_ATTR = "hsd_packed_weight"
# Attribute holding the RowPadding of a packed layer (measured once per model, runtime.row_padding).
PADDING_ATTR = "hsd_row_padding"
# Attribute marking a layer whose float32 weight was released after packing.
RELEASED_ATTR = "hsd_weight_released"
# Attribute of a draft model's layer holding its weight copy (a ``draft_copies.LayerCopy``, set at
# worker start); the patched apply and lm_head take it first.
COPY_ATTR = "hsd_weight_copy"
# Attribute of an LM head holding a ``LogitRows`` while a forward needs only some rows' logits.
LOGIT_ROWS_ATTR = "hsd_logit_rows"
# SGLang's WeightUpdater methods that change loaded weights (each returns ``(success, message)``).
WEIGHT_UPDATES = ("update_weights_from_disk", "update_weights_from_tensor",
                  "update_weights_from_ipc", "load_weights_from_distributed")
UPDATE_REFUSED = (f"{CPU_LINEAR_FLAG} {PATH_PACKED} cannot update weights after loading (the "
                  "packed copies would be stale); restart the server with the new weights")


class CpuLinearError(ValueError):
    """A bad ``--hsd-cpu-linear`` setting; the message names the flag."""


@dataclass(frozen=True)
class CpuLinearConfig:
    """Kernel path of SGLang's CPU linear layers.

    Fields:
        path: a key of ``CPU_LINEAR_PATHS`` (``mkl``: SGLang's own; ``onednn-packed``).
        row_padding: one of ``PADDING_CHOICES``: whether packed calls of few rows may be padded
            (``auto``: where the model's own measurement says it is faster).
    """

    path: str = PATH_MKL
    row_padding: str = "auto"

    def __post_init__(self) -> None:
        if self.path not in CPU_LINEAR_PATHS:
            raise CpuLinearError(f"{CPU_LINEAR_FLAG} ({CPU_LINEAR_ENV}) must be one of "
                                 f"{', '.join(CPU_LINEAR_PATHS)}, got {self.path!r}")
        if self.row_padding not in PADDING_CHOICES:
            raise CpuLinearError(f"{PADDING_FLAG} ({PADDING_ENV}) must be one of "
                                 f"{', '.join(PADDING_CHOICES)}, got {self.row_padding!r}")

    @classmethod
    def from_env(cls) -> "CpuLinearConfig":
        return cls(os.environ.get(CPU_LINEAR_ENV, "").strip().lower() or PATH_MKL,
                   os.environ.get(PADDING_ENV, "").strip().lower() or "auto")

    @property
    def packed(self) -> bool:
        return self.path == PATH_PACKED


def check_model_dtype(dtype: torch.dtype, device: str) -> None:
    """Refuse, before any weight loads, a model the packed path cannot run."""
    if device != "cpu":
        raise CpuLinearError(f"{CPU_LINEAR_FLAG} {PATH_PACKED} runs on CPU only (--device cpu), "
                             f"got device {device!r}")
    if dtype != torch.float32:
        raise CpuLinearError(f"{CPU_LINEAR_FLAG} {PATH_PACKED} needs a float32 model (--dtype "
                             f"float32): oneDNN's packed kernel is float32, got {dtype}")


def float32_linear_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The unquantized linear layers and the lm_head of an SGLang model whose weight is a 2-D CPU
    float32 tensor: the layers a packed weight or a weight copy can stand in for. Layers of
    another quantization method, or with another weight, keep SGLang's path."""
    from sglang.srt.layers.quantization.unquant import (
        UnquantizedEmbeddingMethod, UnquantizedLinearMethod)

    lm_head = getattr(model, "lm_head", None)
    layers = []
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        is_linear = isinstance(method, UnquantizedLinearMethod)
        is_lm_head = module is lm_head and isinstance(method, UnquantizedEmbeddingMethod)
        weight = getattr(module, "weight", None)
        if not (is_linear or is_lm_head) or not isinstance(weight, torch.Tensor):
            continue
        if weight.dtype == torch.float32 and weight.device.type == "cpu" and weight.dim() == 2:
            layers.append(module)
    return layers


def pack_model(model: torch.nn.Module, release: bool = True, row_padding: str = "auto") -> int:
    """Give every layer of ``float32_linear_layers(model)`` a packed weight and (``row_padding``
    ``auto``) the row padding measured on the largest of them (``model_row_padding``) and, with
    ``release``, release the linear layers' float32 weights (``release_unpacked_weights``);
    returns how many layers were packed."""
    layers = float32_linear_layers(model)
    for module in layers:
        setattr(module, PACKED_ATTR, pack_linear_weight(module.weight))
    padding = model_row_padding(model, layers) if row_padding == "auto" else NO_PADDING
    for module in layers:
        setattr(module, PADDING_ATTR, padding)
    if release:
        release_unpacked_weights(model)
    return len(layers)


def model_row_padding(model: torch.nn.Module, layers: list[torch.nn.Module]) -> RowPadding:
    """The row padding measured on the largest packed layer other than the LM head (one that
    does not fit in the cache, as in a forward; the LM head would cost tens of ms a call),
    logged (``row_padding.probe_row_padding``)."""
    lm_head = getattr(model, "lm_head", None)
    padding, probed = probe_row_padding([(m.weight, getattr(m, PACKED_ATTR)) for m in layers if m is not lm_head])
    if probed is not None:
        logger.info("sglang-hsd: packed linear layers of %s: %s (measured on a %d x %d layer)",
                    type(model).__name__, padding.describe(), *probed)
    return padding


def release_unpacked_weights(model: torch.nn.Module) -> int:
    """Free the float32 weight of every packed linear layer of ``model`` (not the LM head, which
    may be the embedding table): the parameter keeps its shape and dtype as a one-element NaN
    expanded, so that anything reading it by mistake computes NaN, and the layer is marked
    (``RELEASED_ATTR``) so that the patched apply refuses to use it. Returns how many."""
    from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod

    released = 0
    for module in model.modules():
        if (getattr(module, PACKED_ATTR, None) is None or getattr(module, RELEASED_ATTR, False)
                or not isinstance(getattr(module, "quant_method", None), UnquantizedLinearMethod)):
            continue
        weight = module.weight
        weight.data = torch.full((1, 1), float("nan"), dtype=weight.dtype).expand(weight.shape)
        setattr(module, RELEASED_ATTR, True)
        released += 1
    return released


def _packed_rows(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None,
                 padding: RowPadding = NO_PADDING) -> torch.Tensor:
    """``x`` ``[..., in]`` fp32 through the packed weight -> ``[..., out]``, few-row calls
    padded by ``padding``."""
    out = padded_linear(x.reshape(-1, x.shape[-1]), packed, bias, padding)
    return out.view(*x.shape[:-1], out.shape[-1])


@dataclass(frozen=True)
class LogitRows:
    """The rows of an LM-head call whose logits are read.

    Fields:
        index: int64 ``[n]``, rows of the call's ``[total, hidden]`` input.
        total: the row count of the call it applies to (a call of another size computes every row).
    """

    index: torch.Tensor
    total: int


@contextlib.contextmanager
def only_logit_rows(lm_head: torch.nn.Module, rows: LogitRows) -> Iterator[None]:
    """Within the block, a CPU LM-head call of ``lm_head`` on ``rows.total`` rows computes the
    logits of ``rows.index`` only; the other rows of its ``[total, vocab]`` result are zeros.

    For forwards whose caller reads a few rows of the logits it gets: SGLang's eager draft extend
    computes every row of the verified window (``batch * num_draft_tokens``) and keeps one per
    request. On the 0.5B draft model's LM head one row costs 4.5 ms on its int4 copy and twelve
    rows 26 ms. The kept rows are the same product of the same weights; the caller must read
    no other row."""
    setattr(lm_head, LOGIT_ROWS_ATTR, rows)
    try:
        yield
    finally:
        delattr(lm_head, LOGIT_ROWS_ATTR)


def install_cpu_linear_path(config: CpuLinearConfig) -> None:
    """Patch SGLang (imported here) for ``config``. Idempotent.

    Always (on CPU): the unquantized linear apply and the LM head take a layer's draft weight
    copy (``COPY_ATTR``, only ever set on a draft model's own layers), else its
    packed weight, else SGLang's own kernel. With ``onednn-packed``: every model is packed after
    loading and weight updates are refused.
    """
    _install_layer_kernels()
    if config.packed:
        _install_packing(config)


def _install_layer_kernels() -> None:
    from sglang.srt.layers.logits_processor import LogitsProcessor
    from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod

    if getattr(UnquantizedLinearMethod.__dict__["apply"], "__sglang_hsd_original__", None) is not None:
        return
    original_apply = UnquantizedLinearMethod.__dict__["apply"]
    original_lm_head = LogitsProcessor.__dict__["_compute_lm_head"]

    def apply(self, layer, x, bias=None):
        copy = getattr(layer, COPY_ATTR, None)
        if copy is not None:
            out = copy(x, bias)
            if out is not None:
                return out
        packed = getattr(layer, PACKED_ATTR, None)
        if packed is None or x.dtype != torch.float32:
            if getattr(layer, RELEASED_ATTR, False):
                raise RuntimeError(f"{CPU_LINEAR_FLAG} {PATH_PACKED}: a linear layer whose float32 "
                                   f"weight was released after packing got a {x.dtype} input "
                                   "(only float32 inputs take the packed kernel)")
            return original_apply(self, layer, x, bias)
        return _packed_rows(x, packed, bias, getattr(layer, PADDING_ATTR, NO_PADDING))

    def _compute_lm_head(self, hidden_states, lm_head, embedding_bias=None, *, out=None):
        rows = getattr(lm_head, LOGIT_ROWS_ATTR, None)
        if rows is None or hidden_states.shape[0] != rows.total or out is not None:
            return _lm_head_product(self, hidden_states, lm_head, embedding_bias, out=out)
        kept = _lm_head_product(self, hidden_states[rows.index], lm_head, embedding_bias)
        logits = kept.new_zeros(rows.total, kept.shape[-1])
        logits[rows.index] = kept
        return logits

    def _lm_head_product(self, hidden_states, lm_head, embedding_bias=None, *, out=None):
        if embedding_bias is not None or hasattr(lm_head, "set_lora"):
            return original_lm_head(self, hidden_states, lm_head, embedding_bias, out=out)
        copy = getattr(lm_head, COPY_ATTR, None)
        if copy is not None:
            logits = copy(hidden_states.to(torch.float32), None)
            if logits is not None:
                return logits
        packed = getattr(lm_head, PACKED_ATTR, None)
        if packed is None:
            return original_lm_head(self, hidden_states, lm_head, embedding_bias, out=out)
        return _packed_rows(hidden_states.to(torch.float32), packed, None,
                            getattr(lm_head, PADDING_ATTR, NO_PADDING))

    _replace([(UnquantizedLinearMethod, "apply", apply),
              (LogitsProcessor, "_compute_lm_head", _compute_lm_head)])


def _install_packing(config: CpuLinearConfig) -> None:
    from sglang.srt.model_executor.model_runner import ModelRunner

    if getattr(ModelRunner.__dict__["load_model"], "__sglang_hsd_original__", None) is not None:
        return
    original_load = ModelRunner.__dict__["load_model"]

    def load_model(self):
        check_model_dtype(self.model_config.dtype, self.device)
        original_load(self)
        # A draft model's weight copies are built from its float32 weights after it loads
        # (worker_setup.setup_draft_copies), which then releases them.
        count = pack_model(self.model, release=not getattr(self, "is_draft_worker", False),
                           row_padding=config.row_padding)
        if count == 0:
            raise CpuLinearError(f"{CPU_LINEAR_FLAG} {PATH_PACKED}: no float32 linear layer to "
                                 f"pack in {type(self.model).__name__}")
        logger.info("sglang-hsd: %d linear layers of %s run oneDNN's packed kernel", count,
                    type(self.model).__name__)

    _replace([(ModelRunner, "load_model", load_model)])
    refuse_weight_updates(UPDATE_REFUSED)


def refuse_weight_updates(message: str) -> None:
    """Answer SGLang's weight-update requests with ``(False, message)`` (copies of the weights
    would go stale). The first caller's message stays. Idempotent."""
    from sglang.srt.model_executor.model_runner_components.weight_updater import WeightUpdater

    if getattr(WeightUpdater.__dict__[WEIGHT_UPDATES[0]], "__sglang_hsd_original__", None) is not None:
        return
    _replace([(WeightUpdater, name, _refused_update(WeightUpdater.__dict__[name], message))
              for name in WEIGHT_UPDATES])


def _replace(replaced) -> None:
    """Set each ``(cls, name, new)``, keeping the original as ``__sglang_hsd_original__``."""
    for cls, name, new in replaced:
        new.__sglang_hsd_original__ = cls.__dict__[name]
        setattr(cls, name, new)


def _refused_update(original, message: str):
    """A weight-update method answering ``(False, message)``, named as ``original``."""

    @functools.wraps(original)
    def refuse(self, *args, **kwargs):
        return False, message

    return refuse
