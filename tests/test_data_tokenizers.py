"""Tokenizers: round trips, vocabulary order, save/load identity, the errors a user can cause."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compressive_transformer.core.config import ConfigError, DataConfig
from compressive_transformer.data import (
    ByteTokenizer,
    SubwordTokenizer,
    Tokenizer,
    WordTokenizer,
    build_tokenizer,
    load_tokenizer,
    prepare_tokenizer,
    read_documents,
)
from compressive_transformer.data.tokenizers import iter_chunks

TRAIN = [
    "the cat sat on the mat\nthe dog sat on the log\n" * 20,
    "a quick brown fox jumps over the lazy dog; naïve café, 日本語 text\n" * 20,
]


@given(st.text(max_size=200))
@settings(max_examples=30, deadline=None)
def test_bytes_round_trip_any_text(text: str) -> None:
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert all(0 <= i < 256 for i in ids) and tok.decode(ids) == text
    assert tok.encode_array(text).tolist() == ids


def test_bytes_tokenizer_takes_raw_bytes_and_decodes_with_replacement(tmp_path: Path) -> None:
    tok = ByteTokenizer()
    assert tok.encode(b"\xff\x00a") == [255, 0, 97]
    assert tok.decode([255, 97]) == "\ufffda"
    tok.save(tmp_path)
    loaded = load_tokenizer(tmp_path)
    assert isinstance(loaded, ByteTokenizer) and loaded.fingerprint == tok.fingerprint and isinstance(loaded, Tokenizer)


def test_word_vocabulary_is_ordered_by_frequency_then_alphabet() -> None:
    tok = WordTokenizer.train(["b a c a b a <eos> d", "d"], min_freq=1)
    assert tok.vocab == ["a", "b", "d", "<eos>", "c", "<unk>"], "<unk> never seen: count 0, so last"
    assert tok.encode("a zebra c") == [0, tok.unk_id, 4]
    rare = WordTokenizer.train(["x x x y z"], min_freq=2)
    assert rare.vocab == ["x", "<unk>"] and rare.counts == [3, 2], "<unk> absorbs the words min_freq dropped"
    assert rare.encode("y x") == [1, 0]


def test_word_decode_puts_lines_back_after_eos(tmp_path: Path) -> None:
    tok = WordTokenizer.train(["hello world <eos>\nbye <eos>"])
    ids = tok.encode("hello world <eos>\nbye <eos>")
    assert tok.decode(ids) == "hello world <eos>\nbye <eos>\n"
    tok.save(tmp_path)
    loaded = load_tokenizer(tmp_path)
    assert isinstance(loaded, WordTokenizer) and loaded.vocab == tok.vocab and loaded.fingerprint == tok.fingerprint
    assert json.loads((tmp_path / "tokenizer.json").read_text())["kind"] == "words"


def test_word_tokenizer_rejects_binary_documents() -> None:
    with pytest.raises(ConfigError, match="set tokenizer = 'bytes'") as e:
        build_tokenizer(DataConfig(tokenizer="words"), [b"\xff\xfe\x00binary"])
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="needs text to learn from"):
        build_tokenizer(DataConfig(tokenizer="words"), ["", ""])


@pytest.mark.parametrize("kind", ["bpe", "unigram"])
def test_subword_round_trip_and_exact_reload(tmp_path: Path, kind: str) -> None:
    tok = build_tokenizer(DataConfig(tokenizer=kind, vocab_size=300), TRAIN)
    assert isinstance(tok, SubwordTokenizer) and tok.kind == kind
    assert 256 <= tok.vocab_size <= 300
    for text in ("the cat sat", "unseen ☃ \x00 words\n\n  spaced", TRAIN[1][:100]):
        assert tok.decode(tok.encode(text)) == text, "byte-level: any text round-trips"
    path = tok.save(tmp_path)
    assert path == tmp_path / "tokenizer.json"
    loaded = load_tokenizer(tmp_path)
    assert loaded.kind == kind and loaded.fingerprint == tok.fingerprint
    probe = TRAIN[0] + TRAIN[1] + "zebra ☃"
    assert loaded.encode(probe) == tok.encode(probe)
    assert len(tok.encode("the cat sat on the mat")) < len("the cat sat on the mat"), "merges learned"


def test_subword_encoding_of_long_text_is_chunk_consistent() -> None:
    tok = build_tokenizer(DataConfig(tokenizer="bpe", vocab_size=300), TRAIN)
    text = "".join(f"line {i} the cat\n" for i in range(2000))
    chunks = list(iter_chunks(text, 1000))
    assert "".join(chunks) == text and all(c.endswith("\n") for c in chunks)
    assert tok.decode(tok.encode(text)) == text
    assert tok.encode_array(text).tolist() == tok.encode(text)


def test_load_tokenizer_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text('{"kind": "mystery"}')
    with pytest.raises(ConfigError, match="not a tokenizer this library wrote"):
        load_tokenizer(tmp_path)


def test_prepare_tokenizer_builds_once_then_reuses(tmp_path: Path) -> None:
    cfg = DataConfig(tokenizer="words")
    tok = prepare_tokenizer(cfg, tmp_path)
    assert (tmp_path / "tokenizer.json").is_file()
    assert tok.vocab_size == len(WordTokenizer.train(read_documents(cfg, "train")).vocab)
    again = prepare_tokenizer(cfg, tmp_path, train_documents=["something else entirely"])
    assert again.fingerprint == tok.fingerprint, "a saved tokenizer is reused, not retrained"
    with pytest.raises(ConfigError, match="holds a 'words' tokenizer but the config asks for 'bpe'"):
        prepare_tokenizer(DataConfig(tokenizer="bpe"), tmp_path)
