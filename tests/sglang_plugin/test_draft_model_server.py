"""End to end on CPU: ``--speculative-algorithm HSD --hsd-draft-kind model`` with a tiny random
target (4 layers) and a draft language model of the same family (the target's first layer, same
tokenizer) that keeps its own KV cache (SGLang's STANDALONE shape).

* chain servers run with ``--hsd-adaptive`` on (the default): every round's length (0..K) is
  chosen from past rounds, and every check below holds with it; the lengths are reported;
* the K = 3 chain server drafts on an int4 copy of the draft model's weights
  (``--hsd-draft-precision int4``, ``cpu/draft_copies.py``), the K = 4 one on a w8a8 copy (its
  prefill and catch-ups too); the others on what ``auto`` measures;
* the draft model runs the lean forward (``cpu/lean_decode.py``, the default for this Llama pair);
  the K = 3 chain and tree servers run it ``checked``: every draft forward (steps, extends, the
  draft prefill and catch-up) also through SGLang's forward, compared, so every check below holds
  with the lean forward's numbers and each of its forwards matched SGLang's;
* greedy output equals the target's plain greedy decoding (transformers-free ``CausalLM``) token
  for token, for chains of K = 2, 3, 4 drafts and a tree, in a concurrent batch of several requests;
* T = 1: the law of the first generated tokens is the target's. Each sampled sequence is mapped
  through the target's sequential randomized PIT (u_t = F(x_t - 1 | prefix) + v * p(x_t | prefix),
  v ~ U(0, 1)), which is i.i.d. uniform exactly when the tokens follow the target's joint law;
  chi-square of the u's over 10 bins (a rejection is confirmed on a fresh sample four times as
  large, ``server_law.py``). The same test rejects sequences drawn from the draft's law;
* load: 32 concurrent mixed greedy / sampled / top-k / top-p requests, a quarter aborted midway,
  no error, and the free KV slots of the target's and the draft's pools back to their start;
* all three for sampled trees too (depth 3, k = 2, N = 6: children drawn without replacement from
  the draft model's q, verified by ``verify_tree``; all-greedy batches keep SGLang's top-k tree),
  the rounds cycling through the tree budgets of depth 0..3 (``--hsd-draft-lengths-cycle``);
* greedy output and the T = 1 law with the early-exit level at layer 2 (logit lens) verifying the
  draft model's chain before the full target;
* SGLang's stock tree (``--hsd-tree-draft topk``, verified by SGLang's tree sampler on the hook's
  rows) with the same shape and depth cycle: every check above, and the ones below, on it too;
  its depth-0 rounds make the draft catch-up run on a tree whose draft input has no q (that once
  killed the scheduler);
* T = 1 with ``min_p``: on every server the law is the one SGLang's non-speculative sampler draws
  from (``server_law.sglang_sampler_law``): no token below the min-p threshold, PIT chi-square
  under the filtered rows; the same test rejects the target's law without min-p. With a regex:
  the target's law masked by the grammar; the unmasked law is rejected;
* T = 0.7 with top_k 20 and top_p 0.8 (Qwen2.5-Instruct's defaults) on the chain and the trees:
  the law of SGLang's non-speculative sampler (top-p on the original row); the renormalised law
  SGLang's speculative verify gives is rejected on the same samples;
* greedy with frequency, presence and repetition penalties on every server: plain greedy
  decoding penalised step by step; every request feature (logit_bias, grammars, n, stop,
  logprobs, ...) against the target's server without speculation.

Each server takes ~1 minute to start on 2 cores.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from sglang_hsd.verify.oracles.stats import chi_square_p_value
from tests.penalty_reference import penalised_logits
from tests.sglang_plugin.http_client import get_json, post_json
from sglang_hsd.sglang_plugin.cpu import cpu_sampling
from tests.sglang_plugin.server_law import ALPHA, confirmed_p_values, sglang_sampler_law

pytest.importorskip("sglang")
pytestmark = [pytest.mark.sglang, pytest.mark.slow]

PROMPTS = [[1, 40, 41, 42], [1, 77, 300, 12, 9], [1, 5], [1, 200, 201, 202, 203, 204]]
MAX_NEW_TOKENS = 16
STAT_PROMPT = [1, 40, 41, 42]
STAT_SAMPLES = 240
STAT_TOKENS = 4  # the prefill's token, then the first verify rounds' tokens
PIT_BINS = 10
TREE = (2, 6)  # k, N of the tree server (depth 3)
TREE_CYCLE = "3,0,1,2,3,2"  # the tree server's depths (budgets 1:2:3, 2:2:5, 3:2:6), round by round
EXIT_LAYER = 2  # of the target's 4
QWEN_DEFAULTS = (0.7, 20, 0.8)  # temperature, top_k, top_p of Qwen2.5-Instruct's generation config
MIN_P = 0.05  # removes about a third of the target's mass at each of the first sampled positions
# A token whose target probability is this fraction below the min-p threshold is outside the
# support; float32 server logits differ from the float64 reference far less than that.
SUPPORT_MARGIN = 1e-3


def _generate(url, ids, max_new_tokens=MAX_NEW_TOKENS, **sampling):
    params = {"max_new_tokens": max_new_tokens, "ignore_eos": True, "temperature": 0.0}
    params.update(sampling)
    return post_json(url, "/generate", {"input_ids": ids, "sampling_params": params})


def _hsd_state(url):
    return get_json(url, "/server_info")["internal_states"][0]["hsd"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from sglang_hsd.sglang_plugin.cpu.tiny_models import build_tiny_draft_pair

    root = tmp_path_factory.mktemp("draft_model_server")
    target, draft = build_tiny_draft_pair(str(root))
    return root, target, draft


@pytest.fixture(scope="module")
def reference(pair):
    from sglang_hsd.runtime.model import CausalLM
    from sglang_hsd.runtime.testing import greedy_reference

    model = CausalLM.from_pretrained(pair[1])
    return [greedy_reference(model, ids, MAX_NEW_TOKENS) for ids in PROMPTS]


def _server(pair, num_steps, topk=1, num_draft_tokens=None, exit_layer=None, extra=()):
    from sglang_hsd.sglang_plugin.cpu.cpu_server import (
        draft_model_server_command, free_port, running_server, server_env)

    root, target, draft = pair
    extra = ["--dtype", "float32", "--disable-radix-cache", *extra]
    if exit_layer is not None:  # logit-lens exit head
        extra += ["--hsd-exit-layer", str(exit_layer), "--hsd-exit-heads", "none"]
    cmd = draft_model_server_command(target, free_port(), draft, num_steps=num_steps, extra=extra,
                                     topk=topk, num_draft_tokens=num_draft_tokens)
    name = _server_name(num_steps, topk, num_draft_tokens, exit_layer) + ("_stock" if "topk" in extra else "")
    return running_server(cmd, server_env(), str(root / f"{name}.log"))


def _server_name(num_steps, topk=1, num_draft_tokens=None, exit_layer=None):
    return (f"server_k{num_steps}" + (f"_tree{topk}_{num_draft_tokens}" if topk > 1 else "")
            + (f"_exit{exit_layer}" if exit_layer is not None else ""))


@pytest.fixture(scope="module")
def k3_url(pair):
    """A chain of K = 3 whose draft model drafts on an int4 copy of its weights: the greedy, law
    and load tests below then hold with the copy's q (only the drafter's numbers change)."""
    with _server(pair, 3, extra=["--hsd-draft-precision", "int4", "--hsd-draft-forward", "checked"]) as url:
        copies = _hsd_state(url)["draft_copies"]
        assert copies["precision"] == "int4" and copies["layers"] > 0, copies
        yield url
    with open(pair[0] / "server_k3.log") as f:
        log = f.read()
    assert "Traceback" not in log
    assert "verifying chains with verify_chain(method='hsd')" in log


@pytest.fixture(scope="module")
def tree_url(pair):
    """A sampled tree: depth 3, k = 2 children per node, N = 6 nodes (root included), whose
    rounds take the tree budgets of ``TREE_CYCLE`` in turn (``--hsd-adaptive``'s runtime states
    of depth 0..3, switched between rounds), so every check on it holds across budgets."""
    with _server(pair, 3, topk=TREE[0], num_draft_tokens=TREE[1],
                 extra=["--hsd-draft-forward", "checked", "--hsd-draft-lengths-cycle", TREE_CYCLE]) as url:
        yield url
    with open(pair[0] / f"{_server_name(3, *TREE)}.log") as f:
        log = f.read()
    assert "Traceback" not in log


@pytest.fixture(scope="module")
def stock_url(pair):
    """SGLang's stock tree (``--hsd-tree-draft topk``: the draft's top-k children with SGLang's
    score pruning, verified by SGLang's tree sampler through the hook's rows), depth 3, k = 2,
    N = 6, its rounds taking the depths of ``TREE_CYCLE``: the depth-0 rounds skip the draft
    extend, so the draft catch-up runs on a tree whose draft input carries no q."""
    with _server(pair, 3, topk=TREE[0], num_draft_tokens=TREE[1],
                 extra=["--hsd-tree-draft", "topk", "--hsd-draft-lengths-cycle", TREE_CYCLE]) as url:
        yield url
        assert _hsd_state(url)["draft_catch_up"]["catch_ups"] > 0
    with open(pair[0] / f"{_server_name(3, *TREE)}_stock.log") as f:
        log = f.read()
    assert "Traceback" not in log


@pytest.fixture(scope="module")
def exit_url(pair):
    """A chain of K = 3 with the early-exit level at layer EXIT_LAYER (logit lens) in between."""
    with _server(pair, 3, exit_layer=EXIT_LAYER) as url:
        yield url
    with open(pair[0] / f"{_server_name(3, exit_layer=EXIT_LAYER)}.log") as f:
        log = f.read()
    assert "Traceback" not in log
    assert f"exit level at layer {EXIT_LAYER}" in log


def _check_greedy(url, reference):
    with ThreadPoolExecutor(max_workers=8) as pool:  # one batch of several requests
        outputs = list(pool.map(lambda ids: _generate(url, ids), PROMPTS * 2))
    for ids, out, expected in zip(PROMPTS * 2, outputs, reference * 2):
        assert out["output_ids"] == expected, ids
        assert out["meta_info"]["spec_verify_ct"] >= 1


def test_adaptive_lengths_are_reported_per_request_and_in_server_info(k3_url):
    """``--hsd-adaptive`` is on by default for chains: each request returns the draft length of
    every decode round it took part in, and ``/server_info`` the controller's state."""
    out = _generate(k3_url, PROMPTS[0], temperature=1.0)
    budgets = out["meta_info"]["hsd_draft_budget"]
    assert budgets and all(0 <= b <= 3 for b in budgets), budgets
    adaptive = _hsd_state(k3_url)["adaptive"]
    assert adaptive["enabled"] and adaptive["candidates"] == [0, 1, 2, 3]
    assert adaptive["rounds"] >= len(budgets) and adaptive["mean_steps"] is not None
    assert adaptive["round_ms_by_batch_bucket"]


def test_tree_budgets_are_reported(tree_url):
    """The tree server's rounds ran every budget of the cycle: each request reports its depths,
    ``/server_info`` the budgets and the accepted drafts per depth (at most the budget's path)."""
    out = _generate(tree_url, PROMPTS[0], temperature=1.0)
    assert set(out["meta_info"]["hsd_draft_budget"]) == {0, 1, 2, 3}, out["meta_info"]
    adaptive = _hsd_state(tree_url)["adaptive"]
    assert adaptive["tree_budgets"] == {"1": "1:2:3", "2": "2:2:5", "3": "3:2:6"}
    counts = adaptive["accepted_drafts_by_length"]
    assert {"1", "2", "3"} <= set(counts) and all(len(c) == int(d) + 1 for d, c in counts.items()), counts


@pytest.mark.parametrize("num_steps", [2, 3, 4])
def test_draft_model_greedy_equals_target(pair, reference, num_steps, request):
    if num_steps == 3:
        _check_greedy(request.getfixturevalue("k3_url"), reference)
        return
    # K = 4 drafts on the w8a8 copy, which serves every row count here (a draft too small to time
    # takes the kind's default): its draft prefill and catch-ups run on the copy too.
    extra = ["--hsd-draft-precision", "w8a8"] if num_steps == 4 else []
    with _server(pair, num_steps, extra=extra) as url:
        if extra:
            copies = _hsd_state(url)["draft_copies"]
            assert copies["precision"] == "w8a8" and copies["layers"] > 0, copies
        _check_greedy(url, reference)


@pytest.mark.parametrize("server", ["tree_url", "stock_url", "exit_url"])
def test_draft_model_tree_and_exit_level_greedy_equals_target(reference, server, request):
    _check_greedy(request.getfixturevalue(server), reference)


@pytest.mark.parametrize("server", ["k3_url", "tree_url", "exit_url"])
def test_draft_model_runs_the_lean_forward(server, request):
    """Greedy and sampled requests, then ``/server_info``: the draft model's steps (DECODE), its
    extends after verification and its prefill or catch-up (EXTEND) ran on the lean forward; on
    the checked servers each of them also matched SGLang's forward (relative 1e-4). The chain
    server's extends after verification are tail extends (EXTEND batches, counted by the
    catch-up); the tree and exit servers keep SGLang's window extend (DRAFT_EXTEND)."""
    url = request.getfixturevalue(server)
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lambda i: _generate(url, PROMPTS[i % len(PROMPTS)], temperature=float(i % 2)),
                      range(8)))
    step = _hsd_state(url)["draft_step"]
    assert step["path"] == ("lean" if server == "exit_url" else "checked"), step
    assert step["forwards"].get("DECODE", 0) > 0 and step["forwards"].get("EXTEND", 0) > 0, step
    if server == "k3_url":
        assert _hsd_state(url)["draft_catch_up"]["tail_extends"] > 0
    else:
        assert any(name.startswith("DRAFT_EXTEND") for name in step["forwards"]), step
    if step["path"] == "checked":
        assert step["max_checked_error"] is not None and step["max_checked_error"] <= 1e-4, step


def _target_rows(model_dir, sequences, prompt_len=len(STAT_PROMPT), temperature=1.0):
    """The next-token rows at ``temperature`` of the causal LM in ``model_dir`` at each sampled
    position of ``sequences`` [N, P + T] (prompt of ``prompt_len`` = P tokens, then T sampled
    tokens): float64 [N, T, V]."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    with torch.inference_mode():
        logits = model(sequences).logits[:, prompt_len - 1:-1].double()
    return torch.softmax(logits / temperature, -1)


def _pit(probs, sequences, seed=0, prompt_len=len(STAT_PROMPT)):
    """Sequential randomized PIT of the sampled tokens of ``sequences`` (after a prompt of
    ``prompt_len`` tokens) under the rows ``probs`` [N, T, V]: u [N, T], i.i.d. U(0, 1) when the
    tokens follow that joint law."""
    tokens = sequences[:, prompt_len:].unsqueeze(-1)
    below = (probs.cumsum(-1) - probs).gather(-1, tokens).squeeze(-1)
    v = torch.rand(below.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return below + v * probs.gather(-1, tokens).squeeze(-1)


def _target_pit(model_dir, sequences, seed=0, prompt_len=len(STAT_PROMPT)):
    """``_pit`` under the target's joint law at T = 1."""
    return _pit(_target_rows(model_dir, sequences, prompt_len), sequences, seed, prompt_len)


def _min_p_p_value(model_dir, sequences):
    """p-value of "the sampled tokens follow the target's law at T = 1 with ``MIN_P``" (the rows
    SGLang's non-speculative sampler draws from): 0 when a token lies clearly below the min-p
    threshold (impossible under that law), else the PIT chi-square under it. Also returns the
    number of such tokens."""
    rows = _target_rows(model_dir, sequences)
    tokens = sequences[:, len(STAT_PROMPT):].unsqueeze(-1)
    threshold = MIN_P * rows.amax(-1, keepdim=True)
    outside = int((rows.gather(-1, tokens) < threshold * (1 - SUPPORT_MARGIN)).sum())
    flat = rows.reshape(-1, rows.shape[-1])
    law = sglang_sampler_law(flat, torch.full((flat.shape[0],), 1 << 30), torch.ones_like(flat[:, 0]),
                             torch.full_like(flat[:, 0], MIN_P)).view(rows.shape)
    return (0.0 if outside else _pit_p_value(_pit(law, sequences))), outside


def _pit_p_value(u):
    counts = torch.histc(u.flatten().float(), bins=PIT_BINS, min=0.0, max=1.0)
    return chi_square_p_value(counts, torch.full((PIT_BINS,), 1.0 / PIT_BINS))


def _model_law_samples(model_dir, count, seed=1):
    """``count`` sequences whose tokens follow the law of the causal LM in ``model_dir`` at T = 1
    (a plausible wrong law: the draft's, or the target's without min_p)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    seqs = torch.tensor([STAT_PROMPT] * count)
    with torch.inference_mode():
        for _ in range(STAT_TOKENS):
            probs = torch.softmax(model(seqs).logits[:, -1].double(), -1)
            seqs = torch.cat([seqs, torch.multinomial(probs, 1, generator=gen)], 1)
    return seqs


@pytest.mark.statistical
@pytest.mark.parametrize("server", ["k3_url", "tree_url", "stock_url", "exit_url"])
def test_draft_model_sampled_law_is_the_targets(pair, server, request):
    url = request.getfixturevalue(server)
    accept = []  # mean accept length of each sample

    def server_p_value(count):
        with ThreadPoolExecutor(max_workers=8) as pool:
            outs = list(pool.map(lambda _: _generate(url, STAT_PROMPT, STAT_TOKENS,
                                                     temperature=1.0), range(count)))
        sequences = torch.tensor([STAT_PROMPT + out["output_ids"] for out in outs])
        assert sequences.shape == (count, len(STAT_PROMPT) + STAT_TOKENS)
        accept.append(sum(o["meta_info"]["spec_accept_length"] for o in outs) / count)
        u = _target_pit(pair[1], sequences)
        p_value = _pit_p_value(u)
        print(f"\n{server} T=1, {count} samples: PIT chi-square p={p_value:.3g}, per "
              f"position {[round(_pit_p_value(u[:, t]), 4) for t in range(STAT_TOKENS)]}, mean "
              f"accept length {accept[-1]:.2f}")
        return p_value

    p_server = confirmed_p_values(server_p_value, STAT_SAMPLES, f"{server} PIT law test")
    # The same test on the draft's own law (what a sampler that skipped verification would emit).
    p_wrong = _pit_p_value(_target_pit(pair[1], _model_law_samples(pair[2], STAT_SAMPLES)))
    print(f"draft's law, {STAT_SAMPLES} samples: p={p_wrong:.3g}")
    assert p_server[-1] > ALPHA, p_server
    assert p_wrong < ALPHA
    assert accept[0] > 1.0  # drafts were accepted, so verification (not only the bonus) ran


@pytest.mark.statistical
@pytest.mark.parametrize("server", ["k3_url", "tree_url", "stock_url", "exit_url"])
def test_draft_model_min_p_law_is_the_non_speculative_one(pair, server, request):
    """T = 1 with ``min_p``: the tokens' joint law is the one SGLang's non-speculative sampler
    draws from (the target's rows filtered by min-p: no token below the threshold, and the PIT
    under the filtered rows uniform), for chains (q without min-p, SGLang's draft sampler),
    sampled trees (q with it) and the exit level; the same test rejects the target's law
    without min-p, which the server served before its target rows honoured min-p."""
    url = request.getfixturevalue(server)

    def server_p_value(count):
        with ThreadPoolExecutor(max_workers=8) as pool:
            outs = list(pool.map(lambda _: _generate(url, STAT_PROMPT, STAT_TOKENS, temperature=1.0,
                                                     min_p=MIN_P), range(count)))
        sequences = torch.tensor([STAT_PROMPT + out["output_ids"] for out in outs])
        p_value, outside = _min_p_p_value(pair[1], sequences)
        print(f"\n{server} T=1 min_p={MIN_P}, {count} samples: {outside} tokens below the min-p "
              f"threshold, PIT chi-square p={p_value:.3g}")
        return p_value

    p_server = confirmed_p_values(server_p_value, STAT_SAMPLES, f"{server} min_p law test")
    p_wrong, outside = _min_p_p_value(pair[1], _model_law_samples(pair[1], STAT_SAMPLES))
    print(f"target's law without min_p, {STAT_SAMPLES} samples: {outside} tokens below, p={p_wrong:.3g}")
    assert p_server[-1] > ALPHA, p_server
    assert p_wrong < ALPHA


def _support_p_value(law, sequences):
    """p-value of "the sampled tokens of ``sequences`` follow the rows ``law`` [N, T, V]": 0 when
    a token has probability 0 there, else the PIT chi-square. Also returns that token count."""
    tokens = sequences[:, len(STAT_PROMPT):].unsqueeze(-1)
    outside = int((law.gather(-1, tokens) <= 0).sum())
    return (0.0 if outside else _pit_p_value(_pit(law, sequences))), outside


@pytest.mark.statistical
@pytest.mark.parametrize("server", ["k3_url", "tree_url", "stock_url", "exit_url"])
def test_draft_model_top_k_with_top_p_law_is_the_non_speculative_one(pair, server, request):
    """T = 0.7 with top_k 20 and top_p 0.8 (Qwen2.5-Instruct's defaults): the tokens follow the
    law of SGLang's non-speculative sampler (top-p on the original row); the law SGLang's
    speculative verify used to give (top-p on the row renormalised after top-k) is rejected on
    the same samples (it drops tokens the server emits)."""
    url = request.getfixturevalue(server)
    temperature, top_k, top_p = QWEN_DEFAULTS
    samples = {}

    def server_p_value(count):
        with ThreadPoolExecutor(max_workers=8) as pool:
            outs = list(pool.map(lambda _: _generate(url, STAT_PROMPT, STAT_TOKENS, temperature=temperature,
                                                     top_k=top_k, top_p=top_p), range(count)))
        sequences = samples["last"] = torch.tensor([STAT_PROMPT + out["output_ids"] for out in outs])
        rows = _target_rows(pair[1], sequences, temperature=temperature)
        flat = rows.reshape(-1, rows.shape[-1])
        law = sglang_sampler_law(flat, torch.full((flat.shape[0],), top_k), torch.full_like(flat[:, 0], top_p),
                                 torch.zeros_like(flat[:, 0])).view(rows.shape)
        p_value, outside = _support_p_value(law, sequences)
        print(f"\n{server} T={temperature} top_k={top_k} top_p={top_p}, {count} samples: {outside} "
              f"tokens outside the law's support, PIT chi-square p={p_value:.3g}")
        return p_value

    p_server = confirmed_p_values(server_p_value, STAT_SAMPLES, f"{server} top-k + top-p law test")
    sequences = samples["last"]
    rows = _target_rows(pair[1], sequences, temperature=temperature)
    rows = rows.reshape(-1, rows.shape[-1])
    renormalised = cpu_sampling.top_p_renorm_prob(
        cpu_sampling.top_k_renorm_prob(rows, torch.full((rows.shape[0],), top_k)), torch.full_like(rows[:, 0], top_p))
    p_wrong, outside = _support_p_value(renormalised.view(sequences.shape[0], STAT_TOKENS, -1), sequences)
    print(f"renormalised law on the same samples: {outside} tokens outside, p={p_wrong:.3g}")
    assert p_server[-1] > ALPHA, p_server
    assert p_wrong < ALPHA


GRAMMAR = "[a-m ]{40}"  # 46 of the tiny vocabulary's 512 tokens open at the start


def _grammar_law(model_dir, sequences, regex):
    """The law of SGLang's non-speculative sampler under ``regex`` at T = 1: the target's rows at
    the sampled positions of ``sequences`` with every token the grammar forbids (xgrammar's masks,
    the backend SGLang uses, advanced along each sequence) removed, renormalised: [N, T, V]."""
    import xgrammar as xgr
    from transformers import AutoTokenizer

    rows = _target_rows(model_dir, sequences)
    vocab = rows.shape[-1]
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(AutoTokenizer.from_pretrained(model_dir),
                                                                      vocab_size=vocab))
    grammar = compiler.compile_regex(regex)
    masks = torch.zeros(rows.shape, dtype=torch.float32)
    bitmask = xgr.allocate_token_bitmask(1, vocab)
    for n, sequence in enumerate(sequences[:, len(STAT_PROMPT):].tolist()):
        matcher = xgr.GrammarMatcher(grammar)
        for t, token in enumerate(sequence):
            matcher.fill_next_token_bitmask(bitmask)
            xgr.apply_token_bitmask_inplace(masks[n, t].view(1, -1), bitmask)
            assert matcher.accept_token(token), (n, t, token)  # the server kept to the grammar
    masked = torch.where(torch.isfinite(masks), rows, 0.0)
    return masked / masked.sum(-1, keepdim=True)


@pytest.mark.statistical
@pytest.mark.parametrize("server", ["k3_url", "tree_url", "stock_url", "exit_url"])
def test_draft_model_grammar_law_is_the_masked_targets(pair, server, request):
    """T = 1 with a regex: the tokens follow the target's law masked by the grammar at each step
    (drafts the grammar forbids are rejected, the rest verified against the masked rows); the
    target's unmasked law, what a server ignoring the grammar's effect on p would give, is
    rejected on the same samples."""
    url = request.getfixturevalue(server)
    samples = {}

    def server_p_value(count):
        with ThreadPoolExecutor(max_workers=8) as pool:
            outs = list(pool.map(lambda _: _generate(url, STAT_PROMPT, STAT_TOKENS, temperature=1.0,
                                                     regex=GRAMMAR), range(count)))
        sequences = samples["last"] = torch.tensor([STAT_PROMPT + out["output_ids"] for out in outs])
        p_value, outside = _support_p_value(_grammar_law(pair[1], sequences, GRAMMAR), sequences)
        print(f"\n{server} T=1 regex {GRAMMAR!r}, {count} samples: {outside} tokens outside the masked "
              f"law's support, PIT chi-square p={p_value:.3g}")
        return p_value

    p_server = confirmed_p_values(server_p_value, STAT_SAMPLES, f"{server} grammar law test")
    sequences = samples["last"]
    p_wrong = _pit_p_value(_target_pit(pair[1], sequences))
    print(f"unmasked target law on the same samples: p={p_wrong:.3g}")
    assert p_server[-1] > ALPHA, p_server
    assert p_wrong < ALPHA


def _penalised_greedy(model_dir, prompt, steps, **penalties):
    """Plain greedy decoding with penalties on the output so far (``tests/penalty_reference.py``;
    ``penalties``: its keyword arguments)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    out = []
    with torch.no_grad():
        for _ in range(steps):
            logits = model(torch.tensor([prompt + out])).logits[0, -1].double().numpy()
            out.append(int(penalised_logits(logits, out, **penalties).argmax()))
    return out


def request_penalties(sampling: dict) -> dict:
    """``penalised_logits``' keyword arguments from a request's sampling parameters."""
    names = {"frequency_penalty": "frequency", "presence_penalty": "presence", "repetition_penalty": "repetition"}
    return {names[key]: value for key, value in sampling.items() if key in names}


@pytest.mark.parametrize("server", ["k3_url", "tree_url", "stock_url", "exit_url"])
def test_draft_model_penalised_greedy_equals_plain_decoding(pair, server, request):
    """Greedy requests with frequency, presence and repetition penalties on a chain, a tree and
    the exit level: the output equals plain greedy decoding with each step penalised by the
    output so far. (On this tiny pair few greedy drafts survive the penalties, so SGLang's
    relaxed penalties give the same text here; ``tests/test_penalties.py`` is where per-path
    penalties are told apart from them.)"""
    url = request.getfixturevalue(server)
    model_dir = pair[1]
    cases = [dict(frequency_penalty=1.0), dict(presence_penalty=1.5), dict(repetition_penalty=1.3),
             dict(frequency_penalty=0.5, presence_penalty=0.5, repetition_penalty=1.1)]
    jobs = [(ids, case) for ids in PROMPTS[:2] for case in cases]
    with ThreadPoolExecutor(max_workers=8) as pool:
        outputs = list(pool.map(lambda job: _generate(url, job[0], **job[1]), jobs))
    for (ids, case), out in zip(jobs, outputs):
        expected = _penalised_greedy(model_dir, ids, MAX_NEW_TOKENS, **request_penalties(case))
        assert out["output_ids"] == expected, (ids, case)


@pytest.fixture(scope="module")
def plain_url(pair):
    """The target without speculation, without the overlap scheduler (which applies penalties one
    token late; HSD runs without it on CPU)."""
    from sglang_hsd.sglang_plugin.cpu.cpu_server import cpu_server_command, free_port, running_server, server_env

    root, target, _ = pair
    cmd = cpu_server_command(target, free_port(), extra=["--dtype", "float32", "--disable-radix-cache",
                                                        "--disable-overlap-schedule"])
    with running_server(cmd, server_env(), str(root / "plain.log")) as url:
        yield url


@pytest.mark.parametrize("feature", ["logit_bias", "top_k_top_p", "penalties", "min_new_tokens", "regex",
                                     "json_schema", "ebnf", "n"])
@pytest.mark.parametrize("server", ["k3_url", "tree_url", "stock_url", "exit_url"])
def test_request_features_give_the_plain_servers_greedy_text(pair, plain_url, server, feature, request):
    """Greedy requests with each request feature of ``test_server_e2e.FEATURES`` on the chain, the
    sampled tree and the exit level: the token ids the target without speculation gives (both
    completions for ``n`` = 2), up to a float near-tie of the target's logits."""
    from tests.sglang_plugin.test_server_e2e import assert_features_give_the_plain_servers_greedy_text

    assert_features_give_the_plain_servers_greedy_text(pair[1], plain_url, request.getfixturevalue(server),
                                                       PROMPTS[:2], feature)


@pytest.mark.parametrize("server", ["k3_url", "tree_url", "stock_url", "exit_url"])
def test_stop_strings_and_ids_and_logprobs_equal_the_plain_servers(plain_url, server, request):
    """``test_server_e2e``'s stop and logprob checks on the chain, the sampled tree and the exit level."""
    from tests.sglang_plugin import test_server_e2e as e2e

    e2e.test_stop_strings_and_ids_and_logprobs_equal_the_plain_servers(plain_url, request.getfixturevalue(server))


def test_token_ids_outside_the_vocabulary_are_refused_and_the_server_lives(k3_url, reference):
    """``input_ids`` with an id outside the vocabulary (or negative) get HTTP 400 naming the id;
    it used to kill the scheduler in the target's embedding. A normal request is served after."""
    import requests

    for ids in ([1, 2, 10_000_000], [1, -3]):
        response = requests.post(k3_url + "/generate", json={
            "input_ids": ids, "sampling_params": {"max_new_tokens": 4}}, timeout=60)
        assert response.status_code == 400, response.text
        assert "not a token id of this model" in response.text
    assert _generate(k3_url, PROMPTS[0])["output_ids"] == reference[0]


@pytest.mark.parametrize("server", ["k3_url", "tree_url", "stock_url"])
def test_draft_model_load_with_aborts_returns_kv(pair, server, request):
    from benchmarks.bench_sglang_load import make_jobs, run_job, wait_idle

    url = request.getfixturevalue(server)
    vocab = 512
    start = _hsd_state(url)
    assert start["draft_kv_available_size"] == start["kv_available_size"]
    jobs = make_jobs(32, seed=3, vocab=vocab)
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:  # all 32 in flight at once
        results = list(pool.map(lambda job: run_job(url, job, vocab), jobs))
    assert all(r["valid"] for r in results), results
    assert any(r["kind"] == "aborted" for r in results), results
    wait_idle(url, start["kv_available_size"])
    end = _hsd_state(url)
    assert end["kv_available_size"] == start["kv_available_size"], (start, end)
    assert end["draft_kv_available_size"] == start["draft_kv_available_size"], (start, end)
