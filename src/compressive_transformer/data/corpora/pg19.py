"""pg19: ``train/ validation/ test/`` of ``<id>.txt`` books, and ``metadata.csv`` without a header."""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from pathlib import Path

from compressive_transformer.core.config import ConfigError, DataConfig
from compressive_transformer.data.documents import FileList, SplitStream
from compressive_transformer.data.download import Source
from compressive_transformer.data.readers import RawSplit, existing_path, file_documents, materialize


@dataclass(frozen=True)
class Pg19Book:
    id: str
    title: str
    year: int | None
    url: str


def stream(cfg: DataConfig, split: str) -> SplitStream:
    """One document per book, named by its id, in id order; each book read when the stream reaches it."""
    books = files(cfg, split)
    return SplitStream(split, file_documents(books, cfg), books)


def read(cfg: DataConfig, split: str) -> RawSplit:
    return materialize(stream(cfg, split))


def files(cfg: DataConfig, split: str) -> FileList:
    root = existing_path(cfg)
    directory = root / split
    if not directory.is_dir():
        raise ConfigError(f"data.path: PG-19 directory {root} has no {split}/ subdirectory; add {directory}")
    books = FileList.scan(directory, ".txt", key=_book_order)
    if not books:
        raise ConfigError(f"data.path: {directory} has no <id>.txt books; put the {split} books there")
    return books


def _book_order(name: str) -> tuple[int, int, str]:
    """Books by numeric id, then any others by name."""
    stem = os.path.splitext(name)[0]
    return (0, int(stem), "") if stem.isdigit() else (1, 0, stem)


def read_pg19_metadata(directory: str | Path) -> dict[str, Pg19Book]:
    """``metadata.csv`` as PG-19 ships it: ``id,title,year,url`` rows, no header, titles quoted where needed."""
    path = Path(directory) / "metadata.csv"
    if not path.is_file():
        raise ConfigError(f"data.path: {directory} has no metadata.csv; download it with the PG-19 books")
    books: dict[str, Pg19Book] = {}
    with path.open(newline="", encoding="utf-8") as f:
        for i, row in enumerate(csv.reader(f), start=1):
            if not row:
                continue
            if len(row) != 4:
                raise ConfigError(f"{path}:{i}: expected 4 fields (id,title,year,url), got {len(row)}; fix the line")
            book_id, title, year, url = row
            books[book_id] = Pg19Book(book_id, title, int(year) if year.strip().isdigit() else None, url)
    return books


SOURCES = {"pg19": Source(url="https://storage.googleapis.com", bucket="deepmind-gutenberg", target="pg19")}
