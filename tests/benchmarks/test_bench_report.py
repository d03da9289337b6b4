"""Tables, plots and the coupling bound of ``benchmarks/bench_report.py`` on synthetic results.

The bound is checked by exact enumeration on a tiny vocabulary with context-dependent p and q:
its q-weighted mean over all drafts must equal sum_k (1 - TV) of the joint k-token laws, and it
must dominate hsd, which must dominate tokenwise (expectations over drafts, not per draft).
"""

import itertools
import sys

import pytest
import torch

from benchmarks import bench_report
from sglang_hsd.verify.chain import expected_accepted_per_length

# Sums of a few dozen float64 products.
EXACT_ATOL = 1e-12


def _world(vocab=3, num_draft=3, seed=0):
    """Random context-dependent laws: q(prefix) and p(prefix) for every prefix up to num_draft."""
    gen = torch.Generator().manual_seed(seed)
    prefixes = [()] + [t for k in range(1, num_draft + 1) for t in itertools.product(range(vocab), repeat=k)]
    law = lambda: torch.distributions.Dirichlet(torch.full((vocab,), 0.7, dtype=torch.float64)).sample()  # noqa: E731
    torch.manual_seed(seed)
    return {pre: law() for pre in prefixes}, {pre: law() for pre in prefixes}


def _all_drafts(q, p, vocab, num_draft):
    drafts = list(itertools.product(range(vocab), repeat=num_draft))
    tokens = torch.tensor(drafts)
    q_rows = torch.stack([torch.stack([q[d[:j]] for j in range(num_draft)]) for d in drafts])
    p_rows = torch.stack([torch.stack([p[d[:j]] for j in range(num_draft + 1)]) for d in drafts])
    weight = torch.tensor([float(torch.prod(torch.stack([q[d[:j]][d[j]] for j in range(num_draft)]))) for d in drafts],
                          dtype=torch.float64)
    return tokens, q_rows, p_rows, weight


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_coupling_bound_is_sum_of_joint_overlaps_and_dominates_hsd(seed):
    vocab, num_draft = 3, 3
    q, p = _world(vocab, num_draft, seed)
    tokens, q_rows, p_rows, weight = _all_drafts(q, p, vocab, num_draft)
    bound = (weight[:, None] * bench_report.coupling_bound_per_length(tokens, q_rows, p_rows)).sum(0)
    overlap = []
    for k in range(1, num_draft + 1):
        total = 0.0
        for seq in itertools.product(range(vocab), repeat=k):
            pq = [float(torch.prod(torch.stack([law[seq[:j]][seq[j]] for j in range(k)]))) for law in (p, q)]
            total += min(pq)
        overlap.append(total)
    expected = torch.tensor(overlap, dtype=torch.float64).cumsum(0)
    torch.testing.assert_close(bound, expected, atol=EXACT_ATOL, rtol=0)
    hsd = (weight[:, None] * expected_accepted_per_length(tokens, q_rows, p_rows, "hsd")).sum(0)
    tokenwise = (weight[:, None] * expected_accepted_per_length(tokens, q_rows, p_rows, "tokenwise")).sum(0)
    assert bool((bound >= hsd - EXACT_ATOL).all()) and bool((hsd >= tokenwise - EXACT_ATOL).all())
    assert float(bound[-1] - hsd[-1]) > 1e-3  # the bound is not attained in a generic world


def test_coupling_bound_rejects_a_draft_q_never_sampled():
    tokens = torch.tensor([[0, 1]])
    q = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])
    q[0, 1] = torch.tensor([1.0, 0.0])  # token 1 drawn from a law that gives it 0
    with pytest.raises(ValueError, match="probability 0"):
        bench_report.coupling_bound_per_length(tokens, q, torch.full((1, 3, 2), 0.5))


def _verify_rows():
    rows = []
    for drafter, prompt_set, temperature in itertools.product(("exit:16 trained", "eagle3"), ("humaneval", "mtbench",
                                                                                              "mtbench/math"), (0.6, 1.0)):
        for k in range(2, 9):
            rows.append({"drafter": drafter, "prompt_set": prompt_set, "temperature": temperature, "K": k,
                         "drafts": 12, "block_eff_tokenwise": 1 + 0.1 * k, "block_eff_hsd": 1 + 0.11 * k,
                         "block_eff_hsd-paper": 1 + 0.12 * k, "block_eff_bound": 1 + 0.13 * k,
                         "hsd_gain": 0.05, "hsd_gain_se": 0.02})
    return rows


def test_summarize_and_verify_tables():
    values = {"tokenwise": torch.tensor([[0.5, 0.5], [1.0, 1.5]], dtype=torch.float64),
              "hsd": torch.tensor([[0.5, 0.7], [1.0, 1.9]], dtype=torch.float64)}
    summary = bench_report.summarize_draft_values(values)
    assert summary["block_eff_tokenwise"] == pytest.approx([1.75, 2.0])
    assert summary["hsd_gain"] == pytest.approx([0.0, 0.3 / 2.0])
    assert summary["hsd_gain_se"][1] == pytest.approx(0.1 / 2.0)  # std of (0.2, 0.4) / sqrt(2) / 2
    rows = _verify_rows()
    full = bench_report.format_verify_table(rows, "header")
    assert full.count("\n| exit:16 trained |") == 3 * 2 * 7
    assert "| eagle3 | mtbench/math | 1.0 | 8 | 12 | 1.800 | 1.880 | +5.0% ± 2.0% | 1.960 | 2.040 |" in full
    pivot = bench_report.format_category_pivot(rows, k=4)
    assert "| mtbench/math | 1.40 / 1.44 / 1.52 (12) |" in pivot and pivot.count("\n") == 2 + 3
    short = bench_report.format_verify_summary(rows)
    assert "| eagle3 | humaneval | 0.6 | 12 | 1.200 / 1.220 / 1.260 | 1.400 / 1.440 / 1.520 | 1.800 / 1.880 / 2.040 " \
           "| +5.0% ± 2.0% |" in short


def _e2e_rows():
    rows = []
    for temperature, batch in ((0.0, 1), (0.0, 4), (1.0, 1), (1.0, 4)):
        for config, method, levels in (("target", "hsd", [{"name": "target", "mean_accepted": float("nan")}]),
                                       ("hf-assisted", "hsd", None),
                                       ("exit:16,target", "hsd", [{"name": "exit:16", "mean_accepted": 0.0},
                                                                  {"name": "target", "mean_accepted": 1.5}])):
            if config == "hf-assisted" and batch != 1:
                continue
            outputs = [[1, 2, 3], [4, 5]] if not (batch == 4 and config == "exit:16,target") else [[1, 2, 3], [4, 6]]
            rows.append({"temperature": temperature, "batch_size": batch, "config": config, "method": method,
                         "buffers": "3" if config != "target" else "", "tokens": 5, "seconds": 1.0,
                         "tokens_per_second": {"target": 10.0, "hf-assisted": 20.0}.get(config, 15.0) * batch,
                         "levels": levels, "outputs": outputs})
    return rows


def test_e2e_ratios_batch_check_and_table():
    rows = _e2e_rows()
    bench_report.add_ratios(rows)
    bench_report.check_batch_outputs(rows)
    spec_b4 = next(r for r in rows if r["temperature"] == 0 and r["batch_size"] == 4 and r["config"] != "target")
    assert spec_b4["vs_autoregressive"] == pytest.approx(1.5) and spec_b4["vs_hf_assisted"] == pytest.approx(3.0)
    assert spec_b4["matches_b1"] is False and spec_b4["matches_ar"] is False and spec_b4["mismatched_prompts"] == [1]
    ar_b4 = next(r for r in rows if r["temperature"] == 0 and r["batch_size"] == 4 and r["config"] == "target")
    assert ar_b4["matches_b1"] is True
    assert all(r["matches_ar"] is None for r in rows if r["temperature"] == 1.0)
    meta = {"model": "m", "assistant": "a", "num_prompts": 2, "prompt_set": "mtbench", "max_new_tokens": 8,
            "threads": 1, "exit_heads": "auto"}
    table = bench_report.format_e2e_table(rows, meta)
    assert "| 0.0 | 4 | exit:16,target | hsd | 3 | 60.00 | 1.50x | 3.00x | target: 1.50 | NO / NO |" in table
    # A row of several repeats shows its median and the lowest and highest repeat.
    rows[0]["tokens_per_second_per_repeat"] = [9.0, 10.0, 12.5]
    assert "| 0.0 | 1 | target | hsd | - | 10.00 (9.00-12.50) | 1.00x |" in bench_report.format_e2e_table(rows, meta)


def test_plots_write_pngs(tmp_path):
    # No skip: CI installs the bench extra (scripts/setup_env.sh); without it this fails naming it.
    rows = _e2e_rows()
    bench_report.add_ratios(rows)
    paths = bench_report.plot_e2e(rows, tmp_path / "e2e")
    assert [p.name for p in paths] == ["e2e_speedup.png", "e2e_accepted.png"]
    verify_png = bench_report.plot_verify(_verify_rows(), tmp_path / "verify.png")
    for path in [*paths, verify_png]:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


def test_plots_without_matplotlib_name_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(ImportError, match=r"\[bench\]"):
        bench_report.plot_e2e(_e2e_rows(), "unused")


def test_e2e_rows_differing_in_draft_length_are_told_apart():
    rows = [r for r in _e2e_rows() if r["config"] != "hf-assisted"]
    adaptive = [dict(r, draft_length="adaptive:0.4:16", outputs=[[9], [9]]) for r in rows if r["config"] != "target"]
    for row in adaptive:
        row["levels"] = [dict(row["levels"][0], mean_draft_length=5.25), row["levels"][1]]
    rows += adaptive
    bench_report.add_ratios(rows)
    bench_report.check_batch_outputs(rows)
    b4 = next(r for r in adaptive if r["temperature"] == 0 and r["batch_size"] == 4)
    assert b4["matches_b1"] is True and b4["matches_ar"] is False  # compared with its own B = 1 row
    meta = {"model": "m", "assistant": "a", "num_prompts": 2, "prompt_set": "mtbench", "max_new_tokens": 8,
            "threads": 1, "exit_heads": "auto"}
    table = bench_report.format_e2e_table(rows, meta)
    assert "| exit:16,target | hsd | 3 adaptive:0.4:16 |" in table and "drafted/round 5.25; target: 1.50" in table
    assert bench_report.config_label(b4) == "exit:16,target hsd [3 adaptive:0.4:16]"
