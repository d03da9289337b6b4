"""The EAGLE-3 exporter (``eagle_heads/eagle3.py``) against SGLang 0.5.23's own model class.

SGLang's ``LlamaForCausalLMEagle3.load_weights`` *silently skips* every name it does not know, so
a wrong name in our export would load a head with random weights and no error. These tests
instantiate the real class on CPU (world size 1, gloo) from the exported ``config.json``, feed it
the exported safetensors one tensor at a time, record which parameter (and shard) each tensor
reached through the parameters' own ``weight_loader``s (``eagle3_loading.py``), and require: no
checkpoint tensor unused, no parameter left unloaded except the embedding (shared with the target
at run time), and loaded values equal to the exported ones.
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("sglang")
pytestmark = pytest.mark.sglang

from tests.sglang_plugin.eagle3_loading import (  # noqa: E402
    COMPUTED_BUFFER_SUFFIXES,
    check_complete,
    load_recording,
    sglang_eagle3_model,
    single_process_group,
)


@pytest.fixture(scope="module")
def sglang_single_process():
    with single_process_group():
        yield


def _export_head(directory, draft_vocab_size):
    from eagle_heads.eagle3 import build_random_eagle3_head
    from transformers import LlamaConfig

    target = LlamaConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
    )
    build_random_eagle3_head(str(directory), target, draft_vocab_size=draft_vocab_size)
    return str(directory)


@pytest.mark.parametrize("draft_vocab_size", [256, None], ids=["reduced-vocab", "full-vocab"])
def test_exported_head_loads_into_sglang_class(sglang_single_process, tmp_path, monkeypatch,
                                               draft_vocab_size):
    from safetensors.torch import load_file

    head_dir = _export_head(tmp_path / "head", draft_vocab_size)
    checkpoint = load_file(os.path.join(head_dir, "model.safetensors"))
    model = sglang_eagle3_model(head_dir)
    reached = load_recording(model, checkpoint, monkeypatch)

    unused, unloaded, partial = check_complete(model, reached)
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
    model = sglang_eagle3_model(head_dir)
    unused, unloaded, partial = check_complete(model, load_recording(model, checkpoint,
                                                                       monkeypatch))
    assert unused == ["midlayer.self_attn.qkv.weight", "model.final_norm.weight"]
    assert unloaded == ["model.norm.weight"]
    assert partial == ["model.layers.0.self_attn.qkv_proj.weight"]
