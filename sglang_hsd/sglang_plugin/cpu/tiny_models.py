"""Tiny random Llama targets with a self-made tokenizer, for tests that launch SGLang on CPU.

No model hub is reachable from CI, so the tokenizer is a byte-level BPE trained in a second on a
fixed built-in text; it has a chat template so ``/v1/chat/completions`` works.
"""

from __future__ import annotations

import json
import os

_CORPUS = (
    "The quick brown fox jumps over the lazy dog. Speculative decoding drafts tokens with a small "
    "model and verifies them with a large one. A lossless verifier keeps the output distribution "
    "of the target model. Hello world, how are you today? I am fine, thank you. Once upon a time "
    "there was a little robot who liked to count: one, two, three, four, five, six, seven. "
    "def add(a, b):\n    return a + b\n\nprint(add(1, 2))\n"
)
SPECIAL_TOKENS = ["<|pad|>", "<|bos|>", "<|eos|>", "<|user|>", "<|assistant|>", "<|system|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|eos|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def build_tiny_tokenizer(directory: str, vocab_size: int = 512) -> None:
    """Train and save a byte-level BPE tokenizer (tokenizer.json + tokenizer_config.json)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|eos|>", pad_token="<|pad|>",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(directory)


def build_tiny_llama(directory: str, vocab_size: int = 512, hidden_size: int = 64,
                     num_layers: int = 4, seed: int = 0, init_std: float = 0.02):
    """Save a random ``LlamaForCausalLM`` plus tokenizer to ``directory``; returns its config.

    The config's ``vocab_size`` equals the tokenizer length rounded up, so every id is valid.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    os.makedirs(directory, exist_ok=True)
    build_tiny_tokenizer(directory, vocab_size)
    with open(os.path.join(directory, "tokenizer.json")) as f:
        n_tokens = len(json.load(f)["model"]["vocab"])
    config = LlamaConfig(
        vocab_size=max(vocab_size, n_tokens), hidden_size=hidden_size,
        intermediate_size=2 * hidden_size, num_hidden_layers=num_layers, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=1024, rms_norm_eps=1e-6,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        initializer_range=init_std, torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).float()
    model.save_pretrained(directory)
    return config


def build_tiny_draft_pair(root: str, init_std: float = 0.3, draft_layers: int = 1,
                          **target_kwargs) -> tuple[str, str]:
    """A tiny random target (``root/target``, 4 layers) and a draft language model of the same
    family (``root/draft``): the target's first ``draft_layers`` layers with its embeddings, final
    norm and LM head, and the same tokenizer, for ``--hsd-draft-kind model``.

    A truncated target drafts like a real small model of the family: its q is correlated with the
    target's p (drafts get accepted) without being equal (at ``init_std`` 0.3 the next-token laws
    are far enough apart that a test of the target's law rejects the draft's). Returns (target
    folder, draft folder).
    """
    import shutil

    from transformers import LlamaForCausalLM

    target, draft = os.path.join(root, "target"), os.path.join(root, "draft")
    build_tiny_llama(target, init_std=init_std, **target_kwargs)
    model = LlamaForCausalLM.from_pretrained(target)
    model.model.layers = model.model.layers[:draft_layers]
    model.config.num_hidden_layers = draft_layers
    model.save_pretrained(draft)
    for name in os.listdir(target):
        if name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(os.path.join(target, name), draft)
    return target, draft


def build_perturbed_copy(target: str, directory: str, noise: float = 0.02, seed: int = 1) -> str:
    """Save a copy of the model in ``target`` to ``directory`` whose decoder-layer matrices carry
    Gaussian noise of ``noise`` times each matrix's standard deviation (embeddings, norms and
    the LM head unchanged), with the same tokenizer; returns ``directory``.

    A draft that agrees with the target often but not always: for the default tiny pair
    (``build_tiny_draft_pair``, init_std 0.3) at noise 0.02 its greedy token equals the target's
    on about two thirds of the target's own greedy continuations, where the one-layer truncated
    draft agrees on one in twenty, so drafting rounds end both with a rejection and with every
    draft accepted.
    """
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(target)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if ".layers." in name and weight.dim() == 2:
                weight.add_(noise * weight.std() * torch.randn(weight.shape, generator=generator))
    return _save_with_tokenizer(model, target, directory)


def build_looping_copy(target: str, directory: str, sharpness: float = 1.0) -> str:
    """Save a copy of the model in ``target`` to ``directory`` with every attention output
    projection zeroed and the final norm's weight times ``sharpness`` (logits times
    ``sharpness``), with the same tokenizer; returns ``directory``.

    Each position's logits then depend on its own token alone, so greedy text soon falls into a
    short cycle (for the default tiny model, a period of 2 within about 25 tokens of any prompt):
    text a prompt-lookup level copies, as a real model's re-typed code is. A sharpness above 1
    keeps T = 1 samples on the cycle most of the time.
    """
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(target)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if name.endswith("self_attn.o_proj.weight"):
                weight.zero_()
        model.model.norm.weight.mul_(sharpness)
    return _save_with_tokenizer(model, target, directory)


def _save_with_tokenizer(model, target: str, directory: str) -> str:
    """Save ``model`` to ``directory`` with the tokenizer files of the model folder ``target``."""
    import shutil

    model.save_pretrained(directory)
    for name in os.listdir(target):
        if name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(os.path.join(target, name), directory)
    return directory
