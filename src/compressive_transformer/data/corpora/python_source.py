"""``python-source``: the Python standard library's own ``.py`` files as a corpus of source code, one document per
file, present wherever Python is (no download).

Code is where memory models gain most (an identifier defined far above is used again below), and a file is a
natural document: memory resets at each file's start, as for every multi-document format.

Which files: every ``*.py`` under ``sysconfig.get_paths()["stdlib"]`` except those under a directory named in
:data:`EXCLUDED_DIRS` (installed packages, the stdlib's test suites and their data, generated codec tables, the
pydoc topics literal) and the generated ``_sysconfigdata*`` modules, and except files that are not UTF-8 text.

The split rule, fixed so that every machine with the same files splits them the same way: a file's split is decided
by its path relative to the stdlib root, in POSIX form (e.g. ``json/decoder.py``): the first 8 bytes of the SHA-256
of that string, read as a big-endian integer, modulo 100 -> ``[0, 90)`` train, ``[90, 95)`` validation,
``[95, 100)`` test. A file's split depends on its own path only, so it is stable when other files come or go
across Python versions. Within a split the files are in sorted path order.
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
from pathlib import Path

from compressive_transformer.core.config import DataConfig
from compressive_transformer.data.documents import SplitStream
from compressive_transformer.data.readers import RawSplit, count_words, memory_document

NAME = "python-source"
EXCLUDED_DIRS = frozenset(
    {
        "site-packages",  # installed third-party packages, not the standard library
        "dist-packages",
        "__pycache__",
        "test",  # the regression suite: test data files, deliberately malformed sources, huge literal tables
        "tests",
        "idle_test",
        "encodings",  # generated character-map tables
        "pydoc_data",  # one 750 KB string literal (the pydoc corpus)
    }
)
EXCLUDED_PREFIXES = ("_sysconfigdata",)  # generated per machine
SPLIT_BOUNDS = {"train": (0, 90), "validation": (90, 95), "test": (95, 100)}


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def split_of(relative: str) -> str:
    """The split of a file from its POSIX path relative to the stdlib root (the rule of the module docstring)."""
    bucket = int.from_bytes(hashlib.sha256(relative.encode("utf-8")).digest()[:8], "big") % 100
    return next(s for s, (lo, hi) in SPLIT_BOUNDS.items() if lo <= bucket < hi)


def _included(relative: Path) -> bool:
    return not (EXCLUDED_DIRS & set(relative.parts[:-1])) and not relative.name.startswith(EXCLUDED_PREFIXES)


def _utf8_text(path: Path) -> str | None:
    data = path.read_bytes()
    if b"\x00" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def python_files(root: Path, split: str) -> list[Path]:
    """The included ``.py`` files of ``root`` in ``split``, sorted by relative path (UTF-8 not yet checked)."""
    rels = []
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = [d for d in subdirs if d not in EXCLUDED_DIRS]  # never walk into site-packages
        rels += [Path(directory, f).relative_to(root) for f in files if f.endswith(".py")]
    return [root / r for r in sorted(rels) if _included(r) and split_of(r.as_posix()) == split]


def read_python_source(root: Path, split: str) -> RawSplit:
    """One document per UTF-8 file of ``split``, named by its relative path; files that are not UTF-8 are skipped."""
    docs, names, sources = [], [], []
    for path in python_files(root, split):
        text = _utf8_text(path)
        if text is None:
            continue
        docs.append(text)
        names.append(path.relative_to(root).as_posix())
        sources.append(path)
    return RawSplit(split, docs, names, sum(map(count_words, docs)), tuple(sources))


def files(cfg: DataConfig, split: str) -> list[Path]:
    return python_files(stdlib_root(), split)


def stream(cfg: DataConfig, split: str) -> SplitStream:
    raw = read_python_source(stdlib_root(), split)  # a few MB: read whole, to know which files are UTF-8
    return SplitStream(
        split, [memory_document(n, d, (s,)) for d, n, s in zip(raw.documents, raw.names, raw.sources)], raw.sources
    )


def read(cfg: DataConfig, split: str) -> RawSplit:
    return read_python_source(stdlib_root(), split)
