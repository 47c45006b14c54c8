"""The real corpora ($CT_TEST_DATA, default ../shared/data); every test skips with the reason when they are absent."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import TEST_DATA, missing_data_reason

from compressive_transformer.core.config import ConfigError, DataConfig
from compressive_transformer.data import (
    SPLITS,
    ByteTokenizer,
    StreamBatcher,
    build_tokenizer,
    load_corpus,
    read_documents,
    read_pg19_metadata,
    read_split,
)

DATA = TEST_DATA
ENWIK8 = DATA / "enwik8" / "enwik8-prefix"
WT103 = DATA / "wikitext-103"
WT2 = DATA / "wikitext-2"
PG19 = DATA / "pg19-sample"


def need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(missing_data_reason(path))
    return path


def test_enwik8_prefix_split_is_proportional(tmp_path: Path) -> None:
    path = need(ENWIK8)
    cfg = DataConfig(format="enwik8", path=str(path))
    with pytest.warns(UserWarning, match=r"4,154,399 bytes.*enwik8 prefix"):
        parts = {s: read_documents(cfg, s)[0] for s in SPLITS}
    n = path.stat().st_size
    assert [len(parts[s]) for s in SPLITS] == [round(0.9 * n), round(0.95 * n) - round(0.9 * n), n - round(0.95 * n)]
    assert parts["train"].startswith(b"<mediawiki")  # type: ignore[arg-type]
    with pytest.warns(UserWarning):
        corpus = load_corpus(cfg, "validation", ByteTokenizer(), tmp_path)
    assert corpus.num_docs == 1 and corpus.num_tokens == len(parts["validation"]) and corpus.tokens.dtype == np.uint8
    assert bytes(np.asarray(corpus.tokens, dtype=np.uint8)) == parts["validation"]
    batches = list(StreamBatcher(corpus, batch_size=8, seg_len=512))
    assert sum(b.num_targets for b in batches) == corpus.num_tokens - 1, "every byte but the first is predicted once"


def test_wikitext103_valid_with_eos_unk_and_vocabulary(tmp_path: Path) -> None:
    root = need(WT103)
    valid = read_split(DataConfig(format="wikitext", path=str(root), tokenizer="words"), "validation")
    cfg = DataConfig(format="wikitext", path=str(root), tokenizer="words", train_file="wiki.valid.tokens")
    words = valid.documents[0].split()  # type: ignore[union-attr]
    assert valid.num_words == len(words) == 217_646, "the published WikiText-103 validation token count"
    assert valid.num_articles == 60
    assert words[:5] == ["<eos>", "=", "Homarus", "gammarus", "="] and "<unk>" in words
    tok = build_tokenizer(cfg, read_documents(cfg, "train"))
    assert tok.vocab_size == len(set(words)), "vocabulary from the train split (here the valid file, by override)"
    assert tok.vocab[:3] == ["the", ",", "."] and "<unk>" in tok.vocab and "<eos>" in tok.vocab
    test = load_corpus(cfg, "test", tok, tmp_path)
    assert test.num_tokens == test.num_words == 245_569, "one id per word, <eos> included"
    unk_rate = float(np.mean(np.asarray(test.tokens) == tok.vocab.index("<unk>")))
    assert 0.02 < unk_rate < 0.2, "test words unseen in valid become <unk>"
    with pytest.raises(ConfigError, match="train_file = 'wiki.valid.tokens'"):
        read_documents(DataConfig(format="wikitext", path=str(root), tokenizer="words"), "train")


def test_wikitext2_has_more_unk_than_wikitext103() -> None:
    wt2 = read_documents(DataConfig(format="wikitext", path=str(need(WT2)), tokenizer="words"), "validation")[0]
    wt103 = read_documents(DataConfig(format="wikitext", path=str(need(WT103)), tokenizer="words"), "validation")[0]
    assert len(wt2.split()) == len(wt103.split())  # type: ignore[union-attr]
    assert wt2.split().count("<unk>") > wt103.split().count("<unk>")  # type: ignore[union-attr]


def test_pg19_sample_books_metadata_and_words() -> None:
    root = need(PG19)
    cfg = DataConfig(format="pg19", path=str(root))
    splits = {s: read_split(cfg, s) for s in SPLITS}
    assert [len(splits[s].documents) for s in SPLITS] == [7, 2, 2]
    for s in SPLITS:
        files = sorted((root / s).glob("*.txt"))
        assert splits[s].num_words == sum(len(f.read_text(encoding="utf-8").split()) for f in files)
        assert sorted(splits[s].names) == sorted(f.stem for f in files)
    meta = read_pg19_metadata(root)
    assert len(meta) == 11 and set(meta) == {n for s in SPLITS for n in splits[s].names}
    assert meta["1342"].title == "Pride and Prejudice" and meta["1342"].year == 1813
    assert meta["84"].title == "Frankenstein; Or, The Modern Prometheus", "quoted titles with commas"


def test_pg19_with_a_small_bpe(tmp_path: Path) -> None:
    root = need(PG19)
    cfg = DataConfig(format="pg19", path=str(root), tokenizer="bpe", vocab_size=1000)
    train = read_documents(cfg, "train")
    tok = build_tokenizer(cfg, [d[:30_000] for d in train])  # ~200 KB keeps the test fast
    corpus = load_corpus(cfg, "test", tok, tmp_path)
    assert corpus.num_docs == 2 and corpus.names == ["11", "219"]
    assert tok.decode(corpus.document(0).tolist()) == (root / "test" / "11.txt").read_text(encoding="utf-8")
    assert corpus.num_tokens < 0.5 * sum(len(d) for d in read_documents(cfg, "test"))
    batcher = StreamBatcher(corpus, batch_size=2, seg_len=256)
    first = next(batcher)
    assert first.reset.tolist() == [True, True] and first.input_mask.all()


def copy_tree(src: Path, dst: Path, skip: str) -> None:
    for p in src.rglob("*"):
        rel = p.relative_to(src)
        if rel.parts[0] == skip:
            continue
        if p.is_dir():
            (dst / rel).mkdir(parents=True, exist_ok=True)
        else:
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            (dst / rel).symlink_to(p)


def bad_inputs(tmp_path: Path) -> dict[str, tuple[object, str]]:
    (tmp_path / "empty").mkdir()
    for s in SPLITS:
        (tmp_path / "empty" / s).mkdir()
        (tmp_path / "empty" / s / "0.txt").write_text("")
    copy_tree(need(PG19), tmp_path / "pg19", skip="test")
    return {
        "missing file": (DataConfig(format="enwik8", path=str(DATA / "enwik8" / "no-such-file")), "does not exist"),
        "empty corpus": (DataConfig(format="text", path=str(tmp_path / "empty")), "is empty (0 tokens)"),
        "binary to words": (
            DataConfig(format="text", path=sys.executable, tokenizer="words"),
            "set tokenizer = 'bytes'",
        ),
        "missing pg19 split": (DataConfig(format="pg19", path=str(tmp_path / "pg19")), "has no test/ subdirectory"),
    }


@pytest.mark.parametrize(
    "case", ["missing file", "empty corpus", "binary to words", "missing pg19 split", "unknown format"]
)
def test_bad_inputs_are_one_line_config_errors(tmp_path: Path, case: str) -> None:
    if case == "unknown format":
        with pytest.raises(ConfigError) as e:
            DataConfig(format="pg20", path=str(DATA))
        assert str(e.value).startswith("data.format: unknown 'pg20'; use one of") and "\n" not in str(e.value)
        return
    cfg, expected = bad_inputs(tmp_path)[case]
    with pytest.raises(ConfigError) as e:
        load_corpus(cfg, "test", ByteTokenizer(), tmp_path / "cache")  # type: ignore[arg-type]
    assert expected in str(e.value) and "\n" not in str(e.value)
