"""Integrity of what a run writes: durable writes and a sha256 manifest that a reader checks before trusting files.

A checkpoint directory carries ``manifest.json`` listing the size and sha256 of every file in it. Files are fsynced
before the manifest is written, and the manifest before the directory is renamed into place, so after a crash a
checkpoint is either absent or whole; a disk that later truncates or flips bits in a file is caught on load instead
of giving a silently wrong model.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1
_CHUNK = 1 << 20


class IntegrityError(ValueError):
    """A file does not match the manifest (or the manifest itself is missing or damaged); names the file."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def fsync_file(path: Path) -> None:
    """Force a written file's bytes to the disk (a rename alone can reach the disk before the data does)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Persist a directory's entries (new names, renames). Not every platform can open a directory; skip there."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_manifest(directory: Path, extra: dict | None = None) -> dict:
    """fsync every file of ``directory`` and record its size and sha256 in ``manifest.json`` (also fsynced)."""
    files = {}
    for path in sorted(p for p in directory.iterdir() if p.is_file() and p.name != MANIFEST):
        fsync_file(path)
        files[path.name] = {"size": path.stat().st_size, "sha256": sha256_file(path)}
    manifest = {"version": MANIFEST_VERSION, "files": files} | (extra or {})
    target = directory / MANIFEST
    target.write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    fsync_file(target)
    fsync_dir(directory)
    return manifest


def read_manifest(directory: Path) -> dict | None:
    """The parsed manifest, or None when the directory has none (written before manifests existed)."""
    path = directory / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        files = manifest["files"]
        if not isinstance(files, dict) or not all(
            isinstance(v, dict) and "sha256" in v and "size" in v for v in files.values()
        ):
            raise ValueError("bad file table")
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise IntegrityError(f"{path} is damaged ({type(e).__name__})") from None
    return manifest


def verify_files(directory: Path, required: tuple[str, ...] = ()) -> dict | None:
    """Check every file the manifest lists (size, then sha256) and that each ``required`` file exists.

    Returns the manifest (None for a directory without one, whose files are then only checked for presence)."""
    manifest = read_manifest(directory)
    listed = manifest["files"] if manifest is not None else {}
    for name in required:
        if not (directory / name).is_file():
            raise IntegrityError(f"{directory / name} is missing")
        if manifest is not None and name not in listed:
            raise IntegrityError(f"{directory / name} is not in the manifest")
    for name, entry in listed.items():
        path = directory / name
        if not path.is_file():
            raise IntegrityError(f"{path} is missing")
        if path.stat().st_size != entry["size"]:
            raise IntegrityError(
                f"{path} has {path.stat().st_size:,} bytes, the manifest says {entry['size']:,} (truncated or overwritten)"
            )
        if sha256_file(path) != entry["sha256"]:
            raise IntegrityError(f"{path} does not match its sha256 in the manifest (the bytes changed on disk)")
    return manifest
