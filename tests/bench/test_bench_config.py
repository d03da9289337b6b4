"""``sglang-hsd bench``'s options: parsing, the JSONL reader, and every refusal that needs nothing
started (each naming its option), through the command line as a user meets them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_hsd import cli
from sglang_hsd.bench.cli import command_words, config_from_args
from sglang_hsd.bench.config import (
    DEFAULT_CONCURRENCY, DEFAULT_MAX_NEW_TOKENS, DEFAULT_NUM_PROMPTS, DEFAULT_PROMPT_SETS, BenchConfig,
    BenchError, PromptSource, check_config, parse_float_list, parse_int_list)
from sglang_hsd.bench.prompts import PromptFileError, read_prompt_jsonl


def _config(*argv: str) -> BenchConfig:
    return config_from_args(cli.build_parser().parse_args(["bench", *argv]))


def _jsonl(path: Path, *prompts: str) -> Path:
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    return path


def _refusal(capsys, *argv: str) -> str:
    """The error of ``sglang-hsd bench argv``, which must exit 2 before anything starts."""
    assert cli.main(["bench", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sglang-hsd bench: error: ")
    return err


def test_defaults_and_parsed_options(tmp_path):
    config = _config()
    assert config.prompt_sets == DEFAULT_PROMPT_SETS == ("humaneval", "mtbench")
    assert config.concurrency == DEFAULT_CONCURRENCY == (1, 4) and config.temperatures == (0.0,)
    assert (config.num_prompts, config.max_new_tokens) == (DEFAULT_NUM_PROMPTS, DEFAULT_MAX_NEW_TOKENS)
    assert config.out == Path("sglang-hsd-bench") and config.target is None and not config.uses_urls
    config = _config("--prompt-sets", "sharegpt, x.jsonl", "--concurrency", "2,8", "--temperature", "0,0.7",
                     "--num-prompts", "3", "--max-new-tokens", "9", "--out", str(tmp_path), "--dry-run",
                     "--", "--speculative-num-steps", "6")
    assert config.prompt_sets == ("sharegpt", "x.jsonl") and config.concurrency == (2, 8)
    assert config.temperatures == (0.0, 0.7) and config.sglang_args == ("--speculative-num-steps", "6")
    assert config.dry_run and config.out == tmp_path


def test_command_words_rerun_the_same_config(tmp_path):
    config = _config("--target", "T", "--concurrency", "1,2", "--temperature", "0.5", "--out", str(tmp_path),
                     "--", "--port", "9")
    words = command_words(config)
    assert words[:2] == ["sglang-hsd", "bench"] and words[-3:] == ["--", "--port", "9"]
    assert _config(*words[2:]) == config


def test_comma_lists_name_their_option():
    assert parse_int_list("1, 4", "--concurrency") == (1, 4)
    assert parse_float_list("0,1e-1", "--temperature") == (0.0, 0.1)
    for text, message in (("1,x", "--concurrency expects positive integers, got 'x'"),
                          ("1,,2", "--concurrency expects a comma-separated list without empty items"),
                          ("", "--concurrency expects a comma-separated list"),
                          ("1,1", "--concurrency names an item more than once")):
        with pytest.raises(BenchError, match=message):
            parse_int_list(text, "--concurrency")
    with pytest.raises(BenchError, match="--temperature expects numbers, got 'hot'"):
        parse_float_list("hot", "--temperature")


@pytest.mark.parametrize("argv,message", [
    (["--concurrency", "0"], "--concurrency must be positive integers, got 0"),
    (["--concurrency", "1,-4"], "--concurrency must be positive integers, got -4"),
    (["--concurrency", "two"], "--concurrency expects positive integers, got 'two'"),
    (["--num-prompts", "0"], "--num-prompts must be positive integers, got 0"),
    (["--max-new-tokens", "-1"], "--max-new-tokens must be positive integers, got -1"),
    (["--temperature", "-0.5"], "--temperature must be numbers >= 0, got -0.5"),
    (["--temperature", "nan"], "--temperature must be numbers >= 0, got nan"),
    (["--startup-timeout", "0"], "--startup-timeout must be > 0 seconds"),
    (["--prompt-sets", "humaneval,alpaca"], "--prompt-sets: unknown prompt set 'alpaca'; expected one of "
     "humaneval, mtbench, sharegpt or the path of a JSONL file"),
    (["--prompt-sets", "missing/prompts.jsonl"], "--prompt-sets: no such prompt file missing/prompts.jsonl"),
    (["--url-plain", "http://127.0.0.1:1"], "--url-plain needs --url-hsd too"),
    (["--url-hsd", "http://127.0.0.1:1"], "--url-hsd needs --url-plain too"),
    (["--url-plain", "http://h:1", "--url-hsd", "http://h:1/"], "--url-plain and --url-hsd are the same server"),
    (["--url-plain", "http://h:1", "--url-hsd", "http://h:2", "--target", "T"],
     "--target cannot go with --url-plain / --url-hsd"),
    (["--url-plain", "http://h:1", "--url-hsd", "http://h:2", "--draft", "D"],
     "--draft cannot go with --url-plain / --url-hsd"),
    (["--url-plain", "http://h:1", "--url-hsd", "http://h:2", "--device", "cpu"],
     "--device cannot go with --url-plain / --url-hsd"),
    (["--url-plain", "http://h:1", "--url-hsd", "http://h:2", "--", "--port", "3"],
     "SGLang flags after -- configure the HSD server bench starts; with --url-plain / --url-hsd nothing"),
    (["--tokenizer", "T"], "--tokenizer is for servers given by --url-plain / --url-hsd"),
])
def test_refusals_name_the_option(capsys, argv, message):
    assert message in _refusal(capsys, *argv)


def test_refused_without_matplotlib(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    with pytest.raises(BenchError, match=r"bench.png needs matplotlib.*sglang-hsd\[bench\]"):
        check_config(BenchConfig())


def test_jsonl_prompt_files_are_read_and_checked(tmp_path, capsys):
    good = tmp_path / "mine.jsonl"
    good.write_text('{"prompt": "a b", "id": 1}\n\n{"prompt": "c"}\n')
    assert read_prompt_jsonl(good) == ["a b", "c"]
    config = BenchConfig(prompt_sets=("mtbench", str(good)), num_prompts=2)
    assert check_config(config) == (PromptSource("mtbench"), PromptSource("mine", good.resolve()))
    bad = tmp_path / "bad.jsonl"
    for text, message in (('{"prompt": "ok"}\nnot json\n', "line 2: not JSON"),
                          ('["a list"]\n', 'line 1: expected a JSON object with a "prompt" string, got list'),
                          ('{"text": "x"}\n', 'line 1: expected a non-blank "prompt" string, got no prompt key'),
                          ('{"prompt": 3}\n', "got prompt 3"),
                          ('{"prompt": "  "}\n', "got prompt '  '"),
                          ("\n\n", "the file holds no prompt"),
                          ("\udcff", "cannot read the prompt file")):
        bad.write_text(text, errors="surrogateescape")
        with pytest.raises(PromptFileError, match=message):
            read_prompt_jsonl(bad)
        err = _refusal(capsys, "--prompt-sets", str(bad), "--num-prompts", "1")
        assert message in err and "--prompt-sets" in err and str(bad) in err


def test_a_file_shorter_than_num_prompts_and_two_sets_of_one_name_are_refused(tmp_path, capsys):
    short = _jsonl(tmp_path / "short.jsonl", "a", "b")
    err = _refusal(capsys, "--prompt-sets", str(short), "--num-prompts", "3")
    assert f"--num-prompts 3: the prompt file {short} holds 2" in err
    (tmp_path / "sub").mkdir()
    twin = _jsonl(tmp_path / "sub" / "short.jsonl", "a", "b")
    err = _refusal(capsys, "--prompt-sets", f"{short},{twin}", "--num-prompts", "2")
    assert "--prompt-sets: two sets would be called short in the table" in err
