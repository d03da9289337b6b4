"""The EAGLE-3 exporter (``eagle_heads/eagle3.py``) against SGLang 0.5.23's own model class.

SGLang's ``LlamaForCausalLMEagle3.load_weights`` renames legacy names (``midlayer`` ->
``layers.0``), stacks q/k/v into ``qkv_proj`` and gate/up into ``gate_up_proj``, turns ``d2t`` into
``hot_token_id``, ignores ``t2d``, and *silently skips* every name it does not know. So a wrong
name in our export would load a head with random weights and no error. These tests instantiate the
real class on CPU (world size 1, gloo) from the exported ``config.json``, feed it the exported
safetensors one tensor at a time, record which parameter (and shard) each tensor reached through
the parameters' own ``weight_loader``s, and require: no checkpoint tensor unused, no parameter left
unloaded except the embedding (shared with the target at run time), and loaded values equal to the
exported ones.
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("sglang")
pytestmark = pytest.mark.sglang

# Parameters SGLang fills from the target model, never from the head's checkpoint.
SHARED_WITH_TARGET = {"model.embed_tokens.weight"}
# Buffers computed at construction (rotary tables), never loaded.
COMPUTED_BUFFER_SUFFIXES = ("rotary_emb.cos_sin_cache",)
# Checkpoint names load_weights consumes without a parameter (d2t -> hot_token_id; t2d unused).
NON_PARAMETER_NAMES = {"d2t", "t2d"}
# Every stacked parameter and the shards it must receive.
STACKED_SHARDS = {"qkv_proj": {"q", "k", "v"}, "gate_up_proj": {0, 1}}


@pytest.fixture(scope="module")
def sglang_single_process():
    """World size 1 on gloo plus a published topology, as SGLang's own layer tests set up
    (``sglang.test.layer_ut_utils.init_single_process_dist``, which cannot be imported here:
    its module pulls ``sglang.benchmark`` and the ``datasets`` package)."""
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
    yield
    parallel_state.destroy_model_parallel()
    parallel_state.destroy_distributed_environment()
    reset_context()


def _export_head(directory, draft_vocab_size):
    from eagle_heads.eagle3 import build_random_eagle3_head
    from transformers import LlamaConfig

    target = LlamaConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
    )
    build_random_eagle3_head(str(directory), target, draft_vocab_size=draft_vocab_size)
    return str(directory)


def _sglang_model(head_dir):
    from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(head_dir)
    assert config.architectures == ["LlamaForCausalLMEagle3"]
    return LlamaForCausalLMEagle3(config)


def _load_recording(model, checkpoint, monkeypatch):
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


def _check_complete(model, reached):
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


@pytest.mark.parametrize("draft_vocab_size", [256, None], ids=["reduced-vocab", "full-vocab"])
def test_exported_head_loads_into_sglang_class(sglang_single_process, tmp_path, monkeypatch,
                                               draft_vocab_size):
    from safetensors.torch import load_file

    head_dir = _export_head(tmp_path / "head", draft_vocab_size)
    checkpoint = load_file(os.path.join(head_dir, "model.safetensors"))
    model = _sglang_model(head_dir)
    reached = _load_recording(model, checkpoint, monkeypatch)

    unused, unloaded, partial = _check_complete(model, reached)
    assert unused == [], f"checkpoint tensors SGLang's loader skips: {unused}"
    assert unloaded == [], f"parameters the checkpoint does not fill: {unloaded}"
    assert partial == [], f"stacked parameters with missing shards: {partial}"
    buffers = [n for n, _ in model.named_buffers() if not n.endswith(COMPUTED_BUFFER_SUFFIXES)]
    assert buffers == [], f"buffers neither computed nor loaded: {buffers}"

    params = dict(model.named_parameters())
    layer = "model.layers.0."
    expected = {
        "model.fc.weight": checkpoint["fc.weight"],
        layer + "self_attn.qkv_proj.weight": torch.cat(
            [checkpoint[f"midlayer.self_attn.{p}_proj.weight"] for p in "qkv"]),
        layer + "self_attn.o_proj.weight": checkpoint["midlayer.self_attn.o_proj.weight"],
        layer + "mlp.gate_up_proj.weight": torch.cat(
            [checkpoint["midlayer.mlp.gate_proj.weight"], checkpoint["midlayer.mlp.up_proj.weight"]]),
        layer + "mlp.down_proj.weight": checkpoint["midlayer.mlp.down_proj.weight"],
        "lm_head.weight": checkpoint["lm_head.weight"],
    }
    for name, value in expected.items():
        loaded = params[name].detach()[: value.shape[0]]  # lm_head rows may be padded
        assert torch.equal(loaded, value), f"{name} differs from the exported tensor"
    draft_vocab = checkpoint["lm_head.weight"].shape[0]
    assert model.config.draft_vocab_size == draft_vocab
    hot = model.get_hot_token_id()
    assert torch.equal(hot, torch.arange(draft_vocab) + checkpoint["d2t"])
    assert torch.equal(torch.nonzero(checkpoint["t2d"]).flatten(), hot)


def test_a_misnamed_tensor_is_reported(sglang_single_process, tmp_path, monkeypatch):
    """The check itself: SGLang would skip these silently; ours must name them."""
    from safetensors.torch import load_file

    head_dir = _export_head(tmp_path / "head", 256)
    checkpoint = load_file(os.path.join(head_dir, "model.safetensors"))
    checkpoint["midlayer.self_attn.qkv.weight"] = checkpoint.pop("midlayer.self_attn.k_proj.weight")
    checkpoint["model.final_norm.weight"] = checkpoint.pop("norm.weight")
    model = _sglang_model(head_dir)
    unused, unloaded, partial = _check_complete(model, _load_recording(model, checkpoint,
                                                                       monkeypatch))
    assert unused == ["midlayer.self_attn.qkv.weight", "model.final_norm.weight"]
    assert unloaded == ["model.norm.weight"]
    assert partial == ["model.layers.0.self_attn.qkv_proj.weight"]
