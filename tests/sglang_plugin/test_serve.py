"""``sglang-hsd serve`` without starting a server: the command it prints, and what it refuses.

* ``--print-command`` for the tiny random pair has exactly the flags the CPU server tests launch
  (``draft_model_server_command`` with ``--dtype float32`` and the packed kernel), given the
  tests' own extra flags through ``--``; only ``--mem-fraction-static``'s value differs (serve sizes
  it from free memory); one flag per name, the same environment;
* flags after ``--`` replace serve's in place; on CUDA none of the CPU flags is filled in;
* refusals, each before anything loads and naming the option: an unknown model, a target without
  a default draft, a draft with another vocabulary, SGLang flags serve owns, repeated flags, a
  dtype the packed kernel cannot run, the packed kernel on CUDA, a host without room for the
  pair, a ``--mem-fraction-static`` that leaves the KV cache nothing.
"""

from __future__ import annotations

import json
import shlex
import sys

import pytest

from sglang_hsd import cli
from sglang_hsd.sglang_plugin.cpu.cpu_server import (
    cpu_linear_flags, draft_model_server_command, server_env_vars)
from sglang_hsd.sglang_plugin.cpu.memory import GIB
from sglang_hsd.sglang_plugin.launch_flags import duplicated, flag_values, parse_flags

pytestmark = pytest.mark.sglang

PORT = 30123
# What the CPU server tests add beyond the machine's flags (a fixed seed, a request cap, K = 4).
TEST_HARNESS = ["--max-running-requests", "8", "--random-seed", "0", "--speculative-num-steps", "4"]
ROOMY = 64 * GIB  # free memory of a host where the tiny pair fits easily


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from sglang_hsd.sglang_plugin.cpu.tiny_models import build_tiny_draft_pair

    return build_tiny_draft_pair(str(tmp_path_factory.mktemp("serve")))


@pytest.fixture
def free_memory(monkeypatch):
    """Set the free host memory serve reads (bytes)."""
    from sglang_hsd.sglang_plugin.cpu import memory

    def set_free(size: int) -> None:
        monkeypatch.setattr(memory, "available_memory", lambda: size)

    set_free(ROOMY)
    return set_free


def _printed(capsys, *args: str) -> tuple[dict[str, str], list[str]]:
    """(environment assignments, command words) of ``serve --print-command args``."""
    assert cli.main(["serve", "--print-command", *args]) == 0
    words = shlex.split(capsys.readouterr().out.replace("\\\n", " "))
    start = words.index(sys.executable)  # the assignments before the interpreter are the environment
    return dict(word.split("=", 1) for word in words[:start]), words[start:]


def _refusal(capsys, *args: str) -> str:
    assert cli.main(["serve", "--print-command", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing printed to run
    return captured.err


def test_print_command_has_the_flags_of_the_cpu_test_servers(pair, capsys, free_memory):
    target, draft = pair
    env, command = _printed(capsys, "--target", target, "--draft", draft, "--device", "cpu", "--",
                            "--port", str(PORT), *TEST_HARNESS)
    expected = draft_model_server_command(target, PORT, draft,
                                          extra=["--dtype", "float32", *cpu_linear_flags("onednn-packed")])
    assert command[:3] == expected[:3]  # this interpreter, -m sglang.launch_server
    served, tested = parse_flags(command[3:], "printed"), parse_flags(expected[3:], "tests")
    assert duplicated(served) == []
    served_values, tested_values = flag_values(served), flag_values(tested)
    fraction = float(served_values.pop("--mem-fraction-static")[0])
    tested_values.pop("--mem-fraction-static")
    assert served_values == tested_values
    assert 0.9 < fraction < 1.0  # 1 GiB margin of 64 GiB free
    assert env == server_env_vars() and env["SGLANG_USE_CPU_ENGINE"] == "1"


def test_flags_after_the_separator_replace_serves_in_place(pair, capsys, free_memory):
    target, draft = pair
    _, command = _printed(capsys, "--target", target, "--draft", draft, "--device", "cpu", "--",
                          "--max-total-tokens", "4096", "--mem-fraction-static", "0.5", "--speculative-num-steps=3")
    flags = parse_flags(command[3:], "printed")
    assert duplicated(flags) == []
    values = flag_values(flags)
    assert values["--max-total-tokens"] == ("4096",) and values["--mem-fraction-static"] == ("0.5",)
    assert values["--speculative-num-steps"] == ("3",)
    names = [flag.name for flag in flags]
    assert names.index("--max-total-tokens") < names.index("--dtype")  # serve's place, the user's value


def test_cuda_gets_none_of_the_cpu_flags(pair, capsys, monkeypatch):
    from sglang_hsd.sglang_plugin.cpu import memory

    monkeypatch.setattr(memory, "available_memory", lambda: pytest.fail("memory is sized on CPU only"))
    target, draft = pair
    env, command = _printed(capsys, "--target", target, "--draft", draft, "--device", "cuda")
    values = flag_values(parse_flags(command[3:], "printed"))
    assert set(values) == {"--model-path", "--speculative-algorithm", "--speculative-draft-model-path",
                           "--hsd-draft-kind", "--host", "--port"}
    assert values["--speculative-algorithm"] == ("HSD",) and values["--hsd-draft-kind"] == ("model",)
    assert "SGLANG_USE_CPU_ENGINE" not in env


def test_unknown_model_names_the_registered_ones(capsys):
    err = _refusal(capsys, "--target", "no-such-model")
    assert "--target 'no-such-model' is neither a registered model nor a folder" in err
    assert "qwen2.5-coder-1.5b" in err and "smollm2-135m" in err
    assert "--draft 'nope'" in _refusal(capsys, "--draft", "nope")
    assert "--target smollm2-135m has no default draft" in _refusal(capsys, "--target", "smollm2-135m")


def test_draft_with_another_vocabulary_is_refused(pair, tmp_path, capsys):
    from sglang_hsd.sglang_plugin.cpu.tiny_models import build_tiny_llama

    target, _ = pair
    other = tmp_path / "other"
    build_tiny_llama(str(other), vocab_size=300, num_layers=1)
    err = _refusal(capsys, "--target", target, "--draft", str(other), "--device", "cpu")
    assert "vocab_size" in err and "must share the target's vocabulary" in err
    assert f"--draft {other}" in err


@pytest.mark.parametrize("passed,message", [
    (["--model-path", "x"], "--model-path after -- is set by serve: give serve's --target"),
    (["--speculative-draft-model-path", "x"], "give serve's --draft"),
    (["--speculative-algorithm", "EAGLE3"], "serve always launches HSD"),
    (["--device", "cpu"], "give serve's --device"),
    (["--port", "1", "--port=2"], "give --port more than once"),
    (["30001"], "'30001' is not a flag"),
    (["--dtype", "bfloat16"], "--dtype bfloat16 cannot run with --hsd-cpu-linear onednn-packed"),
    (["--max-total-tokens", "many"], "--max-total-tokens must be an integer"),
])
def test_bad_sglang_flags_are_refused(pair, capsys, free_memory, passed, message):
    target, draft = pair
    assert message in _refusal(capsys, "--target", target, "--draft", draft, "--device", "cpu", "--", *passed)


def test_bfloat16_runs_with_sglangs_own_kernels(pair, capsys, free_memory):
    target, draft = pair
    _, command = _printed(capsys, "--target", target, "--draft", draft, "--device", "cpu", "--",
                          "--dtype", "bfloat16", "--hsd-cpu-linear", "mkl")
    values = flag_values(parse_flags(command[3:], "printed"))
    assert values["--dtype"] == ("bfloat16",) and values["--hsd-cpu-linear"] == ("mkl",)


def test_packed_kernel_on_cuda_is_refused(pair, capsys):
    target, draft = pair
    err = _refusal(capsys, "--target", target, "--draft", draft, "--device", "cuda", "--",
                   "--hsd-cpu-linear", "onednn-packed")
    assert "--hsd-cpu-linear onednn-packed runs on CPU only" in err


def test_a_host_without_room_is_refused_before_anything_starts(pair, capsys, free_memory):
    target, draft = pair
    free_memory(2 * GIB)  # less than the server processes and margin alone
    err = _refusal(capsys, "--target", target, "--draft", draft, "--device", "cpu")
    assert "do not fit in this machine's free memory" in err
    assert "needed, 2.0 GiB available" in err and "--hsd-cpu-linear mkl" in err
    free_memory(ROOMY)
    err = _refusal(capsys, "--target", target, "--draft", draft, "--device", "cpu", "--",
                   "--mem-fraction-static", "0.000001")
    assert "--mem-fraction-static 0.000001 leaves the KV cache no memory" in err


def test_serve_is_listed_and_documents_the_separator(capsys):
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    out = capsys.readouterr().out
    assert "-- SGLANG_FLAG" in out and "--print-command" in out


def test_ready_message_curl_is_a_valid_chat_request():
    from sglang_hsd.sglang_plugin.serve import CHAT_EXAMPLE, chat_curl

    words = shlex.split(chat_curl("http://127.0.0.1:1").replace("\\\n", " "))
    assert words[1] == "http://127.0.0.1:1/v1/chat/completions"
    assert json.loads(words[words.index("-d") + 1]) == CHAT_EXAMPLE
