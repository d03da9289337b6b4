"""The documents name real things: every repository path, ``file::test`` reference and dotted
``sglang_hsd`` / ``eagle_heads`` name written in backticks in README.md, docs/ and
benchmarks/README.md exists in the tree, and so does every relative Markdown link's target.
Moving a module or a result file without updating the documents fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = sorted([ROOT / "README.md", ROOT / "benchmarks" / "README.md", ROOT / "eagle_heads" / "README.md",
                    ROOT / "patches" / "README.md", *(ROOT / "docs").glob("*.md")])
TOP_FOLDERS = ("sglang_hsd/", "eagle_heads/", "tests/", "benchmarks/", "docs/", "scripts/", "patches/")
PACKAGES = ("sglang_hsd", "eagle_heads")
# Spans with these are patterns, not names: benchmarks/results/NAME.json, patches/..., tests/*.py.
PLACEHOLDER_MARKS = ("*", "{", "<", "...", "NAME", "X.py")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
DOTTED = re.compile(r"^(?:sglang_hsd|eagle_heads)(?:\.[A-Za-z_][A-Za-z0-9_]*)+$")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _references(text: str) -> tuple[list[str], list[str]]:
    """(repository paths, dotted names) written as code spans in ``text``."""
    paths, dotted = [], []
    for span in CODE_SPAN.findall(text):
        for word in span.split():
            word = word.strip("(),;:'\"")
            if any(mark in word for mark in PLACEHOLDER_MARKS):
                continue
            if word.startswith(TOP_FOLDERS):
                paths.append(word)
            elif DOTTED.match(word):
                dotted.append(word)
    return paths, dotted


def _missing_links(document: Path, text: str) -> list[str]:
    """Relative Markdown link targets in ``text`` (anchors dropped) that do not exist beside
    ``document``."""
    missing = []
    for target in LINK.findall(text):
        if target.startswith(("http://", "https://", "mailto:", "#")):
            continue
        path = target.split("#", 1)[0]
        if not (document.parent / path).exists():
            missing.append(f"{target}: linked from {document.name}, no such file or folder")
    return missing


def _defines(source: str, name: str) -> bool:
    return re.search(rf"^\s*(?:def|class)\s+{name}\b|^\s*{name}\s*[:=]|\b{name}\b", source, re.M) is not None


def _missing_path(ref: str) -> str | None:
    path, _, test = ref.partition("::")
    target = ROOT / path.rstrip("/")
    if not target.exists():
        return f"{ref}: no such file or folder"
    if test and not re.search(rf"^\s*(?:async\s+)?def\s+{re.escape(test.split('[')[0])}\b",
                              target.read_text(), re.M):
        return f"{ref}: no test named {test} in {path}"
    return None


def _missing_dotted(name: str) -> str | None:
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:end])
        module = base.with_suffix(".py") if not base.is_dir() else base / "__init__.py"
        if module.exists():
            rest = parts[end:]
            if not rest:
                return None
            if len(rest) == 1 and _defines(module.read_text(), rest[0]):
                return None
            return f"{name}: {'.'.join(rest)} not found in {module.relative_to(ROOT)}"
    return f"{name}: no such module"


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_documents_name_existing_things(document):
    paths, dotted = _references(document.read_text())
    missing = [m for m in map(_missing_path, paths) if m] + [m for m in map(_missing_dotted, dotted) if m]
    missing += _missing_links(document, document.read_text())
    assert missing == []


def test_checker_catches_a_stale_reference():
    """The check above could never fail if the reference parser saw nothing."""
    paths, dotted = _references("see `sglang_hsd/verify/nowhere.py` and `sglang_hsd.verify.nowhere`")
    assert _missing_path(paths[0]) and _missing_dotted(dotted[0])
    assert _missing_path("tests/test_sampling.py::test_no_such_test")
    assert _missing_dotted("sglang_hsd.verify.verify_chain") is None
    links = "[a](docs/nowhere.md) [b](docs/README.md#design-documents) [c](https://example.org) [d](#top)"
    assert _missing_links(ROOT / "README.md", links) == ["docs/nowhere.md: linked from README.md, no such file or folder"]
