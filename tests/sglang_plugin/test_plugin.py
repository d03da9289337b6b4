"""Plugin registration, server-arg resolution, signature refusal and the verify entry point.

Regimes: the real entry-point load (``load_plugins``), the worker factory reading the
configuration, SGLang's own verify function ``eagle_utils.eagle_sample`` driven with CPU tensors
through hooks bound to a ``VerifyHookState`` (sampled batch -> our verifier, all-greedy batch ->
SGLang's argmax path, an exit round -> the target level of that round, only within its verify
call), a drifted SGLang signature, a reduced draft vocabulary.
"""

from __future__ import annotations

import types

import pytest
import torch

pytest.importorskip("sglang")
pytestmark = pytest.mark.sglang

from sglang_hsd.sglang_plugin import verify_hook  # noqa: E402
from sglang_hsd.sglang_plugin.config import PluginConfig  # noqa: E402
from sglang_hsd.verify import ChainUniforms, verify_chain  # noqa: E402
from tests.sglang_plugin.plugin_fixtures import (  # noqa: E402,F401 (fixtures)
    args_namespace, eagle3_draft_kind, fake_sglang_state, plugin_loaded)


def test_entry_point_registers_hsd_as_eagle3_family(plugin_loaded):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from sglang_hsd.sglang_plugin.spec_algo import DUCK_TYPED_METHODS

    algo = SpeculativeAlgorithm.from_string("hsd")
    assert algo.name == "HSD" and algo.is_eagle() and algo.is_eagle3()
    assert algo.carries_draft_hidden_states() and algo.need_topk()
    assert algo.get_platform_worker_cls() is None
    for name in DUCK_TYPED_METHODS:
        assert callable(getattr(algo, name)), name
    plugin_loaded.register()  # idempotent
    assert SpeculativeAlgorithm.from_string("HSD") is algo


def test_server_args_defaults_turn_on_sampled_chain_drafting(plugin_loaded):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    args = args_namespace()
    SpeculativeAlgorithm.from_string("HSD").handle_server_args(args)
    assert (args.speculative_num_steps, args.speculative_eagle_topk,
            args.speculative_num_draft_tokens) == (4, 1, 5)
    assert args.speculative_use_rejection_sampling is True
    assert args.disable_overlap_schedule is True and args.enable_mixed_chunk is False


@pytest.mark.parametrize("overrides, says", [
    (dict(speculative_num_steps=3, speculative_eagle_topk=4), "--speculative-num-draft-tokens"),
    (dict(speculative_accept_threshold_single=0.5), "remove them"),
    (dict(speculative_use_block_verification=True), "--hsd-verify-method"),
    (dict(speculative_draft_model_path=None), "an EAGLE-3 head or a small language model"),
])
def test_server_args_refuse_unsupported_combinations(plugin_loaded, overrides, says):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from sglang_hsd.sglang_plugin.server_args import HSDServerArgsError

    algo = SpeculativeAlgorithm.from_string("HSD")
    with pytest.raises(HSDServerArgsError, match="HSD") as err:
        algo.validate_server_args(args_namespace(**overrides))
    assert says in str(err.value)


def test_cli_flag_sets_verify_method(plugin_loaded, monkeypatch):
    import argparse

    from sglang.srt.server_args import ServerArgs

    # setenv (not delenv) so monkeypatch restores the variable's absence after the test: the
    # flag's action writes os.environ directly.
    monkeypatch.setenv("SGLANG_HSD_VERIFY_METHOD", "hsd")
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(["--model-path", "x", "--hsd-verify-method", "tokenwise"])
    assert not hasattr(ns, "hsd_verify_method")  # never reaches the ServerArgs dataclass
    import os

    assert os.environ["SGLANG_HSD_VERIFY_METHOD"] == "tokenwise"


def test_worker_factory_reads_the_configuration_once(plugin_loaded, monkeypatch):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from sglang_hsd.sglang_plugin.worker import HSDWorker

    algo = SpeculativeAlgorithm.from_string("HSD")
    monkeypatch.setenv("SGLANG_HSD_VERIFY_METHOD", "tokenwise")
    monkeypatch.setenv("SGLANG_HSD_EXIT_METHOD", "hsd")
    worker = algo.create_worker(args_namespace())
    assert worker.func is HSDWorker
    assert worker.keywords["plugin_config"] == PluginConfig(verify_method="tokenwise")
    assert worker.keywords["exit_config"].method == "hsd"
    assert not worker.keywords["exit_config"].enabled
    monkeypatch.setenv("SGLANG_HSD_VERIFY_METHOD", "hsd-paper")  # lossy: refused before any model
    with pytest.raises(ValueError, match="SGLANG_HSD_VERIFY_METHOD"):
        algo.create_worker(args_namespace())


def test_plugin_refuses_drifted_signature(plugin_loaded, monkeypatch):
    from sglang.srt.speculative import eagle_utils

    from sglang_hsd.sglang_plugin.signatures import SGLangSignatureError, check_signature

    def fake_verify_uses_greedy(*, is_all_greedy, is_cpu):  # SGLang changed its parameters
        return is_all_greedy

    monkeypatch.setattr(eagle_utils, "_verify_uses_greedy", fake_verify_uses_greedy)
    monkeypatch.setattr(plugin_loaded, "_REGISTERED", False)
    with pytest.raises(SGLangSignatureError) as err:
        plugin_loaded.register()
    message = str(err.value)
    assert "sglang.srt.speculative.eagle_utils._verify_uses_greedy" in message
    assert "use_rejection_sampling" in message  # the expected signature
    assert "(*, is_all_greedy, is_cpu)" in message  # the one found
    with pytest.raises(SGLangSignatureError, match="does not exist"):
        check_signature("sglang.srt.speculative.eagle_utils.no_such_symbol",
                        expected="(x)")


# --- SGLang's own verify entry point (eagle_utils.eagle_sample) on CPU tensors --------------

def _install_hooks(monkeypatch, method="hsd"):
    """Hooks bound to a fresh ``VerifyHookState``, as an ``HSDWorker`` installs them; SGLang's
    functions are restored after the test."""
    from sglang.srt.speculative import eagle_utils

    for name in ("chain_speculative_sampling_triton", "_verify_uses_greedy"):
        monkeypatch.setattr(eagle_utils, name, getattr(eagle_utils, name))
    state = verify_hook.VerifyHookState(PluginConfig(verify_method=method))
    verify_hook.install_verify_hooks(state)
    return state


def _chain_batch(bs, num_steps, vocab, all_greedy, seed):
    gen = torch.Generator().manual_seed(seed)
    n = num_steps + 1
    q = torch.softmax(torch.randn(bs, num_steps, vocab, generator=gen) * 2, -1)
    drafts = torch.multinomial(q.reshape(-1, vocab), 1, generator=gen).reshape(bs, num_steps)
    root = torch.randint(vocab, (bs, 1), generator=gen)
    verify_input = types.SimpleNamespace(
        draft_token=torch.cat([root, drafts], 1).reshape(-1),
        draft_token_num=n, max_tree_depth=n, tree_topk=1, draft_probs=q,
        retrieve_index=torch.arange(bs * n).reshape(bs, n),
        retrieve_next_token=torch.where(torch.arange(n) + 1 < n, torch.arange(n) + 1, -1)
        .expand(bs, n).contiguous(),
        retrieve_next_sibling=torch.full((bs, n), -1), custom_mask=None, positions=None,
    )
    sampling_info = types.SimpleNamespace(
        is_all_greedy=all_greedy, acc_additive_penalties=None, acc_scaling_penalties=None,
        logit_bias=None, temperatures=torch.ones(bs, 1), top_ks=torch.full((bs,), 1 << 30),
        top_ps=torch.ones(bs), min_ps=torch.zeros(bs), need_top_k_sampling=False,
        need_top_p_sampling=False, need_min_p_sampling=False, sampling_seed=None,
        has_watermark_candidates=False,
    )
    batch = types.SimpleNamespace(
        device="cpu", seq_lens=torch.full((bs,), 7), sampling_info=sampling_info,
        forward_mode=types.SimpleNamespace(is_idle=lambda: False), return_logprob=False,
    )
    logits = types.SimpleNamespace(next_token_logits=torch.randn(bs * n, vocab, generator=gen))
    return verify_input, batch, logits


@pytest.mark.parametrize("method", ["hsd", "tokenwise"])
def test_eagle_sample_runs_our_verifier(plugin_loaded, monkeypatch, method):
    from sglang.srt.speculative import eagle_utils

    fake_sglang_state(monkeypatch)
    state = _install_hooks(monkeypatch, method)
    bs, steps, vocab = 6, 3, 11
    verify_input, batch, logits = _chain_batch(bs, steps, vocab, all_greedy=False, seed=1)
    target_probs = torch.softmax(logits.next_token_logits, -1).reshape(bs, steps + 1, vocab)

    torch.manual_seed(123)  # eagle_sample draws its coins with torch.rand
    with state.verify_call(batch.sampling_info):
        predict, accept_lens, accept_index = eagle_utils.eagle_sample(verify_input, batch, logits)
    assert state.hsd_calls == 1

    torch.manual_seed(123)
    coins = torch.rand(bs, steps + 1)
    final = torch.rand(bs)
    candidates = verify_input.draft_token.reshape(bs, steps + 1)
    direct = verify_chain(candidates[:, 1:], verify_input.draft_probs, target_probs, method,
                          uniforms=ChainUniforms(accept=coins[:, :steps], sample=final))
    assert torch.equal(accept_lens.long(), direct.num_accepted + 1)
    for b in range(bs):
        n = int(direct.num_accepted[b])
        rows = accept_index[b, : n + 1].long()
        assert torch.equal(rows, torch.arange(n + 1) + b * (steps + 1))
        assert torch.equal(predict[rows].long(), direct.tokens[b, : n + 1])
        assert (accept_index[b, n + 1:] == -1).all()


def test_all_greedy_batch_takes_sglang_argmax_path(plugin_loaded, monkeypatch):
    from sglang.srt.speculative import eagle_utils

    fake_sglang_state(monkeypatch)
    state = _install_hooks(monkeypatch)
    bs, steps, vocab = 4, 3, 9
    verify_input, batch, logits = _chain_batch(bs, steps, vocab, all_greedy=True, seed=2)
    argmax = logits.next_token_logits.argmax(-1).reshape(bs, steps + 1)
    # Make request 0 match the target argmax on its first two drafts.
    tokens = verify_input.draft_token.reshape(bs, steps + 1)
    tokens[0, 1:3] = argmax[0, :2]
    predict, accept_lens, _ = eagle_utils.eagle_sample(verify_input, batch, logits)
    assert state.hsd_calls == 0
    assert int(accept_lens[0]) >= 3
    assert int(predict[2]) == int(argmax[0, 2])


def test_other_algorithms_keep_sglang_sampler(plugin_loaded, monkeypatch):
    from sglang.srt.speculative import eagle_utils

    fake_sglang_state(monkeypatch, algorithm="EAGLE3")
    _install_hooks(monkeypatch)
    assert verify_hook.hsd_is_active() is False
    assert eagle_utils._verify_uses_greedy(is_all_greedy=False, is_cpu=True, is_hip=False,
                                           is_xpu=False, use_rejection_sampling=True) is True


def test_exit_round_reaches_the_sampler_of_its_own_verify_call_only(plugin_loaded, monkeypatch):
    """An exit round left in the state sends even an all-greedy batch to the chain sampler,
    which verifies the exit's chain (not the drafts) and reports to the exit level; once the
    verify call ends, the next batch is a plain two-level round again."""
    from sglang.srt.speculative import eagle_utils

    from sglang_hsd.sglang_plugin.exit_level import ExitRound

    fake_sglang_state(monkeypatch)
    state = _install_hooks(monkeypatch)
    bs, steps, vocab = 3, 3, 7
    verify_input, batch, logits = _chain_batch(bs, steps, vocab, all_greedy=True, seed=3)
    argmax = logits.next_token_logits.argmax(-1).reshape(bs, steps + 1)
    # The exit's chain: the target's argmax at the first two positions, so the target accepts
    # all of it and emits exactly those two tokens (no bonus token after an exit chain).
    chain = torch.full((bs, steps + 1), -1)
    chain[:, :2] = argmax[:, :2]
    proposal = types.SimpleNamespace(
        chain_tokens=chain, chain_len=torch.full((bs,), 2),
        chain_probs=torch.nn.functional.one_hot(chain.clamp_min(0), vocab).float())
    recorded = []
    verifier = types.SimpleNamespace(record=lambda *args: recorded.append(args))

    with state.verify_call(batch.sampling_info):
        state.exit_round = ExitRound(proposal, "greedy", True, verifier)
        predict, accept_lens, accept_index = eagle_utils.eagle_sample(verify_input, batch, logits)
    assert state.exit_round is None and state.hsd_calls == 1 and len(recorded) == 1
    assert (accept_lens == 2).all()
    assert torch.equal(recorded[0][2], torch.full((bs,), 2))  # chain tokens the target accepted
    rows = accept_index[:, :2].long()
    assert torch.equal(rows, torch.arange(2) + (steps + 1) * torch.arange(bs).unsqueeze(1))
    assert torch.equal(predict[rows].long(), argmax[:, :2])

    eagle_utils.eagle_sample(verify_input, batch, logits)  # after the call: SGLang's argmax
    assert state.hsd_calls == 1


def test_scatter_draft_probs_to_target_vocab():
    from sglang_hsd.sglang_plugin.draft_probs import is_identity_map, scatter_draft_probs

    q = torch.softmax(torch.randn(2, 3, 4), -1)
    hot = torch.tensor([0, 2, 5, 7])  # d2t = [0, 1, 3, 4]
    assert not is_identity_map(hot, 9)
    full = scatter_draft_probs(q, hot, 9, is_identity=False)
    assert full.shape == (2, 3, 9)
    assert torch.equal(full[..., hot], q)
    assert full.sum(-1).sub(1).abs().max() < 1e-6
    assert (full[..., [1, 3, 4, 6, 8]] == 0).all()


def test_scatter_draft_probs_decides_by_content_not_width():
    """A full-width map that permutes ids scatters; only the identity map is returned as is, and
    the identity flag with a width that cannot be the identity is refused."""
    from sglang_hsd.sglang_plugin.draft_probs import is_identity_map, scatter_draft_probs

    q = torch.softmax(torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(0)), -1)
    permuted = torch.tensor([3, 0, 4, 1, 2])
    assert not is_identity_map(permuted, 5)
    full = scatter_draft_probs(q, permuted, 5, is_identity=False)
    assert torch.equal(full[..., permuted], q) and not torch.equal(full, q)
    identity = torch.arange(5)
    assert is_identity_map(identity, 5) and is_identity_map(None, 5)
    assert not is_identity_map(torch.arange(4), 5)
    assert scatter_draft_probs(q, identity, 5, is_identity=True) is q
    with pytest.raises(ValueError, match="is_identity"):
        scatter_draft_probs(q[..., :4], identity[:4], 5, is_identity=True)


def test_draft_worker_decides_the_identity_once_when_the_map_loads():
    """``TargetVocabDraft``: the flag is set with the vocabulary when the map loads, and each
    round's q is scattered by it (a permuted full-width map is not passed through)."""
    from sglang_hsd.sglang_plugin.draft_worker import TargetVocabDraft

    worker = types.SimpleNamespace(
        hot_token_id=torch.tensor([1, 0, 2]),
        target_worker=types.SimpleNamespace(model_config=types.SimpleNamespace(vocab_size=3)))
    TargetVocabDraft._hsd_record_vocab(worker)
    assert worker.hsd_target_vocab_size == 3 and worker.hsd_identity_token_map is False
    q = torch.tensor([[[0.7, 0.2, 0.1]]])
    full = TargetVocabDraft._hsd_full_vocab(worker, q)
    assert torch.equal(full, torch.tensor([[[0.2, 0.7, 0.1]]]))
    worker.hot_token_id = torch.arange(3)
    TargetVocabDraft._hsd_record_vocab(worker)
    assert worker.hsd_identity_token_map is True
    assert TargetVocabDraft._hsd_full_vocab(worker, q) is q


def test_repetition_penalty_scales_eagerly_on_cpu(plugin_loaded):
    """On CPU SGLang's ``torch.compile``-d ``apply_scaling_penalties`` (repetition penalty) is
    replaced, in its module and in ``sampling_batch_info``, by the function it compiles: the first
    request with a repetition penalty took 15.1 s for 16 tokens on a tiny model while dynamo
    compiled it. It scales as SGLang's does and no frame goes through dynamo."""
    from sglang.srt.sampling import sampling_batch_info
    from sglang.srt.sampling.penaltylib import repetition_penalty
    from sglang.srt.utils import is_cpu
    from torch._dynamo.utils import counters

    if not is_cpu():
        pytest.skip("CPU only")
    frames = counters["frames"]["total"]
    for module in (repetition_penalty, sampling_batch_info):
        assert module.apply_scaling_penalties.__sglang_hsd_original__._torchdynamo_orig_callable is not None
        logits = torch.tensor([[2.0, -2.0, 0.5], [1.0, -1.0, 0.0]])
        module.apply_scaling_penalties(logits, torch.tensor([[2.0, 2.0, 1.0], [1.0, 4.0, 4.0]]))
        assert torch.equal(logits, torch.tensor([[1.0, -4.0, 0.5], [1.0, -4.0, 0.0]]))
    assert counters["frames"]["total"] == frames


def test_later_draft_steps_select_their_tokens_eagerly_on_cpu(plugin_loaded):
    """On CPU SGLang's ``torch.compile``-d ``_select_top_k_tokens_later`` is replaced by the
    function it compiles (compiling it cost 11-15 s of every server's first 2-draft round): a
    later draft step's token selection, chains and trees, runs without dynamo compiling a frame,
    and the compiled original stays reachable for the signature checks."""
    from sglang.srt.speculative import spec_utils
    from sglang.srt.utils import is_cpu
    from torch._dynamo.utils import counters

    if not is_cpu():
        pytest.skip("CPU only")
    original = spec_utils._select_top_k_tokens_later.__sglang_hsd_original__
    assert original._torchdynamo_orig_callable is not None
    generator = torch.Generator().manual_seed(0)
    frames = counters["frames"]["total"]
    for batch, topk in ((1, 1), (3, 1), (2, 2)):
        input_ids, _, topk_p, _ = spec_utils.select_top_k_tokens(
            2, torch.rand(batch * topk, topk, generator=generator),
            torch.randint(0, 50, (batch * topk, topk), generator=generator),
            torch.rand(batch * topk, 8, generator=generator), torch.rand(batch, topk, generator=generator),
            topk)
        assert input_ids.shape == (batch * topk,) and topk_p.shape == (batch, topk)
    assert counters["frames"]["total"] == frames  # no frame went through dynamo


def test_the_docs_flag_table_is_the_flags_table():
    """``docs/sglang_plugin.md``'s flag table is ``cli_flags.HSD_FLAGS`` (what ``--help`` prints)."""
    from pathlib import Path

    from sglang_hsd.sglang_plugin.cli_flags import flags_markdown

    docs = (Path(__file__).parents[2] / "docs" / "sglang_plugin.md").read_text()
    block = docs.split("<!-- generated: cli_flags.flags_markdown() -->\n")[1].split("<!-- end generated -->")[0]
    assert block == flags_markdown(), "regenerate the flag table in docs/sglang_plugin.md from flags_markdown()"
