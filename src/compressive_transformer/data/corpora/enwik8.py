"""enwik8: 10^8 bytes of Wikipedia XML, split 90M / 5M / 5M (a shorter prefix proportionally, with a warning)."""

from __future__ import annotations

import contextlib
import gzip
import warnings
import zipfile
from pathlib import Path
from typing import BinaryIO, Iterator

from compressive_transformer.core.config import ConfigError, DataConfig
from compressive_transformer.data.documents import (
    BYTE_BLOCK,
    DocumentSource,
    Piece,
    SplitStream,
    decoded_pieces,
    read_blocks,
)
from compressive_transformer.data.download import Source
from compressive_transformer.data.readers import SPLIT_FRACTIONS, RawSplit, existing_path, materialize

ENWIK8_SIZE = 100_000_000
ENWIK8_SPLIT = (90_000_000, 95_000_000)  # train | validation | test boundaries of the standard split


def stream(cfg: DataConfig, split: str) -> SplitStream:
    """The split's bytes of the one file (plain, .zip or .gz), read a block at a time."""
    path = _enwik8_file(cfg)
    n = _enwik8_size(path)
    if n == ENWIK8_SIZE:
        c1, c2 = ENWIK8_SPLIT
    else:
        if n < 3:
            raise ConfigError(f"data.path: {path} holds {n} bytes; enwik8 needs at least 3 to split")
        c1, c2 = round(n * SPLIT_FRACTIONS[0]), round(n * (SPLIT_FRACTIONS[0] + SPLIT_FRACTIONS[1]))
        warnings.warn(
            f"{path} has {n:,} bytes, not the 100,000,000 of enwik8: split 90/5/5 proportionally "
            "(label results 'enwik8 prefix')",
            stacklevel=3,
        )
    lo, hi = {"train": (0, c1), "validation": (c1, c2), "test": (c2, n)}[split]

    def pieces() -> Iterator[Piece]:
        with _open_enwik8(path) as f:
            for _ in read_blocks(f, lo):  # a compressed stream cannot seek: read up to the split
                pass
            if cfg.tokenizer == "bytes":  # its ids are the bytes: no need to cut them at lines
                yield from (Piece(data, len(data)) for data in read_blocks(f, hi - lo, block=BYTE_BLOCK))
            else:
                yield from decoded_pieces(read_blocks(f, hi - lo), as_text=False)

    return SplitStream(split, [DocumentSource(split, hi - lo, (path,), pieces)], (path,))


def read(cfg: DataConfig, split: str) -> RawSplit:
    return materialize(stream(cfg, split))


def files(cfg: DataConfig, split: str) -> list[Path]:
    """Every split reads the one enwik8 file."""
    return [_enwik8_file(cfg)]


def _enwik8_file(cfg: DataConfig) -> Path:
    root = existing_path(cfg)
    if root.is_file():
        return root
    for name in ("enwik8", "enwik8.zip", "enwik8.gz"):
        if (root / name).is_file():
            return root / name
    raise ConfigError(f"data.path: {root} has no enwik8, enwik8.zip or enwik8.gz; point data.path at the enwik8 file")


@contextlib.contextmanager
def _open_enwik8(path: Path) -> Iterator[BinaryIO]:
    """The file's bytes as a binary stream: the file itself, or the one member of its .gz or .zip."""
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                yield f  # type: ignore[misc]
        elif path.suffix == ".zip":
            with zipfile.ZipFile(path) as z, z.open(_zip_member(z, path)) as f:
                yield f  # type: ignore[misc]
        else:
            with path.open("rb") as f:
                yield f
    except (OSError, zipfile.BadZipFile, EOFError) as e:
        raise ConfigError(f"data.path: {path} is not a readable archive ({e}); download it again") from None


def _zip_member(z: zipfile.ZipFile, path: Path) -> str:
    names = [n for n in z.namelist() if not n.endswith("/")]
    member = "enwik8" if "enwik8" in names else (names[0] if len(names) == 1 else None)
    if member is None:
        raise ConfigError(f"data.path: {path} has no member 'enwik8'; use the enwik8.zip of the Hutter prize")
    return member


def _enwik8_size(path: Path) -> int:
    """The bytes the file holds once decompressed (a .gz is read through: its trailer keeps them mod 2**32)."""
    if path.suffix == ".zip":
        try:
            with zipfile.ZipFile(path) as z:
                return z.getinfo(_zip_member(z, path)).file_size
        except (OSError, zipfile.BadZipFile) as e:
            raise ConfigError(f"data.path: {path} is not a readable archive ({e}); download it again") from None
    if path.suffix == ".gz":
        with _open_enwik8(path) as f:
            return sum(len(b) for b in read_blocks(f, None))
    return path.stat().st_size


# download size and sha256 as recorded by the HuggingFace ``datasets`` checksums of the same URL
SOURCES = {
    "enwik8": Source(
        url="http://mattmahoney.net/dc",
        filename="enwik8.zip",
        size=36_445_475,
        sha256="547994d9980ebed1288380d652999f38a14fe291a6247c157c3d33d4932534bc",
        members={"enwik8": 100_000_000},
        target="enwik8",
    ),
}
