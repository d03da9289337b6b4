"""``benchmarks/common.py``: every result file records its run (commit, command, machine load)."""

import json
import re

from benchmarks import bench_report, common


def test_command_line_names_the_script_its_arguments_and_the_recorded_environment(monkeypatch):
    for name in common.RECORDED_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    command = common.command_line(str(common.BENCHMARKS_DIR / "bench_e2e.py"), ["--configs", "exit:16,target", ""])
    assert command == "OMP_NUM_THREADS=1 python benchmarks/bench_e2e.py --configs exit:16,target ''"


def test_git_commit_is_a_hash_of_this_checkout():
    assert re.fullmatch(r"[0-9a-f]{12}( \+ uncommitted changes)?", common.git_commit())


def test_write_results_adds_the_run_to_json_and_markdown(tmp_path):
    run = common.start_run(str(common.BENCHMARKS_DIR / "bench_tree.py"), ["--name", "x"])
    json_path, md_path = common.write_results(tmp_path / "sub" / "x", {"rows": [1]}, "| a |\n", run)
    data = json.loads(json_path.read_text())
    assert data["rows"] == [1]
    recorded = data["run"]
    assert recorded["command"].endswith("python benchmarks/bench_tree.py --name x")
    assert recorded["load_average_start"] and recorded["load_average_end"] and recorded["finished"]
    assert recorded["cpu_count"] and recorded["torch_version"] and recorded["commit"]
    assert "torch CPU capability" in recorded["cpu"]
    text = md_path.read_text()
    assert text.startswith("| a |\n\n## Run\n")
    for needle in (recorded["commit"], recorded["command"], recorded["load_average_end"], recorded["torch_version"],
                   recorded["cpu"]):
        assert needle in text


def test_cpu_description_names_the_model_and_the_kernel_deciding_flags():
    cpuinfo = "processor\t: 0\nmodel name\t: AMD EPYC 9B14\nflags\t\t: fpu avx2 fma avx512f avx512_bf16\n"
    text = common.cpu_description(cpuinfo)
    assert text.startswith("AMD EPYC 9B14; torch CPU capability ")
    assert text.endswith("; avx512_bf16")
    assert common.cpu_description("").startswith("unknown model;")
    assert "none of avx512_bf16" in common.cpu_description("flags : avx2 fma\n")


def test_plots_carry_the_run_in_their_png_text(tmp_path):
    from PIL import Image

    run = common.start_run(str(common.BENCHMARKS_DIR / "bench_verify.py"), ["--name", "v"]).finish().as_dict()
    rows = [{"drafter": "eagle3", "prompt_set": "mtbench", "temperature": 1.0, "K": k, "block_eff_tokenwise": 1.0,
             "block_eff_hsd": 1.1, "block_eff_hsd-paper": 1.2, "block_eff_bound": 1.3} for k in (2, 3)]
    path = bench_report.plot_verify(rows, tmp_path / "v.png", run=run)
    text = Image.open(path).text
    assert json.loads(text["Comment"]) == run and text["Source"] == run["command"]


def test_standard_arguments_only_add_what_is_asked():
    parser = common.benchmark_parser("Doc line.\n\nMore.", full_doc=False)
    common.add_standard_arguments(parser, name="tree", seed=0, exit_heads=True)
    args = parser.parse_args([])
    assert vars(args) == {"name": "tree", "exit_heads": "auto", "seed": 0}
    assert parser.description == "Doc line."


def test_fresh_prompt_offset_starts_after_the_last_trained_prompt_of_the_set():
    ids = ["a", "b", "c", "d", "e"]
    trained = {"sharegpt/b", "sharegpt/d", "mtbench/e"}  # another set's name does not count
    assert common.fresh_prompt_offset("sharegpt", trained, ids) == 4
    assert common.fresh_prompt_offset("sharegpt", {"sharegpt/zz"}, ids) == 0  # not in the set's file
    assert common.fresh_prompt_offset("alpacaeval", trained) == 0  # nothing to skip: the set is not loaded
