"""Draft-tree verification: tree attention masks and compaction of the accepted path.

Tree (node: parent): 0: root, 1: 0, 2: 0, 3: 1, 4: 1, 5: 2, 6: 4. Depths 0,1,1,2,2,2,3.
"""

import torch

from sglang_hsd.runtime.model import CausalLM
from sglang_hsd.runtime.testing import decode_chain, hf_logits, right_pad, tiny_llama, tiny_qwen2

ATOL = 1e-4  # float32, same contract as the exactness tests
PARENTS = [-1, 0, 0, 1, 1, 2, 4]


def tree_mask_and_depth(parents: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Ancestor-or-self mask ``BoolTensor[T, T]`` and depth ``LongTensor[T]``."""
    size = len(parents)
    mask = torch.eye(size, dtype=torch.bool)
    depth = torch.zeros(size, dtype=torch.long)
    for node, parent in enumerate(parents):
        if parent >= 0:
            mask[node] |= mask[parent]
            depth[node] = depth[parent] + 1
    return mask, depth


def path_to(node: int) -> list[int]:
    path = []
    while node >= 0:
        path.append(node)
        node = PARENTS[node]
    return path[::-1]


def run_tree(model, prompts, tree_tokens):
    """Prefill ragged prompts, then verify one tree per row. Returns (cache, logits, num_prompt)."""
    ids, num_prompt = right_pad(prompts)
    cache = model.new_cache(len(prompts), 20)
    model(ids, cache, num_prompt)
    mask, depth = tree_mask_and_depth(PARENTS)
    batch = len(prompts)
    hidden = model.forward_layers(
        model.embed(tree_tokens),
        0,
        model.num_layers,
        cache,
        position_ids=num_prompt[:, None] + depth[None, :],
        attn_mask=mask[None].expand(batch, -1, -1),
    )
    return cache, model.exit_logits(hidden), num_prompt


def test_each_node_equals_its_path_as_a_chain():
    hf_model = tiny_qwen2(seed=20)
    model = CausalLM.from_hf(hf_model)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 64, (n,), generator=gen) for n in (5, 2)]
    tree_tokens = torch.randint(0, 64, (2, len(PARENTS)), generator=gen)
    _, logits, _ = run_tree(model, prompts, tree_tokens)
    for b, prompt in enumerate(prompts):
        for node in range(len(PARENTS)):
            chain = torch.cat([prompt, tree_tokens[b, path_to(node)]])[None]
            assert (logits[b, node] - hf_logits(hf_model, chain)[0, -1]).abs().max() < ATOL


def test_keep_accepted_path_equals_chain_decode():
    model = CausalLM.from_hf(tiny_llama(seed=21))
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 64, (n,), generator=gen) for n in (4, 6)]
    tree_tokens = torch.randint(0, 64, (2, len(PARENTS)), generator=gen)
    cache, _, num_prompt = run_tree(model, prompts, tree_tokens)

    # Row 0 accepts root -> 1 -> 4 -> 6, row 1 accepts root -> 2 (padded keep_index).
    keep_index = torch.tensor([path_to(6), path_to(2) + [0, 0]])
    keep_len = torch.tensor([4, 2])
    cache.keep(range(model.num_layers), num_prompt, keep_index, keep_len)
    assert cache.lengths.eq((num_prompt + keep_len)[None, :]).all()

    nxt = torch.randint(0, 64, (2, 1), generator=gen)
    after_keep = model(nxt, cache)
    for b, prompt in enumerate(prompts):
        path = tree_tokens[b, keep_index[b, : keep_len[b]]]
        chain = model.new_cache(1, 20)
        model(prompt[None], chain)
        decode_chain(model, chain, path[None])
        expected = model(nxt[b : b + 1], chain)
        assert (after_keep[b] - expected[0]).abs().max() < ATOL
        used = len(prompt) + len(path) + 1
        for layer in range(model.num_layers):
            for got, ref in ((cache.keys(layer), chain.keys(layer)), (cache.values(layer), chain.values(layer))):
                assert (got[b, :, :used] - ref[0, :, :used]).abs().max() < ATOL


def test_tree_forwarded_in_two_calls_equals_one_call():
    # forward_layers' mask_prefix: nodes 3..6 see nodes 0..2 (cached by an earlier call of the same
    # tree) only where they are ancestors, exactly as in one tree-masked call over all nodes.
    model = CausalLM.from_hf(tiny_qwen2(seed=22))
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 64, (n,), generator=gen) for n in (5, 3)]
    tree_tokens = torch.randint(0, 64, (2, len(PARENTS)), generator=gen)
    _, one_call, _ = run_tree(model, prompts, tree_tokens)

    ids, num_prompt = right_pad(prompts)
    cache = model.new_cache(2, 20)
    model(ids, cache, num_prompt)
    mask, depth = tree_mask_and_depth(PARENTS)
    positions = num_prompt[:, None] + depth[None, :]
    first, rest = slice(0, 3), slice(3, len(PARENTS))
    model.forward_layers(model.embed(tree_tokens[:, first]), 0, model.num_layers, cache,
                         position_ids=positions[:, first], attn_mask=mask[first, first][None].expand(2, -1, -1))
    hidden = model.forward_layers(model.embed(tree_tokens[:, rest]), 0, model.num_layers, cache,
                                  position_ids=positions[:, rest], attn_mask=mask[rest][None].expand(2, -1, -1),
                                  mask_prefix=torch.tensor([3, 3]))
    assert (model.exit_logits(hidden) - one_call[:, rest]).abs().max() < ATOL
    # Without the prefix mask the later nodes would see every earlier node: different rows.
    cache.truncate(num_prompt + 3)
    causal = model.forward_layers(model.embed(tree_tokens[:, rest]), 0, model.num_layers, cache,
                                  position_ids=positions[:, rest], attn_mask=mask[rest, rest][None].expand(2, -1, -1))
    assert (model.exit_logits(causal) - one_call[:, rest]).abs().max() > 10 * ATOL
