"""Models, prompts and the exact target law shared by the runtime's engine tests."""

import torch

from eagle_heads.eagle3 import Eagle3HeadConfig, random_eagle3_state_dict
from sglang_hsd.runtime.eagle3 import Eagle3Head
from sglang_hsd.sampling import logits_to_probs

PROMPTS = [[1, 2, 3], [5], [7, 8, 9, 10, 11, 12], [3, 3]]


def sharpen_lm_head(hf_model, scale):
    """Scale the LM head in place (returns the model).

    Random tiny models are nearly uniform; scaling the LM head gives peaked, realistic rows so
    early exits agree with the target often but not always.
    """
    with torch.no_grad():
        hf_model.lm_head.weight.mul_(scale)
    return hf_model


def eagle3_head_for(model, draft_vocab, captures, seed=0, std=0.05):
    """A random EAGLE-3 head whose lm_head is the target's (rows of the draft vocabulary), so it
    often agrees with the target. Returns (head, its ``Eagle3HeadConfig``)."""
    config = Eagle3HeadConfig.for_target(model.config, draft_vocab, aux_layer_ids=[c - 1 for c in captures], init_std=std)
    head = Eagle3Head(config.to_hf_dict(), model)
    head.load_state_dict(random_eagle3_state_dict(config, seed))
    with torch.no_grad():
        head.lm_head.weight.copy_(model.lm_head.weight[head.draft_to_target])
        head.fc.weight[:, -model.hidden_size:] += torch.eye(model.hidden_size)
    return head.eval(), config


def exact_target_prefix_probs(model, prompt, length, params):
    """Exact probability of every ``length``-token continuation, base-V order. float64 [V ** length]."""
    vocab = model.vocab_size
    probs = torch.ones(1, dtype=torch.float64)
    contexts = [list(prompt)]
    with torch.inference_mode():
        for _ in range(length):
            batch = torch.tensor(contexts)
            cache = model.new_cache(len(contexts), batch.shape[1])
            rows = logits_to_probs(model(batch, cache)[:, -1], params).double()
            probs = (probs.unsqueeze(-1) * rows).reshape(-1)
            contexts = [c + [v] for c in contexts for v in range(vocab)]
    return probs
