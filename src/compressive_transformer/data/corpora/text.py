"""text: one file split 90/5/5 by characters on line boundaries, or a directory of ``.txt`` documents (split by
count, or by ``train/ validation/ test/`` subdirectories)."""

from __future__ import annotations

import logging
from pathlib import Path

from compressive_transformer.core.config import ConfigError, DataConfig
from compressive_transformer.data.readers import (
    SPLIT_FRACTIONS,
    Document,
    RawSplit,
    count_words,
    decode,
    existing_path,
    source_files,
    split_directory,
)

logger = logging.getLogger(__name__)


def read(cfg: DataConfig, split: str) -> RawSplit:
    root = existing_path(cfg)
    if root.is_file():
        data = decode(root.read_bytes(), root, cfg)
        lo, hi = _line_bounds(data, root)[split]
        logger.info("%s: one file, split 90/5/5 by characters on line boundaries; %s = [%d, %d)", root, split, lo, hi)
        doc = data[lo:hi]
        return RawSplit(split, [doc], [split], count_words(doc), (root,))
    files = source_files(cfg, split)
    docs = [decode(f.read_bytes(), f, cfg) for f in files]
    return RawSplit(split, docs, [f.stem for f in files], sum(map(count_words, docs)), tuple(files))


def files(cfg: DataConfig, split: str) -> list[Path]:
    root = existing_path(cfg)
    if root.is_file():
        return [root]
    return split_directory(root, split, _txt_files, ".txt")


def _txt_files(directory: Path) -> list[Path]:
    files = sorted(p for p in directory.glob("*.txt") if p.is_file())
    if not files:
        raise ConfigError(f"data.path: {directory} has no .txt files; point data.path at a directory of .txt documents")
    return files


def _line_bounds(data: Document, path: Path) -> dict[str, tuple[int, int]]:
    """90/5/5 cut points of one text, each moved forward to just after the next newline."""
    n = len(data)
    newline = b"\n" if isinstance(data, bytes) else "\n"
    cuts = []
    for frac in (SPLIT_FRACTIONS[0], SPLIT_FRACTIONS[0] + SPLIT_FRACTIONS[1]):
        c = int(n * frac)
        nl = data.find(newline, c)  # type: ignore[arg-type]
        cuts.append(n if nl < 0 else nl + 1)
    bounds = {"train": (0, cuts[0]), "validation": (cuts[0], cuts[1]), "test": (cuts[1], n)}
    if any(hi <= lo for lo, hi in bounds.values()):
        raise ConfigError(
            f"data.path: {path} ({n} characters) is too short to split 90/5/5 on line boundaries; "
            "use a longer file or a directory with train/ validation/ test/"
        )
    return bounds
