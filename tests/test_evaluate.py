"""Streaming evaluation: every target of the split exactly once, memory carried, lengths overridable, results
independent of how the split is divided into streams."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from compressive_transformer.core.config import ConfigError, DataConfig, ModelConfig
from compressive_transformer.core.models import CompressiveTransformerLM
from compressive_transformer.data import build_tokenizer, load_corpus, read_documents
from compressive_transformer.inference.evaluate import evaluate
from compressive_transformer.inference.workflows import evaluate_run
from compressive_transformer.runs.presets import TINY_TOML
from compressive_transformer.runs.rundir import config_from_text
from compressive_transformer.training.workflows import train_run

torch.set_num_threads(1)
TEXTS = {
    "train": ["the cat sat on the mat. " * 20, "a dog ran in the park and sat down. " * 15],
    "validation": ["the cat ran to the dog. " * 6, "short one", "mat and park and cat, " * 9],
    "test": ["the end. " * 10],
}


@pytest.fixture()
def corpus_dir(tmp_path: Path) -> Path:
    for split, docs in TEXTS.items():
        (tmp_path / "corpus" / split).mkdir(parents=True)
        for i, doc in enumerate(docs):
            (tmp_path / "corpus" / split / f"{i}.txt").write_text(doc)
    return tmp_path / "corpus"


def _setup(corpus_dir: Path, tmp_path: Path):
    data = DataConfig(format="text", path=str(corpus_dir), tokenizer="bytes")
    tok = build_tokenizer(data, read_documents(data, "train"))
    corpus = load_corpus(data, "validation", tok, tmp_path / "cache")
    torch.manual_seed(0)
    cfg = ModelConfig.from_raw(
        dict(
            vocab_size=tok.vocab_size,
            d_model=32,
            n_layers=2,
            n_heads=2,
            d_ff=64,
            seg_len=8,
            mem_len=8,
            cmem_len=4,
            compression_rate=2,
            dropout=0.1,
        )
    )
    return CompressiveTransformerLM(cfg), corpus


def test_every_target_once_and_independent_of_the_number_of_streams(corpus_dir: Path, tmp_path: Path) -> None:
    model, corpus = _setup(corpus_dir, tmp_path)
    model.train()
    one = evaluate(model, corpus, batch_size=1, seg_len=8)
    three = evaluate(model, corpus, batch_size=3, seg_len=8)
    assert model.training  # restored
    assert one.tokens == three.tokens == corpus.num_tokens - corpus.num_docs  # a document's last token has no target
    assert one.complete and three.complete
    assert one.loss == pytest.approx(three.loss, rel=1e-5)  # each document starts from empty memory in its own row
    assert one.bits_per_token == pytest.approx(one.loss / math.log(2))
    assert one.ppl == pytest.approx(math.exp(one.loss))
    chars = sum(len(d) for d in TEXTS["validation"])  # ASCII: characters = bytes
    assert (one.words, one.chars, one.bytes) == (corpus.num_words, chars, chars)
    assert one.bits_per_char == pytest.approx(one.loss * one.tokens / chars / math.log(2))
    assert one.bits_per_byte == one.bits_per_char
    assert one.word_ppl is None  # a byte-level run has no word-level perplexity
    with pytest.warns(DeprecationWarning):
        assert one.bpc == one.bits_per_token


def test_memory_is_carried_across_segments(corpus_dir: Path, tmp_path: Path) -> None:
    model, corpus = _setup(corpus_dir, tmp_path)
    with_memory = evaluate(model, corpus, batch_size=2, seg_len=8)
    without = evaluate(model, corpus, batch_size=2, seg_len=8, mem_len=0, cmem_len=0)
    assert with_memory.tokens == without.tokens
    assert with_memory.loss != pytest.approx(without.loss, rel=1e-6)


def test_lengths_can_differ_from_training(corpus_dir: Path, tmp_path: Path) -> None:
    model, corpus = _setup(corpus_dir, tmp_path)
    longer = evaluate(model, corpus, batch_size=2, seg_len=16, mem_len=32, cmem_len=16)
    short = evaluate(model, corpus, batch_size=2, seg_len=8)
    assert (longer.seg_len, longer.mem_len, longer.cmem_len) == (16, 32, 16)
    assert longer.tokens == short.tokens and longer.segments < short.segments
    assert math.isfinite(longer.loss)


def test_partial_evaluation_reports_no_word_perplexity(corpus_dir: Path, tmp_path: Path) -> None:
    model, corpus = _setup(corpus_dir, tmp_path)
    part = evaluate(model, corpus, batch_size=1, seg_len=8, max_batches=3)
    assert part.segments == 3 and not part.complete and part.word_ppl is None and part.tokens <= 24
    assert part.bits_per_char is None and part.bits_per_byte is None  # their denominators are the whole split's


def test_evaluate_run_writes_eval_json_with_overrides(tmp_path: Path) -> None:
    cfg = config_from_text(TINY_TOML, ["train.steps=2", "train.progress=false", "train.val_batches=1"])
    run = tmp_path / "run"
    train_run(cfg, run, log=lambda s: None)
    result = evaluate_run(
        run, split="test", overrides=["eval.mem_len=32", "eval.seg_len=32", "eval.batch_size=4"], progress=False
    )
    saved = json.loads((run / "eval_test.json").read_text())
    assert saved["split"] == "test" and saved["mem_len"] == 32 and saved["seg_len"] == 32 and saved["complete"]
    assert saved["bits_per_char"] == pytest.approx(result.bits_per_char) and saved["checkpoint"].endswith(
        "step-00000002"
    )
    assert saved["step"] == 2 and saved["source"] == {"kind": "split", "format": "pydoc", "path": "", "split": "test"}
    for key in (
        "loss",
        "bits_per_token",
        "bits_per_char",
        "bits_per_byte",
        "ppl",
        "word_ppl",
        "tokens",
        "chars",
        "bytes",
        "words",
        "cmem_len",
    ):
        assert key in saved
    with pytest.raises(ConfigError, match="only eval"):
        evaluate_run(run, overrides=["model.mem_len=32"])
