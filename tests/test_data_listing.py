"""A split's files are listed as arrays (FileList) and its documents made as they are reached (FileDocuments); a
build keeps each document's end and name on disk, not in memory, checks them on resume, and says which file of the
corpus changed."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compressive_transformer.core.config import DataConfig
from compressive_transformer.data import WordTokenizer, load_corpus, read_split, stream_split
from compressive_transformer.data import shards as shards_module
from compressive_transformer.data.documents import FileDocuments, FileList
from compressive_transformer.data.readers import empty_split, source_files

names = st.lists(
    st.text(alphabet="abcxyz0123456789-_é", min_size=1, max_size=8).map(lambda s: s + ".txt"),
    unique=True,
    max_size=12,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files=names, lo=st.integers(-14, 14), hi=st.integers(-14, 14), seed=st.integers(0, 9))
def test_a_listing_is_the_sorted_files_with_their_stat_and_slices_like_a_list(tmp_path_factory, files, lo, hi, seed):
    root = tmp_path_factory.mktemp("files")
    rng = random.Random(seed)
    for name in files:
        (root / name).write_bytes(b"x" * rng.randint(0, 50))
    (root / "skipped.md").write_text("not a .txt")
    (root / "folder.txt").mkdir()  # a folder is not a file, whatever its name
    listing = FileList.scan(root, ".txt")
    expected = sorted(root / n for n in files)
    assert list(listing) == expected and listing == expected and len(listing) == len(files)
    for i, path in enumerate(expected):
        st_ = path.stat()
        assert listing.stamp(i) == (st_.st_size, st_.st_mtime_ns) and listing.name(i) == path.name
    assert list(listing[lo:hi]) == expected[lo:hi] and isinstance(listing[lo:hi], FileList)
    assert list(listing[lo:hi].sizes) == [p.stat().st_size for p in expected[lo:hi]]
    assert list(listing[::2]) == expected[::2]
    assert list(listing.records()) == [[str(p.resolve()), *listing.stamp(i)] for i, p in enumerate(expected)]
    assert FileList.of(expected) == listing and list(FileList.of(expected).mtimes) == list(listing.mtimes)
    if expected:
        assert listing[-1] == expected[-1]
    with pytest.raises(IndexError):
        listing[len(files)]


def test_a_listing_names_a_linked_file_by_its_target_and_a_missing_one_by_size_minus_one(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "book.txt").write_text("some text\n")
    (tmp_path / "corpus").mkdir()
    os.symlink(tmp_path / "real" / "book.txt", tmp_path / "corpus" / "a.txt")
    (tmp_path / "corpus" / "b.txt").write_text("more\n")
    listing = FileList.scan(tmp_path / "corpus", ".txt")
    assert [r[0] for r in listing.records()] == [
        str((tmp_path / "real" / "book.txt").resolve()),
        str((tmp_path / "corpus" / "b.txt").resolve()),
    ]
    gone = FileList.of([tmp_path / "corpus" / "b.txt", tmp_path / "nowhere.txt"])
    assert list(gone.sizes) == [5, -1]


def test_an_empty_split_is_told_from_one_with_a_file_gone(tmp_path: Path) -> None:
    for split in ("train", "validation", "test"):
        (tmp_path / split).mkdir()
        (tmp_path / split / "1.txt").write_text("")
    cfg = DataConfig(format="pg19", path=str(tmp_path), tokenizer="words")
    assert "are empty" in (empty_split(cfg, "test") or "")
    (tmp_path / "test" / "1.txt").write_text("words\n")
    assert empty_split(cfg, "test") is None


def write_books(root: Path, n: int) -> DataConfig:
    rng = random.Random(0)
    for split, count in (("train", n), ("validation", 1), ("test", 1)):
        (root / split).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            lines = [" ".join(rng.choice("abcdefgh") * rng.randint(1, 4) for _ in range(9)) for _ in range(20)]
            (root / split / f"{i}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return DataConfig(format="pg19", path=str(root), tokenizer="words")


def test_a_split_of_a_file_per_document_makes_its_documents_as_they_are_reached(tmp_path: Path) -> None:
    cfg = write_books(tmp_path / "books", n=12)
    stream = stream_split(cfg, "train")
    assert isinstance(stream.documents, FileDocuments) and isinstance(stream.sources, FileList)
    assert [d.name for d in stream.documents] == [str(i) for i in range(12)], "books by numeric id"
    assert stream.total_bytes == sum(p.stat().st_size for p in source_files(cfg, "train"))
    fourth = stream.documents[3]
    assert fourth.files == (tmp_path / "books" / "train" / "3.txt",) and fourth.stamps == (stream.sources.stamp(3),)
    assert [d.name for d in stream.documents[10:]] == ["10", "11"]


def interrupt_after_shards(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    """Make the build stop (Ctrl-C) as it is about to commit its ``n+1``-th shard."""
    real, calls = shards_module._Writer._commit, [0]

    def commit(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] > n and not kwargs.get("final"):
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(shards_module._Writer, "_commit", commit)


def build_dir(cache: Path) -> Path:
    return next(cache.glob("*.build"))


def interrupted_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shards: int) -> tuple[DataConfig, WordTokenizer]:
    """Twelve books' train split built into ``tmp_path / "cache"`` until it has committed ``shards`` shards, then
    stopped by Ctrl-C; the corpus and tokenizer, to build it again."""
    cfg = write_books(tmp_path / "books", n=12)
    tok = WordTokenizer.train(read_split(cfg, "train").documents)
    interrupt_after_shards(monkeypatch, shards)
    with pytest.raises(KeyboardInterrupt):
        load_corpus(cfg, "train", tok, tmp_path / "cache", progress=False, shard_bytes=300, batch_bytes=100)
    monkeypatch.undo()
    return cfg, tok


def test_a_build_keeps_its_documents_ends_and_names_on_disk_not_in_its_shards(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg, tok = interrupted_build(tmp_path, monkeypatch, 2)
    work = build_dir(tmp_path / "cache")
    records = [json.loads(p.read_text()) for p in sorted(work.glob("shard-*.json"))]
    assert len(records) == 2 and all(isinstance(r["ends"], int) and "names" not in r for r in records)
    offsets = np.fromfile(work / "offsets.bin", dtype=np.int64)
    names = [json.loads(line) for line in (work / "names.jsonl").read_text().splitlines()]
    assert len(offsets) == records[-1]["ends"] + 1 and offsets[0] == 0 and offsets[-1] == records[-1]["last_end"]
    assert names == [str(i) for i in range(len(names))] and len(names) == records[-1]["ends"]
    sources = [json.loads(line) for line in (work / shards_module.SOURCES_FILE).read_text().splitlines()]
    assert [Path(s[0]).name for s in sources] == [f"{i}.txt" for i in range(12)]

    corpus = load_corpus(cfg, "train", tok, tmp_path / "cache", progress=False, shard_bytes=300, batch_bytes=100)
    whole = load_corpus(cfg, "train", tok, tmp_path / "whole", progress=False, shard_bytes=300, batch_bytes=100)
    assert corpus.names == whole.names == [str(i) for i in range(12)]
    assert np.array_equal(corpus.doc_offsets, whole.doc_offsets) and np.array_equal(corpus.tokens, whole.tokens)
    assert "names" not in corpus.meta, "the cache's JSON does not grow with the documents"


@pytest.mark.parametrize("damaged", ["offsets.bin", "names.jsonl"])
def test_a_resumed_build_does_not_trust_a_shard_whose_ends_or_names_the_disk_did_not_keep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damaged: str
) -> None:
    cfg, tok = interrupted_build(tmp_path, monkeypatch, 3)
    path = build_dir(tmp_path / "cache") / damaged
    data = bytearray(path.read_bytes())
    data[-2] ^= 0x01  # the last shard's last byte but one, as a machine that lost its page cache may leave it
    path.write_bytes(bytes(data))
    corpus = load_corpus(cfg, "train", tok, tmp_path / "cache", progress=False, shard_bytes=300, batch_bytes=100)
    whole = load_corpus(cfg, "train", tok, tmp_path / "whole", progress=False)
    assert corpus.names == whole.names and np.array_equal(corpus.doc_offsets, whole.doc_offsets)
    assert np.array_equal(corpus.tokens, whole.tokens)


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda train: (train / "12.txt").write_text("a new book\n"), ("12.txt is new",)),
        (lambda train: (train / "11.txt").unlink(), ("11.txt is gone",)),
        (lambda train: (train / "4.txt").write_text("other text\n"), ("4.txt has another size or modification time",)),
        (lambda train: (train / "4.txt").rename(train / "40.txt"), ("4.txt is gone or ", "5.txt is new")),
    ],
    ids=["new", "gone", "changed", "renamed"],
)
def test_a_build_that_cannot_resume_names_the_file_that_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, change, said: tuple[str, ...]
) -> None:
    cfg, tok = interrupted_build(tmp_path, monkeypatch, 1)
    capsys.readouterr()
    change(tmp_path / "books" / "train")
    corpus = load_corpus(cfg, "train", tok, tmp_path / "cache", progress=False, shard_bytes=300, batch_bytes=100)
    err = capsys.readouterr().err
    line = next(line for line in err.splitlines() if "cannot be resumed" in line)
    assert all(part in line for part in said), err
    fresh = load_corpus(cfg, "train", tok, tmp_path / "fresh", progress=False)
    assert corpus.names == fresh.names and np.array_equal(corpus.tokens, fresh.tokens)
