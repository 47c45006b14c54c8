"""Training a tokenizer on a reproducible sample of the train split, read as a stream.

A corpus of many GB needs no more than a few hundred MB to learn a 32K subword vocabulary: ``data.tokenizer_sample``
bytes of train text (0: all of it) are drawn, with ``data.tokenizer_sample_seed``, from the whole split, never its
first documents. The unit drawn is a piece of a document (:mod:`~compressive_transformer.data.documents`): a whole
document where it is shorter than :data:`~compressive_transformer.data.documents.CHUNK_CHARS` (a book of PG-19, so
that document is never read unless drawn), else each of its pieces. Piece ``k`` of document ``d`` is drawn when a
hash of ``(seed, d, k)`` falls below ``sample / split bytes``: the draw depends on nothing but the split's layout and
the seed, and the sample is about ``sample`` bytes. What was drawn is recorded beside the tokenizer
(``tokenizer_sample.json``). When the sample covers the split, every document is read in order, as before sampling
existed: the same tokenizer.
"""

from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Iterator

from tqdm.auto import tqdm

from compressive_transformer.core.config import ConfigError, DataConfig
from compressive_transformer.data.documents import CHUNK_CHARS, Document, SplitStream, rechunk
from compressive_transformer.data.readers import stream_split
from compressive_transformer.data.tokenizers import (
    TOKENIZER_FILE,
    TRAIN_CHUNK,
    ByteTokenizer,
    SubwordTokenizer,
    Tokenizer,
    WordTokenizer,
    as_text,
    build_tokenizer,
    load_pretrained,
    load_tokenizer,
)

UNTRAINED = ("bytes", "pretrained")  # tokenizers that learn nothing from the corpus
_NO_STREAM = SplitStream("train", [], ())


def sample_rate(total_bytes: int, budget: int) -> float:
    """The share of the split's pieces to draw: 1 when the sample covers the split (or ``budget`` is 0)."""
    return 1.0 if budget <= 0 or budget >= total_bytes else budget / total_bytes


def drawn(seed: int, doc: int, piece: int, rate: float) -> bool:
    """Whether piece ``piece`` of document ``doc`` is in the sample (the rule of the module docstring)."""
    if rate >= 1.0:
        return True
    h = hashlib.blake2b(f"{seed}:{doc}:{piece}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") < rate * 2.0**64


class Sample:
    """The drawn text of a split, one document at a time; counts what it yields for the record."""

    def __init__(self, stream: SplitStream, budget: int, seed: int, *, progress: bool = True) -> None:
        self.stream, self.budget, self.seed = stream, budget, seed
        self.rate = sample_rate(stream.total_bytes, budget)
        self.bytes = self.pieces = 0
        self.names: list[str] = []
        self._progress = progress

    def documents(self) -> Iterator[Iterator[str | bytes]]:
        """For each document with a drawn piece, its drawn pieces' texts."""
        total = self.stream.total_bytes if self.rate >= 1.0 else min(self.budget, self.stream.total_bytes)
        bar = tqdm(
            total=total,
            unit="B",
            unit_scale=True,
            desc=f"tokenizer sample ({self.stream.split})",
            disable=_quiet(self._progress),
        )
        with bar:
            for d, doc in enumerate(self.stream.documents):
                if self.rate < 1.0 and doc.size <= CHUNK_CHARS and not drawn(self.seed, d, 0, self.rate):
                    continue  # a one-piece document not drawn is never read
                taken = self._drawn_pieces(d, doc.read(), bar)
                first = next(taken, None)
                if first is None:
                    continue
                self.names.append(doc.name)
                yield _chain(first, taken)

    def _drawn_pieces(self, d: int, pieces: Iterator[Any], bar: tqdm) -> Iterator[str | bytes]:
        for k, piece in enumerate(pieces):
            if piece.text and drawn(self.seed, d, k, self.rate):
                n = len(piece.utf8())
                self.bytes += n
                self.pieces += 1
                bar.update(n if self.rate < 1.0 else piece.consumed)
                yield piece.text
            elif self.rate >= 1.0:
                bar.update(piece.consumed)

    def record(self) -> dict[str, Any]:
        return {
            "split": self.stream.split,
            "seed": self.seed,
            "sample_bytes": self.budget,
            "split_bytes": self.stream.total_bytes,
            "rate": self.rate,
            "whole_split": self.rate >= 1.0,
            "bytes": self.bytes,
            "pieces": self.pieces,
            "documents": len(self.names),
            "names": self.names,
        }


def _chain(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield from rest


def _quiet(progress: bool) -> bool | None:
    return None if progress else True  # tqdm: None shows a bar only on a terminal


def train_tokenizer(cfg: DataConfig, stream: SplitStream, *, progress: bool = True) -> Tokenizer:
    """Create (bytes), load (pretrained) or train (words, bpe, unigram) the tokenizer ``cfg`` asks for on a sample of
    the train ``stream``; a trained one carries its sample's record (``tokenizer.sample``)."""
    if cfg.tokenizer == "bytes":
        return ByteTokenizer()
    if cfg.tokenizer == "pretrained":
        return load_pretrained(cfg.tokenizer_file)
    sample = Sample(stream, cfg.tokenizer_sample, cfg.tokenizer_sample_seed, progress=progress)
    start = time.perf_counter()
    tok: Tokenizer
    if cfg.tokenizer == "words":
        tok = WordTokenizer.train((piece for doc in sample.documents() for piece in doc), min_freq=cfg.min_freq)
    else:
        kind = cfg.tokenizer
        chunks = (as_text(c, kind) for doc in sample.documents() for c in rechunk(doc, TRAIN_CHUNK))
        tok = SubwordTokenizer.train_chunks(chunks, kind=kind, vocab_size=cfg.subword_vocab_size)
    if sample.bytes == 0 and sample.rate < 1.0:
        raise ConfigError(
            f"data.tokenizer_sample: {cfg.tokenizer_sample:,} bytes drew no text from the {stream.total_bytes:,} bytes of "
            "the train split; raise it (or 0 for all of it)"
        )
    if sample.bytes == 0:
        raise ConfigError(
            f"data.path: the train split is empty; the {cfg.tokenizer!r} tokenizer needs text to learn from"
        )
    record = sample.record() | {"seconds": round(time.perf_counter() - start, 3)}
    tok.sample = record  # type: ignore[union-attr]
    if record["rate"] < 1.0 and progress:
        print(
            f"tokenizer: trained on {record['bytes'] / 1e6:,.1f} MB drawn from {record['split_bytes'] / 1e6:,.1f} MB of "
            f"train text ({record['documents']:,} documents, data.tokenizer_sample = {cfg.tokenizer_sample:,}, "
            f"seed {cfg.tokenizer_sample_seed}); data.tokenizer_sample = 0 trains on all of it",
            file=sys.stderr,
        )
    return tok


def prepare_tokenizer(
    cfg: DataConfig, directory: str | Path, train_documents: Iterable[Document] | None = None
) -> Tokenizer:
    """The tokenizer saved in ``directory``, else one built (from ``train_documents``, or a sample of the streamed
    train split) and saved there."""
    path = Path(directory) / TOKENIZER_FILE
    if path.is_file():
        tok = load_tokenizer(path)
        if tok.kind != cfg.tokenizer and not (cfg.tokenizer == "pretrained" and isinstance(tok, SubwordTokenizer)):
            raise ConfigError(
                f"data.tokenizer: {path} holds a {tok.kind!r} tokenizer but the config asks for {cfg.tokenizer!r}; "
                "use a new run directory or delete the file"
            )
        return tok
    if train_documents is not None:
        tok = build_tokenizer(cfg, train_documents)
    else:
        tok = train_tokenizer(cfg, stream_split(cfg, "train") if cfg.tokenizer not in UNTRAINED else _NO_STREAM)
    tok.save(directory)
    return tok


__all__ = ["Sample", "drawn", "prepare_tokenizer", "sample_rate", "train_tokenizer"]
