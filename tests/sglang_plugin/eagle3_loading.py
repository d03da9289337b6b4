"""Loading an exported EAGLE-3 head into SGLang 0.5.23's own model class, tensor by tensor.

SGLang's ``LlamaForCausalLMEagle3.load_weights`` renames legacy names (``midlayer`` ->
``layers.0``), stacks q/k/v into ``qkv_proj`` and gate/up into ``gate_up_proj``, turns ``d2t`` into
``hot_token_id``, ignores ``t2d``, and *silently skips* every name it does not know. These helpers
record which parameter (and shard) each checkpoint tensor reached, so the exporter tests
(``test_eagle3_export.py``, ``tests/eagle_heads/test_eagle3_sglang_export.py``) can require that
nothing was skipped. SGLang is imported only inside the functions.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

# Parameters SGLang fills from the target model, never from the head's checkpoint.
SHARED_WITH_TARGET = {"model.embed_tokens.weight"}
# Buffers computed at construction (rotary tables), never loaded.
COMPUTED_BUFFER_SUFFIXES = ("rotary_emb.cos_sin_cache",)
# Checkpoint names load_weights consumes without a parameter (d2t -> hot_token_id; t2d unused).
NON_PARAMETER_NAMES = {"d2t", "t2d"}
# Every stacked parameter and the shards it must receive.
STACKED_SHARDS = {"qkv_proj": {"q", "k", "v"}, "gate_up_proj": {0, 1}}


@contextlib.contextmanager
def single_process_group():
    """World size 1 on gloo plus a published topology while active, as SGLang's own layer tests
    set up (``sglang.test.layer_ut_utils.init_single_process_dist``, which cannot be imported
    here: its module pulls ``sglang.benchmark`` and the ``datasets`` package)."""
    from sglang.srt.distributed import parallel_state
    from sglang.srt.runtime_context import SpawnRanks, get_parallel, publish, reset_context
    from sglang.srt.server_args import ServerArgs

    from sglang_hsd.sglang_plugin.cpu.cpu_server import free_port

    if torch.distributed.is_initialized():
        pytest.skip("a torch.distributed group already exists in this process")
    parallel_state.init_distributed_environment(
        world_size=1, rank=0, local_rank=0, backend="gloo",
        distributed_init_method=f"tcp://127.0.0.1:{free_port()}",
    )
    reset_context()
    publish(ServerArgs(model_path="dummy", tp_size=1, pp_size=1, ep_size=1, device="cpu"),
            role="test", ranks=SpawnRanks(world_rank=0))
    get_parallel().override_permanently(world_group=parallel_state._WORLD)
    parallel_state.initialize_model_parallel(backend="gloo")
    try:
        yield
    finally:
        parallel_state.destroy_model_parallel()
        parallel_state.destroy_distributed_environment()
        reset_context()


def sglang_eagle3_model(head_dir: str):
    """SGLang's ``LlamaForCausalLMEagle3`` built from the exported ``config.json`` in ``head_dir``."""
    from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(head_dir)
    assert config.architectures == ["LlamaForCausalLMEagle3"]
    return LlamaForCausalLMEagle3(config)


def load_recording(model, checkpoint: dict[str, torch.Tensor], monkeypatch) -> dict[str, list]:
    """Run SGLang's ``load_weights`` on ``checkpoint`` (name -> tensor), one tensor at a time.

    Returns ``{checkpoint name: [(parameter name, shard id or None), ...]}``: the parameters each
    tensor reached. Recording wraps the loaders ``load_weights`` calls (a parameter's own
    ``weight_loader`` attribute, else the module's ``default_weight_loader``)."""
    from sglang.srt.models import llama_eagle3

    names = {id(param): name for name, param in model.named_parameters()}
    calls: list[tuple[str, object]] = []

    def recorder(loader):
        def record(param, loaded_weight, *shard):
            calls.append((names[id(param)], shard[0] if shard else None))
            return loader(param, loaded_weight, *shard)
        return record

    for param in model.parameters():
        if hasattr(param, "weight_loader"):
            param.weight_loader = recorder(param.weight_loader)
    monkeypatch.setattr(llama_eagle3, "default_weight_loader",
                        recorder(llama_eagle3.default_weight_loader))
    reached = {}
    for name, tensor in checkpoint.items():
        before = len(calls)
        model.load_weights([(name, tensor)])
        reached[name] = calls[before:]
    return reached


def check_complete(model, reached: dict[str, list]) -> tuple[list[str], list[str], list[str]]:
    """Return (unused checkpoint names, unloaded parameters, stacked parameters missing shards)."""
    unused = sorted(n for n, hits in reached.items() if not hits and n not in NON_PARAMETER_NAMES)
    shards: dict[str, set] = {}
    for hits in reached.values():
        for param_name, shard in hits:
            shards.setdefault(param_name, set()).add(shard)
    unloaded = sorted(set(dict(model.named_parameters())) - set(shards) - SHARED_WITH_TARGET)
    partial = sorted(
        name for name, got in shards.items()
        for stacked, want in STACKED_SHARDS.items() if stacked in name and got != want
    )
    return unused, unloaded, partial
