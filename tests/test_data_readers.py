"""Corpus readers and DataConfig validation, on small files made here (the real corpora: test_data_real.py)."""

from __future__ import annotations

import gzip
import logging
import zipfile
from pathlib import Path

import pytest

from compressive_transformer.core.config import ConfigError, DataConfig, from_dict
from compressive_transformer.data import SPLITS, count_words, read_documents, read_pg19_metadata, read_split
from compressive_transformer.data.readers import count_wikitext_articles, source_files, wikitext_stream

# -- DataConfig ----------------------------------------------------------------------------------------------------


def test_data_config_defaults_and_loading() -> None:
    cfg = DataConfig()
    assert (cfg.format, cfg.tokenizer, cfg.path, cfg.subword_vocab_size) == ("pydoc", "bytes", "", 8192)
    cfg = from_dict(
        DataConfig,
        {"format": "wikitext", "path": "/d", "tokenizer": "words", "train_file": "wiki.valid.tokens"},
        "data",
    )
    assert cfg.train_file == "wiki.valid.tokens"
    assert DataConfig(tokenizer="bpe", vocab_size=500).subword_vocab_size == 500


@pytest.mark.parametrize(
    "kwargs, key, hint",
    [
        ({"format": "csv"}, "data.format", "pydoc, text, enwik8, wikitext, pg19"),
        ({"tokenizer": "chars"}, "data.tokenizer", "bytes, words, bpe, unigram"),
        ({"format": "text"}, "data.path", "set data.path"),
        ({"vocab_size": -1}, "data.vocab_size", ">= 0"),
        ({"tokenizer": "bpe", "vocab_size": 100}, "data.vocab_size", ">= 257"),
        ({"min_freq": 0}, "data.min_freq", ">= 1"),
        ({"format": "enwik8", "path": "x", "tokenizer": "words"}, "data.tokenizer", "'bytes'"),
        ({"format": "text", "path": "x", "train_file": "a"}, "data.train_file", "only the wikitext"),
    ],
)
def test_data_config_rejects_impossible_settings(kwargs: dict, key: str, hint: str) -> None:
    with pytest.raises(ConfigError) as e:
        DataConfig(**kwargs)
    assert str(e.value).startswith(key) and hint in str(e.value) and "\n" not in str(e.value)


def test_from_dict_rejects_unknown_data_key() -> None:
    with pytest.raises(ConfigError, match=r"data\.batch_size: unknown key"):
        from_dict(DataConfig, {"batch_size": 8}, "data")


# -- pydoc ---------------------------------------------------------------------------------------------------------


def test_pydoc_split_is_deterministic_and_disjoint() -> None:
    import pydoc_data.topics

    splits = {s: read_split(DataConfig(), s) for s in SPLITS}
    names = [n for s in SPLITS for n in splits[s].names]
    assert names == sorted(pydoc_data.topics.topics), "topics sorted by key, train then validation then test"
    n = len(names)
    assert len(splits["validation"].names) == max(1, round(0.05 * n)) == len(splits["test"].names)
    assert splits["train"].documents[0] == pydoc_data.topics.topics[names[0]]
    assert splits["train"].num_words == sum(len(d.split()) for d in splits["train"].documents)
    assert read_documents(DataConfig(), "test") == splits["test"].documents


def test_unknown_split_is_an_error() -> None:
    with pytest.raises(ConfigError, match="unknown split"):
        read_split(DataConfig(), "dev")


# -- text ----------------------------------------------------------------------------------------------------------


def test_text_file_splits_90_5_5_on_line_boundaries(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    lines = [f"line {i} has some words" for i in range(200)]
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    cfg = DataConfig(format="text", path=str(path), tokenizer="words")
    with caplog.at_level(logging.INFO, logger="compressive_transformer.data.readers"):
        parts = [read_documents(cfg, s) for s in SPLITS]
    assert "90/5/5 by characters on line boundaries" in caplog.text
    assert all(len(p) == 1 for p in parts)
    assert "".join(p[0] for p in parts) == path.read_text(encoding="utf-8")
    assert all(p[0].endswith("\n") for p in parts), "cuts fall just after a newline"
    total = len(path.read_text())
    assert abs(len(parts[0][0]) - 0.9 * total) < 30 and abs(len(parts[1][0]) - 0.05 * total) < 30
    assert count_words(parts[0][0]) + count_words(parts[1][0]) + count_words(parts[2][0]) == 200 * 5


def test_text_directory_with_and_without_split_subdirectories(tmp_path: Path) -> None:
    flat = tmp_path / "flat"
    flat.mkdir()
    for i in range(40):
        (flat / f"doc{i:02d}.txt").write_text(f"document {i}", encoding="utf-8")
    (flat / "notes.md").write_text("ignored")
    cfg = DataConfig(format="text", path=str(flat))
    splits = {s: read_split(cfg, s) for s in SPLITS}
    assert [len(splits[s].documents) for s in SPLITS] == [36, 2, 2]
    assert splits["test"].names == ["doc38", "doc39"] and splits["test"].documents == ["document 38", "document 39"]

    nested = tmp_path / "nested"
    for s, docs in {"train": ["a b", "c"], "validation": ["d"], "test": ["e f g"]}.items():
        (nested / s).mkdir(parents=True)
        for i, text in enumerate(docs):
            (nested / s / f"{i}.txt").write_text(text, encoding="utf-8")
    cfg = DataConfig(format="text", path=str(nested))
    assert read_documents(cfg, "train") == ["a b", "c"]
    assert read_split(cfg, "test").num_words == 3
    assert source_files(cfg, "validation") == [nested / "validation" / "0.txt"]


def test_text_errors_are_one_line(tmp_path: Path) -> None:
    def message(cfg: DataConfig, split: str = "train") -> str:
        with pytest.raises(ConfigError) as e:
            read_split(cfg, split)
        assert "\n" not in str(e.value)
        return str(e.value)

    assert "does not exist" in message(DataConfig(format="text", path=str(tmp_path / "missing.txt")))
    (tmp_path / "empty").mkdir()
    assert "no .txt files" in message(DataConfig(format="text", path=str(tmp_path / "empty")))
    (tmp_path / "two").mkdir()
    for i in range(2):
        (tmp_path / "two" / f"{i}.txt").write_text("x")
    assert "at least 3" in message(DataConfig(format="text", path=str(tmp_path / "two")))
    (tmp_path / "half" / "train").mkdir(parents=True)
    assert "no validation/" in message(DataConfig(format="text", path=str(tmp_path / "half")))
    (tmp_path / "tiny.txt").write_text("one line only")
    assert "too short" in message(DataConfig(format="text", path=str(tmp_path / "tiny.txt")))


def test_binary_file_needs_the_byte_tokenizer(tmp_path: Path) -> None:
    blob = bytes(range(256)) * 40 + b"\n" + bytes([0xFF, 0xFE]) * 100
    path = tmp_path / "blob.bin"
    path.write_bytes(blob)
    for tokenizer in ("words", "bpe", "unigram"):
        with pytest.raises(ConfigError, match="set tokenizer = 'bytes'") as e:
            read_documents(DataConfig(format="text", path=str(path), tokenizer=tokenizer), "train")
        assert str(e.value).startswith("data.tokenizer:") and "\n" not in str(e.value)
    docs = [read_documents(DataConfig(format="text", path=str(path)), s)[0] for s in SPLITS]
    assert all(isinstance(d, bytes) for d in docs) and b"".join(docs) == blob  # type: ignore[arg-type]


# -- enwik8 --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("packing", ["plain", "gz", "zip", "directory"])
def test_enwik8_prefix_split_proportionally_in_every_packing(tmp_path: Path, packing: str) -> None:
    data = bytes((i * 7919) % 251 for i in range(20_000)).replace(b"\x00", b" ")
    if packing == "gz":
        path = tmp_path / "enwik8.gz"
        path.write_bytes(gzip.compress(data))
    elif packing == "zip":
        path = tmp_path / "enwik8.zip"
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("enwik8", data)
    else:
        path = tmp_path / "enwik8"
        path.write_bytes(data)
    cfg = DataConfig(format="enwik8", path=str(tmp_path if packing == "directory" else path))
    with pytest.warns(UserWarning, match="split 90/5/5 proportionally"):
        parts = [read_split(cfg, s) for s in SPLITS]
    assert [len(p.documents[0]) for p in parts] == [18_000, 1_000, 1_000]
    assert b"".join(p.documents[0] for p in parts) == data  # type: ignore[misc]
    assert parts[0].num_words == len(data[:18_000].split())


def test_enwik8_full_size_uses_the_standard_split(tmp_path: Path, recwarn: pytest.WarningsRecorder) -> None:
    path = tmp_path / "enwik8"
    with path.open("wb") as f:  # a sparse 10^8-byte file: the standard 90M / 5M / 5M split, no warning
        f.truncate(100_000_000)
    cfg = DataConfig(format="enwik8", path=str(path))
    assert len(read_documents(cfg, "test")[0]) == 5_000_000
    assert not [w for w in recwarn if "proportionally" in str(w.message)]


def test_enwik8_errors(tmp_path: Path) -> None:
    (tmp_path / "bad.zip").write_bytes(b"not a zip")
    with pytest.raises(ConfigError, match="not a readable archive"):
        read_documents(DataConfig(format="enwik8", path=str(tmp_path / "bad.zip")), "train")
    (tmp_path / "d").mkdir()
    with pytest.raises(ConfigError, match="has no enwik8"):
        read_documents(DataConfig(format="enwik8", path=str(tmp_path / "d")), "train")


# -- wikitext ------------------------------------------------------------------------------------------------------


WIKI = (
    " \n = Alpha = \n \n Alpha is a <unk> . \n \n = = History = = \n \n It began . \n \n = Beta = \n \n Beta too . \n"
)


def test_wikitext_stream_appends_eos_per_line_and_counts_articles(tmp_path: Path) -> None:
    doc, n_articles = wikitext_stream(WIKI)
    assert n_articles == 2, "' = = History = = ' is a section, not an article"
    assert doc.split()[:8] == ["<eos>", "=", "Alpha", "=", "<eos>", "<eos>", "Alpha", "is"]
    assert doc.split().count("<eos>") == WIKI.count("\n")
    assert count_wikitext_articles([" ", " = A = ", " ", " text ", " = B = ", " more "]) == 1, (
        "titles sit between blank lines"
    )

    for name in ("wiki.train.tokens", "wiki.valid.tokens", "wiki.test.tokens"):
        (tmp_path / name).write_text(WIKI, encoding="utf-8")
    raw = read_split(DataConfig(format="wikitext", path=str(tmp_path), tokenizer="words"), "validation")
    assert raw.documents == [doc] and raw.num_articles == 2 and raw.num_words == len(doc.split())


def test_wikitext_missing_train_needs_train_file(tmp_path: Path) -> None:
    (tmp_path / "wiki.valid.tokens").write_text(WIKI, encoding="utf-8")
    (tmp_path / "wiki.test.tokens").write_text(WIKI, encoding="utf-8")
    cfg = DataConfig(format="wikitext", path=str(tmp_path), tokenizer="words")
    with pytest.raises(
        ConfigError, match=r"data\.train_file: .* has no wiki\.train\.tokens; .*train_file = 'wiki\.valid\.tokens'"
    ):
        read_documents(cfg, "train")
    cfg = DataConfig(format="wikitext", path=str(tmp_path), tokenizer="words", train_file="wiki.valid.tokens")
    assert read_documents(cfg, "train") == read_documents(cfg, "test")  # (same text here, different files)
    with pytest.raises(ConfigError, match="is the training text of this run"):
        read_documents(cfg, "validation")
    cfg = DataConfig(format="wikitext", path=str(tmp_path), tokenizer="words", train_file="nope.tokens")
    with pytest.raises(ConfigError, match="does not exist"):
        read_documents(cfg, "train")
    (tmp_path / "wiki.test.tokens").unlink()
    with pytest.raises(ConfigError, match="no wiki.test.tokens"):
        read_documents(cfg, "test")


# -- pg19 ----------------------------------------------------------------------------------------------------------


def make_pg19(root: Path) -> None:
    books = {"train": {"10": "a b c", "2": "d e"}, "validation": {"7": "f"}, "test": {"8": "g h"}}
    for split, items in books.items():
        (root / split).mkdir(parents=True)
        for book_id, text in items.items():
            (root / split / f"{book_id}.txt").write_text(text, encoding="utf-8")
    (root / "metadata.csv").write_text(
        '10,"Title, With Comma",1850,http://x/10\n2,Two,1900,http://x/2\n7,Seven,,http://x/7\n8,Eight,1899,http://x/8\n',
        encoding="utf-8",
    )


def test_pg19_books_metadata_and_words(tmp_path: Path) -> None:
    make_pg19(tmp_path)
    cfg = DataConfig(format="pg19", path=str(tmp_path))
    train = read_split(cfg, "train")
    assert train.names == ["2", "10"], "books ordered by numeric id"
    assert train.documents == ["d e", "a b c"] and train.num_words == 5
    meta = read_pg19_metadata(tmp_path)
    assert meta["10"].title == "Title, With Comma" and meta["10"].year == 1850 and meta["7"].year is None
    (tmp_path / "metadata.csv").write_text("1,only,two\n")
    with pytest.raises(ConfigError, match="expected 4 fields"):
        read_pg19_metadata(tmp_path)


def test_pg19_missing_split_directory_is_named(tmp_path: Path) -> None:
    make_pg19(tmp_path)
    for f in (tmp_path / "test").iterdir():
        f.unlink()
    (tmp_path / "test").rmdir()
    with pytest.raises(ConfigError) as e:
        read_documents(DataConfig(format="pg19", path=str(tmp_path)), "test")
    assert str(e.value) == f"data.path: PG-19 directory {tmp_path} has no test/ subdirectory; add {tmp_path / 'test'}"


def test_wikitext_training_file_is_never_also_served_as_an_evaluation_split(tmp_path):
    from compressive_transformer.core.config import ConfigError, DataConfig
    from compressive_transformer.data import read_documents

    for name in ("wiki.valid.tokens", "wiki.test.tokens"):
        (tmp_path / name).write_text(" = A = \n\n a b c \n")
    cfg = DataConfig(format="wikitext", path=str(tmp_path), tokenizer="words", train_file="wiki.valid.tokens")
    assert read_documents(cfg, "train") and read_documents(cfg, "test")
    with pytest.raises(ConfigError, match="^data.train_file: wiki.valid.tokens is the training text"):
        read_documents(cfg, "validation")
