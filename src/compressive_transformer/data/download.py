"""Download helpers for the real corpora (for users elsewhere; nothing downloads at test time).

Every file is streamed to a temp file beside its destination, checked (size, checksum, archive integrity) and only
then moved into place with ``os.replace``; a file already in place that verifies is never fetched again. A failed
check deletes the temp file and raises a one-line :class:`DownloadError`. :func:`sources` gathers the known
locations and checksums from the corpus formats, each of which owns its own (tests patch a format's entry to point
at a local server).

The single-archive corpora (enwik8, WikiText) are pinned here by size and sha256. PG-19 is ~28,750 objects of a
bucket: its file list comes from the bucket's listing, every name in it must have PG-19's shape
(``metadata.csv``, ``<split>/<id>.txt``; anything else, such as ``../x`` or an absolute path, is refused), and the
files are checked against a pinned manifest (``manifest=``: name -> size and sha256) when one is given, else only
against the listing's md5 (a transport check). Each PG-19 download writes ``pg19/manifest.json`` with the sha256 of
what it fetched, which pins later downloads (``--manifest``) to exactly that copy.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import os
import re
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tqdm.auto import tqdm

from compressive_transformer.core.config import ConfigError
from compressive_transformer.core.fileio import write_text_atomic
from compressive_transformer.core.registry import FORMATS
from compressive_transformer.data.download_error import DownloadError
from compressive_transformer.data.tar_archives import check_tar, extract_tar, is_tar

logger = logging.getLogger(__name__)
CHUNK = 1 << 20
PG19_SPLITS = ("train", "validation", "test")
PG19_NAME = re.compile(r"^(metadata\.csv|(train|validation|test)/[0-9]{1,12}\.txt)$")
PG19_MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Source:
    """Where a corpus is published and what a correct copy looks like."""

    url: str  # base URL the files hang off (``base_url`` replaces it)
    filename: str = ""  # the archive under ``url``; "" for PG-19, fetched object by object
    size: int | None = None  # archive size in bytes
    sha256: str | None = None  # archive checksum (hex)
    members: dict[str, int | None] = field(default_factory=dict)  # zip member -> size (None: unchecked); tar: folders
    target: str = ""  # what ``download`` returns, relative to the download directory
    bucket: str = ""  # PG-19: the public GCS bucket


def sources() -> dict[str, Source]:
    """Download name -> source, gathered from the registered corpus formats: each format owns its own sources
    (``CorpusFormat.sources``), so registering one touches no table of this module."""
    return {name: source for fmt in FORMATS.values() for name, source in fmt.sources.items()}


def download(
    name: str,
    directory: str | Path,
    *,
    base_url: str | None = None,
    progress: bool = True,
    limit: int | None = None,
    manifest: str | Path | None = None,
) -> Path:
    """Fetch corpus ``name`` into ``directory`` and return the path to give as ``data.path``.

    ``limit`` (PG-19 only) keeps the first ``limit`` books of each split, in the bucket's listing order.
    ``manifest`` (PG-19 only): a pinned ``manifest.json`` (as a previous download wrote it) every file must match.
    """
    known = sources()
    if name not in known:
        raise ConfigError(f"download: unknown corpus {name!r}; use one of {', '.join(sorted(known))}")
    if limit is not None and limit < 1:
        raise ConfigError(f"download: limit must be >= 1 (or None for everything), got {limit}")
    source = known[name]
    directory = Path(directory).expanduser()
    directory.mkdir(parents=True, exist_ok=True)
    base = (base_url or source.url).rstrip("/")
    if source.bucket:
        pinned = _read_pinned(Path(manifest)) if manifest is not None else None
        return _download_pg19(source, directory, base, progress, limit, pinned)
    if limit is not None or manifest is not None:
        raise ConfigError(
            f"download: limit and manifest apply to pg19 only; {name} is a single archive with a pinned checksum"
        )
    archive = directory / source.filename
    tar = is_tar(source.filename)
    _fetch(
        f"{base}/{source.filename}",
        archive,
        size=source.size,
        digest=("sha256", source.sha256) if source.sha256 else None,
        progress=progress,
        check=lambda p: (check_tar if tar else _check_zip)(p, source.members),
    )
    (extract_tar if tar else _extract)(archive, directory, source.members)
    return directory / source.target


# ---------------------------------------------------------------------------------------------------------------


def _fetch(
    url: str,
    dest: Path,
    *,
    size: int | None,
    digest: tuple[str, str] | None,
    progress: bool,
    check: Callable[[Path], None] | None = None,
) -> Path:
    """Stream ``url`` to ``dest`` atomically after verifying it; keep an existing ``dest`` that verifies."""
    if dest.is_file():
        try:
            _verify(dest, dest.stat().st_size, size, digest, _hash_file(dest, digest))
            if check:
                check(dest)
            logger.info("%s already present and verified", dest)
            return dest
        except DownloadError as e:
            logger.warning("%s is present but does not verify (%s); downloading it again", dest, e)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=dest.name + ".", suffix=".part")
    tmp = Path(tmp_name)
    try:
        hasher = hashlib.new(digest[0]) if digest else None
        n = 0
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=60) as resp:
            total = size or int(resp.headers.get("Content-Length") or 0) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=dest.name, disable=not progress) as bar:
                while chunk := resp.read(CHUNK):
                    out.write(chunk)
                    n += len(chunk)
                    if hasher:
                        hasher.update(chunk)
                    bar.update(len(chunk))
        _verify(tmp, n, size, digest, hasher.hexdigest() if hasher else None, url=url)
        if check:
            check(tmp)
        os.replace(tmp, dest)
        return dest
    except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
        raise DownloadError(
            f"download: {url} failed ({getattr(e, 'reason', e)}); check the network or pass --base-url URL of a mirror"
        ) from None
    finally:
        tmp.unlink(missing_ok=True)


def _hash_file(path: Path, digest: tuple[str, str] | None) -> str | None:
    if not digest:
        return None
    h = hashlib.new(digest[0])
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _verify(
    path: Path, n: int, size: int | None, digest: tuple[str, str] | None, got: str | None, url: str = ""
) -> None:
    origin = url or str(path)
    if size is not None and n != size:
        raise DownloadError(
            f"download: {origin} gave {n:,} bytes, expected {size:,}; try again or use another mirror (--base-url)"
        )
    if digest and got != digest[1].lower():
        raise DownloadError(
            f"download: {origin} has {digest[0]} {got}, expected {digest[1]}; the file is corrupt or changed, try again"
        )


def _check_zip(path: Path, members: dict[str, int | None]) -> None:
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
            if bad is not None:
                raise DownloadError(f"download: {path.name} member {bad} is corrupt; try again")
            for member, size in members.items():
                try:
                    info = z.getinfo(member)
                except KeyError:
                    raise DownloadError(
                        f"download: {path.name} has no {member}; it is not the expected archive"
                    ) from None
                if size is not None and info.file_size != size:
                    raise DownloadError(
                        f"download: {path.name}:{member} unpacks to {info.file_size:,} bytes, expected {size:,}"
                    )
    except zipfile.BadZipFile as e:
        raise DownloadError(f"download: {path.name} is not a valid zip ({e}); try again") from None


def _extract(archive: Path, directory: Path, members: dict[str, int | None]) -> None:
    """Unpack the named members atomically, skipping those already in place with the right size."""
    with zipfile.ZipFile(archive) as z:
        for member in members:
            info = z.getinfo(member)
            dest = directory / member
            if dest.is_file() and dest.stat().st_size == info.file_size:
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=dest.name + ".", suffix=".part")
            try:
                with os.fdopen(fd, "wb") as out, z.open(info) as src:
                    while chunk := src.read(CHUNK):
                        out.write(chunk)
                os.replace(tmp, dest)
            finally:
                Path(tmp).unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------------------------
# PG-19: objects of a public GCS bucket, listed with the JSON API (which gives each object's size and md5)


def _list_objects(base: str, bucket: str, prefix: str, limit: int | None) -> list[tuple[str, int, str | None]]:
    """(name, size, md5 hex) of the bucket's objects under ``prefix``, in listing order, at most ``limit``."""
    out: list[tuple[str, int, str | None]] = []
    token = ""
    while True:
        query = {"prefix": prefix, "fields": "items(name,size,md5Hash),nextPageToken"}
        if token:
            query["pageToken"] = token
        url = f"{base}/storage/v1/b/{bucket}/o?{urllib.parse.urlencode(query)}"
        try:
            with urllib.request.urlopen(url, timeout=60) as resp:
                page = json.load(resp)
        except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
            raise DownloadError(
                f"download: listing {url} failed ({getattr(e, 'reason', e)}); check the network or --base-url"
            ) from None
        except json.JSONDecodeError:
            raise DownloadError(
                f"download: listing {url} did not return JSON; is --base-url a GCS-compatible server?"
            ) from None
        try:
            for item in page.get("items", []):
                if item["name"].endswith("/"):
                    continue
                md5 = item.get("md5Hash")
                out.append((item["name"], int(item["size"]), _b64_to_hex(md5) if md5 else None))
                if limit is not None and len(out) >= limit:
                    return out
            token = page.get("nextPageToken", "")
        except DownloadError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError):
            raise DownloadError(
                f"download: listing {url} has an entry without a valid name and size; is --base-url a GCS-compatible server?"
            ) from None
        if not token:
            return out


def _b64_to_hex(value: str) -> str:
    try:
        return base64.b64decode(value).hex()
    except (binascii.Error, ValueError):
        raise DownloadError(f"download: listing gave an invalid md5Hash {value!r}") from None


def safe_pg19_name(name: str) -> str:
    """A listed object name, if it has PG-19's shape; a server cannot make the downloader write outside its
    directory (``../``, absolute paths, odd characters are refused)."""
    if not isinstance(name, str) or not PG19_NAME.match(name):
        raise DownloadError(
            f"download: the listing names an unexpected file {name!r}; refusing to write it (is base_url a PG-19 mirror?)"
        )
    return name


def _read_pinned(path: Path) -> dict[str, dict]:
    try:
        files = json.loads(path.read_text(encoding="utf-8"))["files"]
        if not all(
            isinstance(v, dict) and isinstance(v.get("sha256"), str) and isinstance(v.get("size"), int)
            for v in files.values()
        ):
            raise ValueError("bad entry")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise DownloadError(
            f"download: manifest {path} cannot be read ({type(e).__name__}); give a manifest.json written by a previous download"
        ) from None
    return files


def _download_pg19(
    source: Source, directory: Path, base: str, progress: bool, limit: int | None, pinned: dict[str, dict] | None
) -> Path:
    root = directory / source.target
    meta = _list_objects(base, source.bucket, "metadata.csv", None)
    meta = [m for m in meta if m[0] == "metadata.csv"]
    if not meta:
        raise DownloadError(f"download: {base}/{source.bucket} has no metadata.csv; is --base-url right?")
    todo = meta[:]
    for split in PG19_SPLITS:
        books = [o for o in _list_objects(base, source.bucket, f"{split}/", limit) if o[0].endswith(".txt")]
        if not books:
            raise DownloadError(f"download: {base}/{source.bucket} lists no {split}/ books; is --base-url right?")
        todo += books
    for name, size, _ in todo:
        safe_pg19_name(name)
        if pinned is not None:
            if name not in pinned:
                raise DownloadError(
                    f"download: the listing names {name}, which the pinned manifest does not hold; the mirror differs from the pinned copy"
                )
            if pinned[name]["size"] != size:
                raise DownloadError(
                    f"download: the listing gives {name} {size:,} bytes, the pinned manifest {pinned[name]['size']:,}"
                )
    fetched: dict[str, dict] = {}
    # bytes, not files: 28,752 files of very different sizes; a file already present and verified counts as done
    bar = tqdm(total=sum(size for _, size, _ in todo), desc="pg19", unit="B", unit_scale=True, disable=not progress)
    with bar:
        for name, size, md5 in todo:
            digest = ("sha256", pinned[name]["sha256"]) if pinned is not None else (("md5", md5) if md5 else None)
            url = f"{base}/{source.bucket}/{urllib.parse.quote(name)}"
            dest = _fetch(url, root / name, size=size, digest=digest, progress=False)
            fetched[name] = {"size": dest.stat().st_size, "sha256": _hash_file(dest, ("sha256", ""))}
            bar.update(size)
    write_text_atomic(root / PG19_MANIFEST, json.dumps({"files": fetched}, indent=1, sort_keys=True))
    return root
