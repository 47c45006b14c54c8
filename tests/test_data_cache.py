"""The memory-mapped token cache: contents, reuse, invalidation, atomicity, errors."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from compressive_transformer.core.config import ConfigError, DataConfig
from compressive_transformer.data import (
    ByteTokenizer,
    StreamBatcher,
    WordTokenizer,
    cache_dir_for,
    load_corpus,
    load_tokenizer,
    prepare_corpora,
    read_split,
)
from compressive_transformer.data import cache as cache_module


def make_dir_corpus(root: Path) -> DataConfig:
    docs = {"train": ["one two three", "", "four five"], "validation": ["six"], "test": ["seven eight"]}
    for split, texts in docs.items():
        (root / split).mkdir(parents=True)
        for i, text in enumerate(texts):
            (root / split / f"{i}.txt").write_text(text, encoding="utf-8")
    return DataConfig(format="text", path=str(root), tokenizer="words")


def test_corpus_holds_documents_offsets_and_counts(tmp_path: Path) -> None:
    cfg = make_dir_corpus(tmp_path / "data")
    tok = WordTokenizer.train(read_split(cfg, "train").documents)
    corpus = load_corpus(cfg, "train", tok, tmp_path / "cache")
    assert isinstance(corpus.tokens, np.memmap) and corpus.tokens.dtype == np.uint8  # 6 words: one byte per id
    assert corpus.num_docs == 2, "the empty document is dropped (it would only add a reset)"
    assert corpus.doc_offsets.dtype == np.int64 and corpus.doc_offsets.tolist() == [0, 3, 5]
    assert corpus.num_tokens == 5 and corpus.num_words == 5 and corpus.names == ["0", "2"]
    assert tok.decode(corpus.document(1)) == "four five" and tok.decode(corpus.document(-2)) == "one two three"
    with pytest.raises(IndexError):
        corpus.document(2)
    batch = next(StreamBatcher(corpus, batch_size=2, seg_len=4))
    assert batch.tokens[1, :2].tolist() == tok.encode("four five")


def test_the_corpus_a_build_returns_is_the_one_the_cache_opens_later(tmp_path: Path) -> None:
    """The build hands back its corpus without reading its JSON again: the same meta, tokens and offsets as the
    cache gives the next run."""
    cfg = make_dir_corpus(tmp_path / "data")
    tok = WordTokenizer.train(read_split(cfg, "train").documents)
    built = load_corpus(cfg, "train", tok, tmp_path / "cache")
    opened = load_corpus(cfg, "train", tok, tmp_path / "cache")
    assert built.summary and not opened.summary, "the second call opened the cache"
    assert built.meta == opened.meta == json.loads(json.dumps(built.meta))
    assert built.tokens.tolist() == opened.tokens.tolist() and built.doc_offsets.tolist() == opened.doc_offsets.tolist()
    assert (built.split, built.num_words, built.tokens.dtype) == (opened.split, opened.num_words, opened.tokens.dtype)


def test_cache_is_reused_then_rebuilt_when_source_or_tokenizer_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = make_dir_corpus(tmp_path / "data")
    tok = WordTokenizer.train(read_split(cfg, "train").documents)
    builds: list[str] = []
    real_build = cache_module._build
    monkeypatch.setattr(cache_module, "_build", lambda *a: (builds.append(a[1]), real_build(*a))[1])
    load_corpus(cfg, "test", tok, tmp_path / "cache")
    load_corpus(cfg, "test", tok, tmp_path / "cache")
    assert builds == ["test"], "second load reads the cache"
    meta = json.loads(next((tmp_path / "cache").glob("text-test-*.json")).read_text())
    assert meta["num_tokens"] == 2 and meta["num_words"] == 2 and meta["key"]["tokenizer"] == tok.fingerprint
    sources = meta["key"]["sources"]
    assert sources["files"] == 1 and sources["bytes"] == len("seven eight"), "the source files, counted and summed"
    assert len(sources["sha256"]) == 64, "their paths, sizes and mtimes hashed"

    test_file = tmp_path / "data" / "test" / "0.txt"
    test_file.write_text("seven eight nine", encoding="utf-8")
    corpus = load_corpus(cfg, "test", tok, tmp_path / "cache")
    assert builds == ["test", "test"] and corpus.num_tokens == 3, "a changed source file invalidates the cache"

    corpus = load_corpus(cfg, "test", ByteTokenizer(), tmp_path / "cache")
    assert builds == ["test", "test", "test"] and corpus.num_tokens == len("seven eight nine")


def test_processes_sharing_a_cache_build_each_split_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two loads of one split racing on one cache directory (a study's parallel runs): the second waits for the first
    build and reads it. Unlocked, it rebuilt the split and deleted the first loader's fresh index under it."""
    cfg = make_dir_corpus(tmp_path / "data")
    tok = WordTokenizer.train(read_split(cfg, "train").documents)
    builds: list[str] = []
    building = threading.Event()
    real_build = cache_module._build

    def slow_build(*args: object) -> cache_module.Corpus:
        builds.append(args[1])
        building.set()
        time.sleep(0.3)  # the other loader arrives while this build is under way
        return real_build(*args)

    monkeypatch.setattr(cache_module, "_build", slow_build)
    results: dict[str, object] = {}

    def load(name: str) -> None:
        results[name] = load_corpus(cfg, "train", tok, tmp_path / "cache")

    first = threading.Thread(target=load, args=("first",))
    first.start()
    assert building.wait(5)
    load("second")
    first.join()
    assert builds == ["train"]
    assert results["first"].num_tokens == results["second"].num_tokens == 5


def test_interrupted_build_leaves_no_valid_looking_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = make_dir_corpus(tmp_path / "data")
    tok = WordTokenizer.train(read_split(cfg, "train").documents)
    load_corpus(cfg, "train", tok, tmp_path / "cache")  # a valid cache for the old tokenizer

    class Boom(RuntimeError):
        pass

    def exploding(pieces: object) -> list[np.ndarray]:
        raise Boom

    other = ByteTokenizer()
    monkeypatch.setattr(other, "encode_pieces", exploding)
    with pytest.raises(Boom):
        load_corpus(cfg, "train", other, tmp_path / "cache")
    leftovers = [p.name for p in (tmp_path / "cache").iterdir() if p.name.endswith(".tmp")]
    assert leftovers == [], "temp files are removed"
    monkeypatch.undo()
    corpus = load_corpus(cfg, "train", tok, tmp_path / "cache")  # the old cache is still consistent
    assert corpus.num_tokens == 5

    # crash after the new tokens replaced the old ones but before the offsets and JSON did
    real_replace = os.replace

    def crash_on_second(src: str, dst: str) -> None:
        if str(dst).endswith(".offsets.bin"):
            raise Boom
        real_replace(src, dst)

    monkeypatch.setattr(cache_module.os, "replace", crash_on_second)
    with pytest.raises(Boom):
        load_corpus(cfg, "train", ByteTokenizer(), tmp_path / "cache")
    monkeypatch.undo()
    assert not list((tmp_path / "cache").glob("*train*.json")), "no JSON: the half-written cache is not trusted"
    corpus = load_corpus(cfg, "train", tok, tmp_path / "cache")
    assert tok.decode(corpus.tokens) == "one two three four five"


def test_truncated_cache_file_is_rebuilt(tmp_path: Path) -> None:
    cfg = make_dir_corpus(tmp_path / "data")
    tok = ByteTokenizer()
    first = load_corpus(cfg, "train", tok, tmp_path / "cache")
    expected = np.array(first.tokens).tolist()
    del first
    tokens_file = next((tmp_path / "cache").glob("*train*.tokens.bin"))
    with open(tokens_file, "r+b") as f:
        f.truncate(3)
    again = load_corpus(cfg, "train", tok, tmp_path / "cache")
    assert np.array(again.tokens).tolist() == expected


def test_large_vocabulary_uses_int32() -> None:
    assert cache_module.token_dtype(256) == np.uint8 and cache_module.token_dtype(257) == np.uint16
    assert cache_module.token_dtype(65_536) == np.uint16
    assert cache_module.token_dtype(65_537) == np.int32


def test_empty_and_missing_corpora_are_one_line_errors(tmp_path: Path) -> None:
    cfg = make_dir_corpus(tmp_path / "data")
    (tmp_path / "data" / "validation" / "0.txt").write_text("   \n")
    with pytest.raises(ConfigError, match=r"validation split .* is empty \(0 tokens\)") as e:
        load_corpus(cfg, "validation", WordTokenizer(["<unk>"]), tmp_path / "cache")
    assert "\n" not in str(e.value)
    missing = DataConfig(format="text", path=str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match="does not exist"):
        load_corpus(missing, "train", ByteTokenizer(), tmp_path / "cache")
    assert not any(p.name.endswith(".tmp") for p in (tmp_path / "cache").iterdir())
    assert os.listdir(tmp_path / "cache") == [], "a failed build writes nothing"


def test_prepare_corpora_saves_the_tokenizer_in_the_run_and_caches_under_it(tmp_path: Path) -> None:
    cfg = make_dir_corpus(tmp_path / "data")
    run = tmp_path / "run"
    tok, corpora = prepare_corpora(cfg, run, splits=("train", "test"))
    assert set(corpora) == {"train", "test"} and corpora["test"].num_tokens == 2
    assert load_tokenizer(run).fingerprint == tok.fingerprint
    assert cache_dir_for(cfg, run) == run / ".cache" and any((run / ".cache").glob("*.tokens.bin"))
    elsewhere = DataConfig(format="text", path=cfg.path, tokenizer="words", cache_dir=str(tmp_path / "shared-cache"))
    assert cache_dir_for(elsewhere, run) == tmp_path / "shared-cache"
