"""``benchmarks/drafters.py``: cached models and drafters against plain full-sequence forwards
(tiny random models).

Regimes: a cache that is cropped and re-extended (the draft of one round dropped when the next
round's context diverges), with and without stored logits; an exit drafter's q against the logit
lens on a full forward; the EAGLE-3 drafter's q against the head's training-time forward, which
defines the feeding (target features for committed positions, the head's own output beyond);
``Eagle3Prefix``'s tree nodes against the same forward with the server's feeding.
"""

import torch

from benchmarks.drafters import CachedLM, Eagle3Drafter, ExitDrafter
from sglang_hsd.runtime.testing import tiny_llama
from sglang_hsd.sampling import SamplingParams, logits_to_probs

# float32 forwards over the same tokens, run in different chunkings.
ATOL = 1e-4


def _full(hf, ids, layers=()):
    out = hf(torch.tensor([ids]), output_hidden_states=True)
    hidden = torch.stack([out.hidden_states[layer][0] for layer in layers], 1) if layers else None
    return out.logits[0], hidden


def test_cached_lm_matches_full_forward_across_crops():
    hf = tiny_llama(vocab_size=64, num_layers=4, seed=1)
    for keep in (False, True):
        lm = CachedLM(hf, hidden_layers=(2,), keep_logits=keep)
        gen = torch.Generator().manual_seed(0)
        seq = torch.randint(0, 64, (12,), generator=gen).tolist()
        # extend, crop into the middle, diverge, re-extend, ask for an old position
        for ids, need in ((seq[:6], 5), (seq[:10], 5), (seq[:8] + [3, 4], 7), (seq[:8] + [3, 4, 5], 2), (seq[:4], 3)):
            logits, hidden = lm.feed(ids, need)
            ref_logits, ref_hidden = _full(hf, ids, (2,))
            assert logits.shape == (len(ids) - need, 64)
            torch.testing.assert_close(logits, ref_logits[need:], atol=ATOL, rtol=0)
            torch.testing.assert_close(hidden, ref_hidden[need:], atol=ATOL, rtol=0)


def test_exit_drafter_q_is_the_logit_lens_of_its_draft():
    hf = tiny_llama(vocab_size=64, num_layers=4, seed=2)
    drafter = ExitDrafter(hf, layer=2)
    params = SamplingParams(temperature=0.8)
    context = [1, 5, 9, 2, 7]
    tokens, q = drafter.propose(context, 4, params, torch.Generator().manual_seed(3))
    _, hidden = _full(hf, context + tokens.tolist(), (2,))
    with torch.no_grad():
        lens = hf.lm_head(hf.model.norm(hidden[len(context) - 1 : -1, 0]))
    torch.testing.assert_close(q, logits_to_probs(lens.unsqueeze(0), params)[0], atol=ATOL, rtol=0)
    assert bool((q.gather(1, tokens[:, None]) > 0).all())


def test_eagle3_drafter_matches_training_time_forward(tmp_path):
    from eagle_heads.eagle3 import build_random_eagle3_head
    from sglang_hsd.runtime.eagle3 import Eagle3Head
    from sglang_hsd.runtime.model import CausalLM

    hf = tiny_llama(vocab_size=64, num_layers=6, hidden_size=32, seed=4)
    build_random_eagle3_head(str(tmp_path), hf.config, draft_vocab_size=48, seed=5)
    head = Eagle3Head.from_pretrained(str(tmp_path), CausalLM.from_hf(hf))
    target = CachedLM(hf, hidden_layers=tuple(head.capture_layers), keep_logits=True)
    drafter = Eagle3Drafter(head, target)
    params = SamplingParams(temperature=1.0)
    gen = torch.Generator().manual_seed(6)
    num_draft = 4
    for context in ([3, 1, 4, 1, 5, 9, 2], [3, 1, 4, 1, 5, 9, 2, 6, 5], [3, 1, 4, 8]):  # extend, then diverge
        tokens, q = drafter.propose(context, num_draft, params, gen)
        n, seq = len(context), context + tokens.tolist()
        _, aux = _full(hf, seq, tuple(head.capture_layers))
        with torch.no_grad():
            outs = head.ttt_forward(torch.tensor([seq[1:]]), aux[:n].flatten(1)[None], steps=num_draft - 1)
        fed = [outs[0][0, n - 2]] + [outs[j][0, n - 1] for j in range(num_draft - 1)]
        ref = logits_to_probs(head.target_logits(torch.stack(fed)).unsqueeze(0), params)[0]
        torch.testing.assert_close(q, ref, atol=ATOL, rtol=0)
        outside = torch.ones(64, dtype=torch.bool)
        outside[head.draft_to_target] = False
        assert float(q[:, outside].sum()) == 0.0  # q lives on the draft vocabulary
        # The scorer shares the drafter's cache: its logits still equal a full forward.
        logits, _ = target.feed(seq, n - 1)
        torch.testing.assert_close(logits, _full(hf, seq)[0][n - 1 :], atol=ATOL, rtol=0)


def test_eagle3_prefix_feeds_tree_nodes_as_the_server(tmp_path):
    """``Eagle3Prefix`` (bench_tree's EAGLE-3 drafter): the root's logits are entry n - 2's and a
    node at depth d is the head's step d at entry n - 2 of the training-time forward (context
    entries target-fed, then each node fed its parent's output), for trees asked in pieces, after
    cropping the context, with memoised nodes reused."""
    from benchmarks.drafters import Eagle3Prefix, node_logits
    from eagle_heads.eagle3 import build_random_eagle3_head
    from sglang_hsd.runtime.eagle3 import Eagle3Head
    from sglang_hsd.runtime.model import CausalLM

    def reference(context, path):
        n, seq = len(context), context + list(path)
        _, aux = _full(hf, context, tuple(head.capture_layers))
        with torch.no_grad():
            outs = head.ttt_forward(torch.tensor([seq[1:]]), aux[: n - 1].flatten(1)[None], steps=len(path) + 1)
        return head.target_logits(outs[len(path)][0, n - 2 : n - 1])[0]

    hf = tiny_llama(vocab_size=64, num_layers=6, hidden_size=32, seed=7)
    build_random_eagle3_head(str(tmp_path), hf.config, draft_vocab_size=48, seed=8)
    head = Eagle3Head.from_pretrained(str(tmp_path), CausalLM.from_hf(hf))
    drafter = Eagle3Prefix(head, hf, vocab_size=64)
    full = [3, 1, 4, 1, 5, 9, 2, 6, 5]
    logits = drafter.prefill(full)
    trees = [[(7,), (7, 2), (11,), (7, 2, 9)], [(7, 2, 9, 1), (11, 3), (5,)]]  # the second reuses the first's nodes
    for length in (len(full), 6):  # the whole prefill, then a crop
        context = full[:length]
        torch.testing.assert_close(logits[length - 1], reference(context, ()), atol=ATOL, rtol=0)
        drafter.set_context(length, logits[length - 1])
        for paths in trees:
            got = node_logits(drafter, paths)
            want = torch.stack([reference(context, path) for path in paths])
            torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
        assert int(drafter.cache.lengths[0, 0]) == length - 1  # the context's entries only


def test_load_eagle3_head_names_the_missing_folder(tmp_path):
    from types import SimpleNamespace

    import pytest

    from benchmarks.drafters import load_eagle3_head

    target = SimpleNamespace(path=tmp_path / "some-model", model=None)
    with pytest.raises(ValueError, match="no EAGLE-3 head in .*empty.*train-heads --model some-model"):
        load_eagle3_head(target, str(tmp_path / "empty"))
