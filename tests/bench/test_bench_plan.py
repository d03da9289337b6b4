"""What ``sglang-hsd bench`` decides before anything starts: the plain server as the HSD launch
without its speculative flags, the port, ``--dry-run`` on the tiny random pair (both server
commands, every client command), serve's own refusals through bench (a draft of another
vocabulary), and servers given by URL (probed: unreachable, not HSD, speculating, the tokenizer)."""

from __future__ import annotations

import json
import shlex
import sys

import pytest

from sglang_hsd import cli
from sglang_hsd.bench.config import BenchConfig, BenchError
from sglang_hsd.bench.plan import plain_launch, prepare, serve_config
from sglang_hsd.bench.server_info import ServerProbeError
from sglang_hsd.sglang_plugin.cpu.memory import GIB
from sglang_hsd.sglang_plugin.launch_flags import flag_values, parse_flags
from tests.bench.fake_server import fake_sglang, hsd_info, plain_info


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from sglang_hsd.sglang_plugin.cpu.tiny_models import build_tiny_draft_pair

    return build_tiny_draft_pair(str(tmp_path_factory.mktemp("bench_pair")))


@pytest.fixture
def roomy(monkeypatch):
    """A host with room for the tiny pair, whatever this one has free now."""
    from sglang_hsd.sglang_plugin.cpu import memory

    monkeypatch.setattr(memory, "available_memory", lambda: 64 * GIB)


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"prompt number {i}"}) + "\n" for i in range(3)))
    return path


def _no_fetch(name):
    raise AssertionError(f"nothing should be fetched, asked for {name}")


def _commands(out: str) -> list[list[str]]:
    """The server command lines of a dry run's output (the interpreter's words onward)."""
    text = out.replace("\\\n", " ")
    return [shlex.split(line)[shlex.split(line).index(sys.executable):]
            for line in text.splitlines() if "sglang.launch_server" in line]


def test_dry_run_prints_both_servers_and_every_client_run(pair, roomy, prompts, tmp_path, capsys):
    target, draft = pair
    argv = ["bench", "--target", target, "--draft", draft, "--prompt-sets", str(prompts), "--concurrency", "1,2",
            "--num-prompts", "3", "--max-new-tokens", "16", "--out", str(tmp_path / "out"), "--dry-run",
            "--", "--max-running-requests", "4"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    plain, hsd = (flag_values(parse_flags(words[3:], "test")) for words in _commands(out))
    assert hsd["--speculative-algorithm"] == ("HSD",) and hsd["--speculative-draft-model-path"] == (draft,)
    assert not any(name.startswith(("--speculative-", "--hsd-draft")) for name in plain)
    for flags in (plain, hsd):  # the same target, port, kernels, memory share and user flags
        assert flags["--model-path"] == (target,) and flags["--hsd-cpu-linear"] == ("onednn-packed",)
        assert flags["--max-running-requests"] == ("4",) and flags["--port"] == hsd["--port"]
        assert flags["--mem-fraction-static"] == hsd["--mem-fraction-static"]
    clients = [line for line in out.splitlines() if "sglang.benchmark.serving" in line]
    assert len(clients) == 4  # 2 servers x 2 concurrencies
    assert all(f"--dataset-path {tmp_path / 'out' / 'prompts_mine.json'}" in c and "--num-prompts 3" in c
               and "--sharegpt-output-len 16" in c for c in clients)
    assert [c.split("--max-concurrency ")[1].split()[0] for c in clients] == ["1", "2", "1", "2"]
    assert not (tmp_path / "out").exists()  # nothing written, nothing started


def test_plain_launch_drops_speculation_and_keeps_the_kernels(pair, roomy):
    from sglang_hsd.sglang_plugin.serve_launch import build_launch, resolve_models

    serve = serve_config(BenchConfig(target=pair[0], draft=pair[1], device="cpu",
                                     sglang_args=("--hsd-cpu-linear-padding", "off", "--hsd-adaptive", "off")), 31234)
    hsd = build_launch(serve, resolve_models(serve, _no_fetch), "cpu")
    plain = plain_launch(hsd)
    names = [flag.name for flag in parse_flags(plain.command[3:], "test")]
    assert "--hsd-adaptive" not in names and "--hsd-draft-kind" not in names
    assert {"--hsd-cpu-linear", "--hsd-cpu-linear-padding", "--port"} <= set(names)
    assert plain.command[:3] == hsd.command[:3] and plain.env == hsd.env and plain.url == hsd.url
    assert flag_values(parse_flags(plain.command[3:], "test"))["--port"] == ("31234",)
    given = serve_config(BenchConfig(sglang_args=("--port=40000",)), 31234)
    assert given.sglang_args == ("--port=40000",)  # the user's port stays, no second one


def test_serve_refusals_come_through_bench(pair, tmp_path, capsys):
    from sglang_hsd.sglang_plugin.cpu.tiny_models import build_tiny_llama

    other = tmp_path / "other"
    build_tiny_llama(str(other), vocab_size=300, num_layers=1)
    assert cli.main(["bench", "--target", pair[0], "--draft", str(other), "--device", "cpu", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "vocab_size" in err and "must share the target's vocabulary" in err and f"--draft {other}" in err
    assert cli.main(["bench", "--target", "no-such-model", "--dry-run"]) == 2
    assert "--target 'no-such-model' is neither a registered model nor a folder" in capsys.readouterr().err
    assert cli.main(["bench", "--target", pair[0], "--draft", pair[1], "--dry-run", "--", "--model-path", "x"]) == 2
    assert "--model-path after -- is set by serve" in capsys.readouterr().err


def _unused_url() -> str:
    from sglang_hsd.sglang_plugin.cpu.cpu_server import free_port

    return f"http://127.0.0.1:{free_port()}"


def test_servers_given_by_url_are_probed(pair, prompts, tmp_path, capsys):
    target = pair[0]

    def config(plain: str, hsd: str, **more) -> BenchConfig:
        return BenchConfig(url_plain=plain, url_hsd=hsd, prompt_sets=(str(prompts),), num_prompts=1, **more)

    with fake_sglang(plain_info(target)) as plain, fake_sglang(hsd_info(target, [0])) as hsd, \
            fake_sglang(plain_info(target)) as other_plain, fake_sglang(hsd_info(target, [0])) as other_hsd:
        assert cli.main(["bench", "--url-plain", plain, "--url-hsd", hsd, "--prompt-sets", str(prompts),
                         "--num-prompts", "2", "--out", str(tmp_path), "--dry-run"]) == 0
        out = capsys.readouterr().out
        assert f"already running at {plain}" in out and f"already running at {hsd}" in out
        assert f"--tokenizer {target}" in out  # the HSD server's own tokenizer folder
        gone = _unused_url()
        assert cli.main(["bench", "--url-plain", gone, "--url-hsd", hsd, "--prompt-sets", str(prompts),
                         "--num-prompts", "2", "--dry-run"]) == 2
        assert f"--url-plain {gone}: no SGLang server answers {gone}/server_info" in capsys.readouterr().err
        with pytest.raises(ServerProbeError, match=f"--url-hsd {gone}: no SGLang server answers"):
            prepare(config(plain, gone), _no_fetch)
        with pytest.raises(BenchError, match=f"--url-hsd {other_plain}: that server runs speculative_algorithm "
                           "None, not HSD"):
            prepare(config(plain, other_plain), _no_fetch)
        with pytest.raises(BenchError, match=f"--url-plain {other_hsd}: that server speculates \\(HSD\\)"):
            prepare(config(other_hsd, hsd), _no_fetch)
    with fake_sglang(plain_info("/remote/model")) as plain, fake_sglang(hsd_info("/remote/model", [0])) as hsd:
        with pytest.raises(BenchError, match="--tokenizer: the HSD server's tokenizer /remote/model is not a folder"):
            prepare(config(plain, hsd), _no_fetch)
        with pytest.raises(BenchError, match="--tokenizer 'nowhere' is neither a registered model nor a folder"):
            prepare(config(plain, hsd, tokenizer="nowhere"), _no_fetch)
        plan = prepare(config(plain, hsd, tokenizer=target), _no_fetch)
        assert str(plan.tokenizer) == target and [s.launch for s in plan.servers] == [None, None]
    with pytest.raises(ServerProbeError, match="--url-plain 'localhost:1': expected an http:// or https:// URL"):
        prepare(config("localhost:1", "http://h:2"), _no_fetch)


def test_registered_prompt_sets_are_read_and_must_hold_num_prompts(pair, monkeypatch):
    import sglang_hsd.assets.prompts as asset_prompts
    import sglang_hsd.runtime.loading as loading

    fetched = []
    monkeypatch.setattr(asset_prompts, "fetch_prompt_file", lambda name, progress=False: fetched.append(name))
    monkeypatch.setattr(loading, "prompt_set_texts", lambda name, count: [f"{name} {i}" for i in range(min(count, 3))])
    with fake_sglang(plain_info(pair[0])) as plain, fake_sglang(hsd_info(pair[0], [0])) as hsd:
        plan = prepare(BenchConfig(url_plain=plain, url_hsd=hsd, prompt_sets=("mtbench", "humaneval"),
                                   concurrency=(1, 4), num_prompts=3), _no_fetch)
        assert fetched == ["mtbench", "humaneval"]
        assert [(p.name, p.texts[-1], p.path.name) for p in plan.prompts] == [
            ("mtbench", "mtbench 2", "prompts_mtbench.json"), ("humaneval", "humaneval 2", "prompts_humaneval.json")]
        assert [row.label for row in plan.rows] == ["mtbench c=1 T=0", "mtbench c=4 T=0", "humaneval c=1 T=0",
                                                    "humaneval c=4 T=0"]
        spec = plan.client_spec(plan.rows[1])
        assert (spec.max_concurrency, spec.num_prompts, spec.temperature) == (4, 3, 0.0)
        with pytest.raises(BenchError, match="--num-prompts 4: the prompt set mtbench holds 3"):
            prepare(BenchConfig(url_plain=plain, url_hsd=hsd, prompt_sets=("mtbench",), num_prompts=4), _no_fetch)
