"""text: one file split 90/5/5 by characters on line boundaries, or a directory of ``.txt`` documents (split by
count, or by ``train/ validation/ test/`` subdirectories)."""

from __future__ import annotations

import functools
import logging
from pathlib import Path

from compressive_transformer.core.config import ConfigError, DataConfig
from compressive_transformer.data.documents import (
    DocumentSource,
    FileList,
    SplitStream,
    byte_of_char,
    file_pieces,
    find_byte,
    scan_file,
)
from compressive_transformer.data.readers import (
    SPLIT_FRACTIONS,
    RawSplit,
    existing_path,
    file_documents,
    materialize,
    not_text,
    source_files,
    split_directory,
)

logger = logging.getLogger(__name__)


def stream(cfg: DataConfig, split: str) -> SplitStream:
    root = existing_path(cfg)
    if root.is_file():
        lo, hi = one_file_bounds(root, cfg)[split]
        logger.info(
            "%s: one file, split 90/5/5 by characters on line boundaries; %s = bytes [%d, %d)", root, split, lo, hi
        )
        doc = DocumentSource(split, hi - lo, (root,), lambda: file_pieces(root, cfg.tokenizer, not_text(cfg), lo, hi))
        return SplitStream(split, [doc], (root,))
    files = source_files(cfg, split)
    return SplitStream(split, file_documents(files, cfg), files)


def read(cfg: DataConfig, split: str) -> RawSplit:
    return materialize(stream(cfg, split))


def files(cfg: DataConfig, split: str) -> FileList:
    root = existing_path(cfg)
    if root.is_file():
        return FileList.of([root])
    return split_directory(root, split, _txt_files, ".txt")


def _txt_files(directory: Path) -> FileList:
    files = FileList.scan(directory, ".txt")
    if not files:
        raise ConfigError(f"data.path: {directory} has no .txt files; point data.path at a directory of .txt documents")
    return files


def one_file_bounds(path: Path, cfg: DataConfig) -> dict[str, tuple[int, int]]:
    """The byte ranges of the three splits of one file: its 90/5/5 cut points in characters (bytes when it is not
    text), each moved forward to just after the next newline; found in passes over the file, never read whole."""
    st = path.stat()
    return _bounds(str(path), st.st_size, st.st_mtime_ns, cfg)


@functools.lru_cache(maxsize=4)
def _bounds(name: str, size: int, mtime_ns: int, cfg: DataConfig) -> dict[str, tuple[int, int]]:
    """:func:`one_file_bounds` for one state of one file (each split's stream asks; a file of GB is scanned once)."""
    path = Path(name)
    scan = scan_file(path)
    if scan.bad is not None and cfg.tokenizer != "bytes":
        raise not_text(cfg)(path, scan.bad)
    n = scan.chars
    cuts = []
    for frac in (SPLIT_FRACTIONS[0], SPLIT_FRACTIONS[0] + SPLIT_FRACTIONS[1]):
        at = byte_of_char(scan, int(n * frac))
        nl = find_byte(path, b"\n", at, size)
        cuts.append(size if nl < 0 else nl + 1)
    bounds = {"train": (0, cuts[0]), "validation": (cuts[0], cuts[1]), "test": (cuts[1], size)}
    if any(hi <= lo for lo, hi in bounds.values()):
        raise ConfigError(
            f"data.path: {path} ({n} characters) is too short to split 90/5/5 on line boundaries; "
            "use a longer file or a directory with train/ validation/ test/"
        )
    return bounds
