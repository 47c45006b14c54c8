"""Checking and unpacking ``.tar.gz`` corpus archives (LibriSpeech): the tar counterpart of the zip steps in
:mod:`.download`. A source's ``members`` name the folders to unpack (``"LibriSpeech/dev-clean/"``); each is
unpacked into a temp folder beside its destination and renamed into place whole, so an interrupted unpack never
leaves a folder that looks complete. Member names that would land outside the download folder are refused."""

from __future__ import annotations

import os
import shutil
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

from compressive_transformer.data.download_error import DownloadError

TAR_SUFFIXES = (".tar.gz", ".tgz", ".tar")


def is_tar(filename: str) -> bool:
    return filename.endswith(TAR_SUFFIXES)


def _error(message: str) -> Exception:
    return DownloadError(message)


def _safe(name: str, archive: Path) -> str:
    p = PurePosixPath(name)
    if p.is_absolute() or ".." in p.parts:
        raise _error(f"download: {archive.name} holds an unsafe path {name!r}; refusing to unpack it")
    return name


def check_tar(path: Path, members: dict[str, int | None]) -> None:
    """The archive reads to its end and holds every named folder (a prefix ending in ``/``) or file."""
    try:
        with tarfile.open(path) as tar:
            names = [_safe(m.name, path) for m in tar.getmembers()]
    except (tarfile.TarError, EOFError, OSError) as e:
        raise _error(
            f"download: {path.name} is not a valid tar archive ({str(e).splitlines()[0]}); try again"
        ) from None
    for member in members:
        if not any(n == member.rstrip("/") or n.startswith(member) for n in names):
            raise _error(f"download: {path.name} has no {member}; it is not the expected archive")


def extract_tar(archive: Path, directory: Path, members: dict[str, int | None]) -> None:
    """Unpack each named folder of ``archive`` under ``directory``; a folder already in place is kept."""
    for member in members:
        dest = directory / member.rstrip("/")
        if dest.exists():
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=dest.name + ".", suffix=".part"))
        try:
            with tarfile.open(archive) as tar:
                chosen = [m for m in tar.getmembers() if m.name.startswith(member) and (m.isfile() or m.isdir())]
                for m in chosen:
                    _safe(m.name, archive)
                tar.extractall(tmp, members=chosen, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
            os.replace(tmp / member.rstrip("/"), dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


__all__ = ["TAR_SUFFIXES", "check_tar", "extract_tar", "is_tar"]
