"""A *trained* EAGLE-3 head, exported by the training pipeline, against SGLang 0.5.23.

``tests/sglang_plugin/test_eagle3_export.py`` checks the exporter on the reference state dict
(``random_eagle3_state_dict``); the pipeline exports ``Eagle3Head.state_dict()`` instead, so
these tests check that (1) its names and shapes are exactly the reference ones, (2) SGLang's
``LlamaForCausalLMEagle3`` loads it with no checkpoint tensor skipped and no parameter left
unloaded, and (3) our runtime loads the export back with identical logits.
"""

import os

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from eagle_heads.eagle3 import random_eagle3_state_dict, save_eagle3_head  # noqa: E402
from eagle_heads.eagle3_train import train_eagle3  # noqa: E402
from sglang_hsd.runtime.eagle3 import Eagle3Head  # noqa: E402
from tests.eagle_heads.tiny_heads import make_eagle3_head, random_features  # noqa: E402


@pytest.fixture(scope="module")
def exported(target, tmp_path_factory):
    """(directory, trained head, config): a few TTT steps, then the pipeline's export."""
    torch.manual_seed(0)
    head, config = make_eagle3_head(target, random_features(target, num_seqs=12), draft_vocab=24)
    train_eagle3(head, target, random_features(target, num_seqs=12), max_steps=3, steps=2, batch=2, window=8, progress=False)
    directory = tmp_path_factory.mktemp("eagle3")
    save_eagle3_head(str(directory), config, {k: v.detach().contiguous() for k, v in head.state_dict().items()})
    return str(directory), head, config


def test_export_has_exactly_the_reference_names_and_shapes(exported):
    from safetensors.torch import load_file

    directory, _, config = exported
    saved = load_file(os.path.join(directory, "model.safetensors"))
    reference = random_eagle3_state_dict(config)
    assert {k: tuple(v.shape) for k, v in saved.items()} == {k: tuple(v.shape) for k, v in reference.items()}
    assert {k: v.dtype for k, v in saved.items()} == {k: v.dtype for k, v in reference.items()}


def test_runtime_reloads_the_trained_export_with_identical_logits(exported, target):
    directory, head, _ = exported
    loaded = Eagle3Head.from_pretrained(directory, target)
    ids, aux = torch.randint(target.vocab_size, (2, 9)), torch.randn(2, 6, 3 * target.hidden_size)
    with torch.no_grad():
        for ours, theirs in zip(head.ttt_forward(ids, aux, 3), loaded.ttt_forward(ids, aux, 3)):
            assert torch.equal(head.target_logits(ours), loaded.target_logits(theirs))


@pytest.mark.sglang
def test_sglang_loads_the_trained_export_completely(exported, monkeypatch):
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")  # read by SGLang at import time
    pytest.importorskip("sglang", reason="needs sglang 0.5.23 (scripts/setup_env.sh --with-sglang)")
    from safetensors.torch import load_file

    from sglang_hsd.sglang_plugin.cpu.cpu_shims import install_cpu_shims

    install_cpu_shims()
    from tests.sglang_plugin.eagle3_loading import (
        check_complete,
        load_recording,
        sglang_eagle3_model,
        single_process_group,
    )

    directory, _, _ = exported
    with single_process_group():
        checkpoint = load_file(os.path.join(directory, "model.safetensors"))
        model = sglang_eagle3_model(directory)
        unused, unloaded, partial = check_complete(model, load_recording(model, checkpoint, monkeypatch))
        assert unused == [], f"checkpoint tensors SGLang's loader skips: {unused}"
        assert unloaded == [], f"parameters the checkpoint does not fill: {unloaded}"
        assert partial == [], f"stacked parameters with missing shards: {partial}"
        params = dict(model.named_parameters())
        assert torch.equal(params["model.fc.weight"].detach(), checkpoint["fc.weight"])
        assert torch.equal(params["lm_head.weight"].detach()[: checkpoint["lm_head.weight"].shape[0]], checkpoint["lm_head.weight"])
        assert torch.equal(model.get_hot_token_id(), torch.arange(checkpoint["d2t"].numel()) + checkpoint["d2t"])
