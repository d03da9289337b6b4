"""API, numerics and bad-input behaviour of ``verify_chain``."""

import contextlib

import pytest
import torch

from sglang_hsd.verify import PLACEHOLDER_TOKEN_ID, ChainUniforms, verify_chain
from sglang_hsd.verify.chain import hsd_weights


def _random_inputs(batch=4, num_draft=3, vocab=11, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    q = torch.softmax(torch.randn(batch, num_draft, vocab, generator=gen), -1).to(dtype)
    p = torch.softmax(torch.randn(batch, num_draft + 1, vocab, generator=gen), -1).to(dtype)
    tokens = torch.multinomial(q.reshape(-1, vocab).float(), 1, generator=gen).reshape(batch, num_draft)
    return tokens, q, p


@pytest.mark.parametrize("method", ["hsd", "tokenwise", "greedy", "hsd-paper"])
def test_output_shapes_and_layout(method):
    tokens, q, p = _random_inputs()
    with pytest.warns(UserWarning) if method == "hsd-paper" else contextlib.nullcontext():
        res = verify_chain(tokens, q, p, method=method, generator=torch.Generator().manual_seed(0))
    assert res.num_accepted.dtype == torch.int64 and res.num_accepted.shape == (4,)
    assert res.tokens.shape == (4, 4)
    for b in range(4):
        n = int(res.num_accepted[b])
        assert torch.equal(res.tokens[b, :n], tokens[b, :n])
        assert 0 <= int(res.tokens[b, n]) < 11
        assert (res.tokens[b, n + 1 :] == PLACEHOLDER_TOKEN_ID).all()


def test_same_uniforms_same_tokens_and_generator_reproducible():
    tokens, q, p = _random_inputs(batch=16)
    u = ChainUniforms.draw(16, 3, generator=torch.Generator().manual_seed(3))
    a = verify_chain(tokens, q, p, uniforms=u)
    b = verify_chain(tokens, q, p, uniforms=u)
    assert torch.equal(a.tokens, b.tokens)
    c = verify_chain(tokens, q, p, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a.tokens, c.tokens)


def test_p_equal_q_accepts_everything_without_nan():
    tokens, q, _ = _random_inputs(batch=32, num_draft=5)
    p = torch.cat([q, q[:, :1]], dim=1)
    for method in ("hsd", "tokenwise"):
        res = verify_chain(tokens, q, p, method=method, generator=torch.Generator().manual_seed(1))
        assert (res.num_accepted == 5).all()
        assert (res.tokens >= 0).all()


def test_long_draft_with_underflowing_joint_probability_is_finite():
    # K = 16 over a 50k vocabulary: the joint draft probability underflows float32 (~1e-75).
    batch, num_draft, vocab = 2, 16, 50_000
    gen = torch.Generator().manual_seed(0)
    q = torch.softmax(torch.randn(batch, num_draft, vocab, generator=gen), -1)
    p = torch.softmax(torch.randn(batch, num_draft + 1, vocab, generator=gen), -1)
    tokens = torch.multinomial(q.reshape(-1, vocab), 1, generator=gen).reshape(batch, num_draft)
    assert (q.gather(-1, tokens[..., None]).prod(1) == 0).all()  # the joint probability underflowed
    p[:, :num_draft] = q  # ratios of exactly 1 keep the long prefix alive
    res = verify_chain(tokens, q, p, generator=gen)
    assert (res.num_accepted == num_draft).all()
    assert (res.tokens >= 0).all()
    # Unrelated p and q: joint ratios span hundreds of orders of magnitude; weights stay finite.
    p = torch.softmax(torch.randn(batch, num_draft + 1, vocab, generator=gen), -1)
    idx = tokens[..., None]
    h, r_star = hsd_weights(p[:, :-1].gather(-1, idx)[..., 0], q.gather(-1, idx)[..., 0], q, p)
    assert torch.isfinite(h).all() and torch.isfinite(r_star).all()
    assert ((h >= 0) & (h <= 1)).all()


def test_greedy_accepts_argmax_matches_with_one_hot_probs():
    p = torch.zeros(1, 4, 5)
    p[0, torch.arange(4), torch.tensor([1, 2, 3, 4])] = 1.0
    tokens = torch.tensor([[1, 2, 0]])
    res = verify_chain(tokens, None, p, method="greedy")
    assert res.num_accepted.tolist() == [2]
    assert res.tokens.tolist() == [[1, 2, 3, PLACEHOLDER_TOKEN_ID]]


def test_half_precision_inputs_are_computed_in_float32():
    tokens, q, p = _random_inputs(dtype=torch.bfloat16)
    res = verify_chain(tokens, q.float(), p.float(), generator=torch.Generator().manual_seed(0), validate=False)
    assert res.tokens.shape == (4, 4)


# ---- bad input ------------------------------------------------------------------------------


def _case(mutate):
    tokens, q, p = _random_inputs()
    return mutate(tokens.clone(), q.clone(), p.clone())


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda t, q, p: (t, q.index_fill(0, torch.tensor([0]), float("nan")), p), "draft_probs contains NaN"),
        (lambda t, q, p: (t, q, p - 0.01), "target_probs contains negative|target_probs rows must sum"),
        (lambda t, q, p: (t, q * 1.1, p), "draft_probs rows must sum to 1"),
        (lambda t, q, p: (t, q, p[:, :3]), r"target_probs must have shape \[B, K \+ 1, V\]"),
        (lambda t, q, p: (t, q[..., :10], p), "draft_probs must have shape"),
        (lambda t, q, p: (t[:, :0], q[:, :0], p[:, :1]), "K = 0"),
        (lambda t, q, p: (t + 100, q, p), "draft_tokens has token ids outside"),
        (lambda t, q, p: (t.float(), q, p), "draft_tokens must be int64"),
    ],
)
def test_bad_input_raises_value_error_naming_the_argument(mutate, match):
    tokens, q, p = _case(mutate)
    with pytest.raises(ValueError, match=match):
        verify_chain(tokens, q, p)


def test_drafted_token_with_zero_q_is_rejected():
    tokens, q, p = _random_inputs()
    q[0, 0] = 0.0
    q[0, 0, (tokens[0, 0] + 1) % 11] = 1.0
    with pytest.raises(ValueError, match="probability 0 to a drafted token"):
        verify_chain(tokens, q, p)


def test_unknown_method_and_missing_q_and_bad_uniforms():
    tokens, q, p = _random_inputs()
    with pytest.raises(ValueError, match="method must be one of"):
        verify_chain(tokens, q, p, method="blockwise")
    with pytest.raises(ValueError, match="draft_probs is required"):
        verify_chain(tokens, None, p, method="hsd")
    bad = ChainUniforms(accept=torch.rand(4, 2), sample=torch.rand(4))
    with pytest.raises(ValueError, match=r"uniforms.accept must have shape \[4, 3\]"):
        verify_chain(tokens, q, p, uniforms=bad)


@pytest.mark.filterwarnings("ignore:method 'hsd-paper'")
@pytest.mark.parametrize("method", ["hsd", "tokenwise", "greedy", "hsd-paper"])
def test_ragged_draft_lengths_equal_truncated_drafts(method):
    # Row b with draft_lengths[b] = K_b must behave exactly like a K_b-token draft with the same
    # uniforms (accept columns 0..K_b-1, same sample uniform).
    batch, num_draft, vocab = 6, 4, 9
    tokens, q, p = _random_inputs(batch, num_draft, vocab, seed=5)
    p[:, :num_draft] = 0.7 * q + 0.3 * p[:, :num_draft]  # long accepted prefixes
    lengths = torch.tensor([1, 2, 3, 4, 2, 3])
    for seed in range(5):
        u = ChainUniforms.draw(batch, num_draft, generator=torch.Generator().manual_seed(seed))
        ragged = verify_chain(tokens, q, p, method=method, uniforms=u, draft_lengths=lengths)
        for b in range(batch):
            k = int(lengths[b])
            rows = slice(b, b + 1)
            u_b = ChainUniforms(u.accept[rows, :k], u.sample[rows])
            alone = verify_chain(tokens[rows, :k], q[rows, :k], p[rows, : k + 1].clone(), method=method, uniforms=u_b)
            assert int(ragged.num_accepted[b]) == int(alone.num_accepted[0])
            assert ragged.tokens[b, : k + 1].tolist() == alone.tokens[0].tolist()
            assert (ragged.tokens[b, k + 1 :] == PLACEHOLDER_TOKEN_ID).all()


def test_ragged_rows_beyond_length_are_not_validated_and_bad_lengths_are():
    tokens, q, p = _random_inputs(batch=2, num_draft=3)
    q[0, 2] = float("nan")  # beyond row 0's length: ignored
    p[0, 3] = float("nan")
    res = verify_chain(tokens, q, p, draft_lengths=torch.tensor([2, 3]), generator=torch.Generator().manual_seed(0))
    assert int(res.num_accepted[0]) <= 2
    with pytest.raises(ValueError, match=r"draft_lengths must lie in \[1, K = 3\]"):
        verify_chain(tokens, q.nan_to_num(0.5), p, draft_lengths=torch.tensor([0, 3]))
