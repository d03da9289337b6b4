"""``patches/*.patch`` against the pinned sglang 0.5.23 wheel.

The wheel is fetched once with ``pip download --no-deps sglang==0.5.23`` into the asset cache
(``sglang_hsd.assets``: ``$SGLANG_HSD_CACHE`` or ``~/.cache/sglang-hsd``, ``wheels/``); later runs
take a few seconds. Only the files the patches name are extracted. Checks, per patch: it carries
the header ``patches/README.md`` promises, ``patch --dry-run`` and ``git apply --check`` accept it
on pristine sources, and after really applying it every touched file still compiles. Then the
CPU chain sampler that patch 0003 adds is run from the patched file against our token-wise
reference on fresh random chains (it must agree token for token). Skips with the reason when the
wheel cannot be had (no network, ``SGLANG_HSD_OFFLINE=1``) or ``patch`` is missing.
"""

from __future__ import annotations

import importlib.util
import py_compile
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest
import torch

PATCH_DIR = Path(__file__).resolve().parents[2] / "patches"
PATCHES = sorted(PATCH_DIR.glob("*.patch"))
SGLANG_VERSION = "0.5.23"
# Sections every patch header has (patches/README.md explains the format).
HEADER_SECTIONS = ("Why:", "Fix:", "What sglang-hsd does instead at run time:",
                   "Who needs this patch:")
REJECT_SAMPLING = "sglang/kernels/ops/speculative/reject_sampling.py"


def _touched_files(patch: Path) -> list[str]:
    """Paths (relative to site-packages) named by the ``+++ b/...`` lines of ``patch``."""
    return re.findall(r"^\+\+\+ b/(\S+)", patch.read_text(), flags=re.MULTILINE)


@pytest.fixture(scope="module")
def sglang_wheel() -> Path:
    from sglang_hsd.assets.archives import (
        AssetUnavailableError, ensure_archive, offline_from_env, pip_download, resolve_cache_dir)
    from sglang_hsd.assets.registry import ArchiveSpec

    spec = ArchiveSpec(package="sglang", version=SGLANG_VERSION, members=())
    try:
        return ensure_archive(
            spec, resolve_cache_dir() / "wheels", downloader=pip_download,
            offline=offline_from_env(),
            fill_hint=f"pip download --no-deps --only-binary :all: sglang=={SGLANG_VERSION}",
        )
    except AssetUnavailableError as err:
        pytest.skip(f"sglang {SGLANG_VERSION} wheel unavailable, patches not checked: {err}")


@pytest.fixture()
def pristine_sources(sglang_wheel, tmp_path) -> Path:
    """The wheel's copies of every file any patch touches, under ``tmp_path / "site"``."""
    root = tmp_path / "site"
    members = sorted({f for p in PATCHES for f in _touched_files(p)})
    with zipfile.ZipFile(sglang_wheel) as wheel:
        wheel.extractall(root, members=members)
    return root


def test_patch_files_exist_and_have_headers():
    assert PATCHES, f"no patches in {PATCH_DIR}"
    readme = (PATCH_DIR / "README.md").read_text()
    for patch in PATCHES:
        header = patch.read_text().split("\n--- a/", 1)[0]
        missing = [s for s in HEADER_SECTIONS if s not in header]
        assert not missing, f"{patch.name}: header lacks {missing}"
        assert _touched_files(patch), f"{patch.name}: no '+++ b/' file headers"
        assert patch.name in readme, f"patches/README.md does not describe {patch.name}"


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.name)
def test_patch_applies_cleanly_and_compiles(pristine_sources, patch):
    if shutil.which("patch") is None:
        pytest.skip("the `patch` program is not installed")
    dry = subprocess.run(["patch", "--dry-run", "-p1", "-d", str(pristine_sources), "-i",
                          str(patch)], capture_output=True, text=True)
    assert dry.returncode == 0 and "FAILED" not in dry.stdout and "fuzz" not in dry.stdout, (
        f"{patch.name} does not apply cleanly to sglang {SGLANG_VERSION}:\n{dry.stdout}"
        f"{dry.stderr}")
    if shutil.which("git"):
        check = subprocess.run(["git", "apply", "--check", "-p1", str(patch)],
                               cwd=pristine_sources, capture_output=True, text=True)
        assert check.returncode == 0, f"git apply --check {patch.name}:\n{check.stderr}"
    applied = subprocess.run(["patch", "-p1", "-d", str(pristine_sources), "-i", str(patch)],
                             capture_output=True, text=True)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    for rel in _touched_files(patch):
        py_compile.compile(str(pristine_sources / rel), doraise=True)


def _load_patched_reject_sampling(root: Path):
    pytest.importorskip("triton")  # the module keeps its Triton kernel for GPUs
    patch = next(p for p in PATCHES if REJECT_SAMPLING in _touched_files(p))
    subprocess.run(["patch", "-p1", "-d", str(root), "-i", str(patch)], check=True,
                   capture_output=True)
    spec = importlib.util.spec_from_file_location("patched_reject_sampling",
                                                  root / REJECT_SAMPLING)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_patched_cpu_chain_sampler_matches_tokenwise_reference(pristine_sources):
    """Patch 0003's torch path must be token-wise rejection sampling, coin for coin."""
    if shutil.which("patch") is None:
        pytest.skip("the `patch` program is not installed")
    from sglang_hsd.verify.chain import verify_chain
    from sglang_hsd.verify.common import ChainUniforms

    sampler = _load_patched_reject_sampling(pristine_sources)
    gen = torch.Generator().manual_seed(0)
    bs, steps, vocab = 64, 3, 7
    width = steps + 1
    q = torch.softmax(torch.randn(bs, steps, vocab, generator=gen) * 2, -1)
    q[:4, :, :3] = 0.0  # drafts with zeros in q: p - q residuals keep those ids
    q = q / q.sum(-1, keepdim=True)
    drafts = torch.multinomial(q.reshape(-1, vocab), 1, generator=gen).reshape(bs, steps)
    p = torch.softmax(torch.randn(bs, width, vocab, generator=gen) * 2, -1)
    p[4:8] = torch.cat([q[4:8], p[4:8, -1:]], 1)  # p == q: every draft accepted, bonus from p
    candidates = torch.cat([torch.randint(vocab, (bs, 1), generator=gen), drafts], 1)
    coins, final = torch.rand(bs, width, generator=gen), torch.rand(bs, generator=gen)
    retrive_index = torch.arange(bs * width).reshape(bs, width)
    predicts = torch.full((bs * width,), -7, dtype=torch.int32)
    accept_index = torch.full((bs, width), -1, dtype=torch.int32)
    accept_num = torch.zeros(bs, dtype=torch.int32)

    sampler.chain_speculative_sampling_triton(
        predicts, accept_index, accept_num, candidates, retrive_index, None, None, coins, final,
        p, q, 1.0, 1.0, True)

    ref = verify_chain(drafts, q, p, method="tokenwise",
                       uniforms=ChainUniforms(accept=coins[:, :steps], sample=final))
    assert torch.equal(accept_num.long(), ref.num_accepted)
    assert (accept_num[4:8] == steps).all()
    assert 0 < int((ref.num_accepted < steps).sum()) < bs  # both outcomes exercised
    emitted = torch.arange(width) <= ref.num_accepted.unsqueeze(1)
    assert torch.equal(accept_index.long(), torch.where(emitted, retrive_index, -1))
    assert torch.equal(predicts.long().reshape(bs, width)[emitted], ref.tokens[emitted])
    with pytest.raises(NotImplementedError, match="block-verification"):
        sampler.chain_speculative_sampling_triton(
            predicts, accept_index, accept_num, candidates, retrive_index, None, None, coins,
            final, p, q, 1.0, 1.0, True, block_verification=True)
