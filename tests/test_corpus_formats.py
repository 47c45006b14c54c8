"""The corpus-format table is the one extension point for data: a format registered from outside the package is
valid in DataConfig, read by the readers and the token cache, and its sources are downloadable names."""

from __future__ import annotations

from pathlib import Path

import pytest

from compressive_transformer.core.config import ConfigError, DataConfig
from compressive_transformer.core.registry import FORMATS, CorpusFormat
from compressive_transformer.data import (
    RawSplit,
    Source,
    build_tokenizer,
    count_words,
    load_corpus,
    read_documents,
    sources,
)
from compressive_transformer.data.formats import path_formats, register_format


def _files(cfg: DataConfig, split: str) -> list[Path]:
    return [Path(cfg.path) / f"{split}.lines"]


def _read(cfg: DataConfig, split: str) -> RawSplit:
    (path,) = _files(cfg, split)
    docs = [line for line in path.read_text().splitlines() if line]
    return RawSplit(split, docs, [f"{split}-{i}" for i in range(len(docs))], sum(map(count_words, docs)), (path,))


@pytest.fixture
def lines_format():
    source = Source(url="http://example.invalid", filename="lines.zip")
    fmt = CorpusFormat(
        "lines",
        _files,
        _read,
        sources={"lines-demo": source},
        tokenizers=("bytes", "words"),
        tokenizer_reason="lines are short",
    )
    register_format(fmt)
    yield fmt
    del FORMATS["lines"]


def test_a_registered_format_reads_and_caches(lines_format, tmp_path: Path) -> None:
    for split in ("train", "validation", "test"):
        (tmp_path / f"{split}.lines").write_text(f"one {split} doc\n\nanother {split} doc\n")
    cfg = DataConfig(format="lines", path=str(tmp_path))
    assert read_documents(cfg, "validation") == ["one validation doc", "another validation doc"]
    tok = build_tokenizer(cfg, read_documents(cfg, "train"))
    corpus = load_corpus(cfg, "test", tok, tmp_path / "cache")
    assert corpus.num_docs == 2
    assert "lines" in path_formats() and "pydoc" not in path_formats()
    assert "lines-demo" in sources()


def test_validation_reads_the_flags(lines_format) -> None:
    with pytest.raises(ConfigError, match="needs the file or directory"):
        DataConfig(format="lines")
    with pytest.raises(ConfigError, match="lines are short; set tokenizer = 'bytes' or 'words'"):
        DataConfig(format="lines", path="x", tokenizer="bpe")
    with pytest.raises(ConfigError, match="only the wikitext format has a train_file"):
        DataConfig(format="lines", path="x", train_file="y")
    with pytest.raises(ConfigError, match="lines"):
        DataConfig(format="nope", path="x")
