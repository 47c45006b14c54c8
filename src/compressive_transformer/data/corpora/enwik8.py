"""enwik8: 10^8 bytes of Wikipedia XML, split 90M / 5M / 5M (a shorter prefix proportionally, with a warning)."""

from __future__ import annotations

import gzip
import warnings
import zipfile
from pathlib import Path

from compressive_transformer.core.config import ConfigError, DataConfig
from compressive_transformer.data.download import Source
from compressive_transformer.data.readers import SPLIT_FRACTIONS, RawSplit, count_words, existing_path

ENWIK8_SIZE = 100_000_000
ENWIK8_SPLIT = (90_000_000, 95_000_000)  # train | validation | test boundaries of the standard split


def read(cfg: DataConfig, split: str) -> RawSplit:
    path = _enwik8_file(cfg)
    data = _enwik8_bytes(path)
    n = len(data)
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
    doc = data[lo:hi]
    return RawSplit(split, [doc], [split], count_words(doc), (path,))


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


def _enwik8_bytes(path: Path) -> bytes:
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                return f.read()
        if path.suffix == ".zip":
            with zipfile.ZipFile(path) as z:
                names = [n for n in z.namelist() if not n.endswith("/")]
                member = "enwik8" if "enwik8" in names else (names[0] if len(names) == 1 else None)
                if member is None:
                    raise ConfigError(
                        f"data.path: {path} has no member 'enwik8'; use the enwik8.zip of the Hutter prize"
                    )
                return z.read(member)
    except (OSError, zipfile.BadZipFile, EOFError) as e:
        raise ConfigError(f"data.path: {path} is not a readable archive ({e}); download it again") from None
    return path.read_bytes()


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
