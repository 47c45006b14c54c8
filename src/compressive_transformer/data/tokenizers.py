"""Tokenizers behind one protocol: bytes, words, and byte-level BPE / unigram trained with HuggingFace ``tokenizers``.

No tokenizer reserves special tokens: documents are separated by memory resets in the stream iterator, not by
markers. (``<unk>`` / ``<eos>`` of the word tokenizer are ordinary words of WikiText.) Every tokenizer saves itself
as ``tokenizer.json`` and :func:`load_tokenizer` restores it exactly (same ids for the same text).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Iterable, Protocol, Sequence, runtime_checkable

import numpy as np

from compressive_transformer.core.config import ConfigError, DataConfig
from compressive_transformer.core.fileio import write_text_atomic
from compressive_transformer.data.documents import CHUNK_CHARS, Document, iter_chunks, rechunk, utf8_of
from compressive_transformer.data.readers import EOS, UNK
from compressive_transformer.data.word_ids import word_ids

TOKENIZER_FILE = "tokenizer.json"
SAMPLE_FILE = "tokenizer_sample.json"  # beside tokenizer.json: the part of the train split it was trained on
# A subword trainer reads its text in line-aligned chunks of about this many characters: the library's per-sequence
# cost grows with a sequence's length (50 MB of PG-19 text, a 32K BPE on 2 cores: 14 CPU s in 4 KB chunks or in lines,
# as `train(files)` reads them; 21 s in 16 KB chunks, 28 s in 64 KB ones)
TRAIN_CHUNK = 1 << 12


@runtime_checkable
class Tokenizer(Protocol):
    kind: str

    @property
    def vocab_size(self) -> int: ...

    @property
    def fingerprint(self) -> str:
        """A hash of everything that decides the ids; the token cache is reused only when it matches."""
        ...

    def encode(self, text: Document) -> list[int]: ...

    def encode_array(self, text: Document) -> np.ndarray:
        """``encode`` as a 1-D int64 array."""
        ...

    def encode_pieces(self, pieces: Sequence[Document]) -> list[np.ndarray]:
        """The ids of each piece of a document (:mod:`~compressive_transformer.data.documents`), on every core where
        the tokenizer can: the token cache's path. Concatenated, a document's pieces give ``encode_array`` of it."""
        ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def save(self, directory: str | Path) -> Path: ...


def as_text(document: Document, kind: str) -> str:
    if isinstance(document, str):
        return document
    try:
        return document.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"data.tokenizer: the corpus is binary or not UTF-8 (byte {e.start}); the {kind!r} tokenizer needs text, "
            "set tokenizer = 'bytes'"
        ) from None


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class ByteTokenizer:
    """UTF-8 bytes, vocabulary 256: any input round-trips, nothing to train."""

    sample: dict | None = None
    kind = "bytes"
    vocab_size = 256
    fingerprint = _sha("bytes-v1")

    def encode(self, text: Document) -> list[int]:
        return list(text.encode("utf-8") if isinstance(text, str) else text)

    def encode_array(self, text: Document) -> np.ndarray:
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        return np.frombuffer(data, dtype=np.uint8).astype(np.int64)

    def encode_pieces(self, pieces: Sequence[Document]) -> list[np.ndarray]:
        return [np.frombuffer(utf8_of(p), dtype=np.uint8) for p in pieces]  # uint8 ids: the cache writes its dtype

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")

    def save(self, directory: str | Path) -> Path:
        return write_text_atomic(Path(directory) / TOKENIZER_FILE, json.dumps({"kind": "bytes"}))


class WordTokenizer:
    """Whitespace-separated words; ids ordered by train frequency, then alphabetically. Unknown words -> ``<unk>``,
    whose count also absorbs the words dropped by ``min_freq`` (so ids stay frequency ranks)."""

    kind = "words"
    sample: dict | None = None  # what it was trained on (data/sample.py), saved beside it

    def __init__(self, vocab: Sequence[str], counts: Sequence[int] | None = None) -> None:
        self.vocab = list(vocab)
        self.counts = list(counts) if counts is not None else [0] * len(self.vocab)
        if UNK not in self.vocab:
            raise ValueError(f"a word vocabulary must contain {UNK}")
        self._index = {w: i for i, w in enumerate(self.vocab)}
        if len(self._index) != len(self.vocab):
            raise ValueError("word vocabulary has duplicates")
        self.unk_id = self._index[UNK]
        self.fingerprint = _sha("words-v1\n" + "\n".join(self.vocab))

    @classmethod
    def train(cls, documents: Iterable[Document], *, min_freq: int = 1) -> WordTokenizer:
        counts: Counter[str] = Counter()
        for doc in documents:
            for chunk in iter_chunks(as_text(doc, cls.kind), CHUNK_CHARS):
                counts.update(chunk.split())  # Counter counts an iterable in C
        kept = {w: c for w, c in counts.items() if c >= min_freq}
        kept[UNK] = kept.get(UNK, 0) + sum(c for w, c in counts.items() if c < min_freq)
        order = sorted(kept.items(), key=lambda wc: (-wc[1], wc[0]))
        return cls([w for w, _ in order], [c for _, c in order])

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode(self, text: Document) -> list[int]:
        return self.encode_array(text).tolist()

    def encode_array(self, text: Document) -> np.ndarray:
        parts = self.encode_pieces(list(rechunk([as_text(text, self.kind)])))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def encode_pieces(self, pieces: Sequence[Document]) -> list[np.ndarray]:
        return word_ids([as_text(p, self.kind) for p in pieces], self._index, self.unk_id)

    def decode(self, ids: Sequence[int]) -> str:
        """Words joined by spaces; a newline follows each ``<eos>`` (WikiText's line ends)."""
        out: list[str] = []
        for i in ids:
            w = self.vocab[int(i)]
            out.append(w + ("\n" if w == EOS else " "))
        return "".join(out).rstrip(" ")

    def save(self, directory: str | Path) -> Path:
        payload = {"kind": "words", "vocab": self.vocab, "counts": self.counts}
        save_sample(self, directory)
        return write_text_atomic(Path(directory) / TOKENIZER_FILE, json.dumps(payload, ensure_ascii=False))


class SubwordTokenizer:
    """Byte-level BPE or unigram from HuggingFace ``tokenizers``: every text round-trips, no unknown symbol."""

    sample: dict | None = None  # what it was trained on (data/sample.py), saved beside it

    def __init__(self, hf_tokenizer: "object", kind: str) -> None:
        self._tok = hf_tokenizer
        self.kind = kind
        self.fingerprint = _sha("subword-v2\n" + hf_tokenizer.to_str())  # type: ignore[attr-defined]

    @classmethod
    def train(cls, documents: Iterable[Document], *, kind: str, vocab_size: int) -> SubwordTokenizer:
        """Trained on whole documents, each read in :data:`TRAIN_CHUNK` pieces."""
        chunks = (c for doc in documents for c in iter_chunks(as_text(doc, kind), TRAIN_CHUNK))
        return cls.train_chunks(chunks, kind=kind, vocab_size=vocab_size)

    @classmethod
    def train_chunks(cls, chunks: Iterable[str], *, kind: str, vocab_size: int) -> SubwordTokenizer:
        """Trained on text given in pieces, each one sequence for the trainer (a stream of documents gives them as
        :func:`~compressive_transformer.data.documents.rechunk` cuts them at :data:`TRAIN_CHUNK`)."""
        # Hugging Face tokenizers: loaded only where a subword tokenizer is trained or read (a byte run never needs it)
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import decoders, models, pre_tokenizers, trainers

        alphabet = pre_tokenizers.ByteLevel.alphabet()
        progress = False  # the caller shows the bytes read; the library's own bar counts sequences
        if kind == "bpe":
            tok = HFTokenizer(models.BPE())
            trainer = trainers.BpeTrainer(
                vocab_size=vocab_size, initial_alphabet=alphabet, show_progress=progress, special_tokens=[]
            )
        elif kind == "unigram":
            tok = HFTokenizer(models.Unigram())
            trainer = trainers.UnigramTrainer(
                vocab_size=vocab_size, initial_alphabet=alphabet, show_progress=progress, special_tokens=[]
            )
        else:
            raise ConfigError(f"data.tokenizer: {kind!r} is not a subword tokenizer; use 'bpe' or 'unigram'")
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()

        tok.train_from_iterator(chunks, trainer)
        # Re-read the serialized form: unigram scores do not survive a JSON round trip bit for bit, and the saved
        # file must be the tokenizer we use (same ids, same fingerprint after load_tokenizer).
        return cls(HFTokenizer.from_str(tok.to_str()), kind)

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size())  # type: ignore[attr-defined]

    def encode(self, text: Document) -> list[int]:
        """Line-aligned chunks encoded independently (bounded memory), so the ids do not depend on the caller."""
        return self.encode_array(text).tolist()

    def encode_array(self, text: Document) -> np.ndarray:
        parts = self.encode_pieces(list(rechunk([as_text(text, self.kind)])))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def encode_pieces(self, pieces: Sequence[Document]) -> list[np.ndarray]:
        texts = [as_text(p, self.kind) for p in pieces]
        encodings = self._tok.encode_batch(texts, add_special_tokens=False)  # type: ignore[attr-defined]
        return [np.array(enc.ids, dtype=np.int64) for enc in encodings]

    def encode_with_offsets(self, text: Document) -> tuple[list[int], list[tuple[int, int]]]:
        """The ids of :meth:`encode` and each token's (start, end) character span in ``text`` (to map tokens back
        to the words they belong to, e.g. for perplexity by word frequency)."""
        ids: list[int] = []
        spans: list[tuple[int, int]] = []
        base = 0
        chunks = list(rechunk([as_text(text, self.kind)]))
        for chunk, enc in zip(chunks, self._tok.encode_batch(chunks, add_special_tokens=False)):  # type: ignore[attr-defined]
            ids.extend(enc.ids)
            spans.extend((base + a, base + b) for a, b in enc.offsets)
            base += len(chunk)
        return ids, spans

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode([int(i) for i in ids])  # type: ignore[attr-defined]

    def save(self, directory: str | Path) -> Path:
        save_sample(self, directory)
        return write_text_atomic(Path(directory) / TOKENIZER_FILE, self._tok.to_str())  # type: ignore[attr-defined]


def save_sample(tokenizer: Tokenizer, directory: str | Path) -> None:
    """The record of what a trained tokenizer learnt from (:mod:`~compressive_transformer.data.sample`), beside it."""
    if getattr(tokenizer, "sample", None) is not None:
        write_text_atomic(Path(directory) / SAMPLE_FILE, json.dumps(tokenizer.sample))  # type: ignore[attr-defined]


def _with_sample(tokenizer: Tokenizer, path: Path) -> Tokenizer:
    """``tokenizer`` with the sample record saved beside its file, where there is one."""
    try:
        record = json.loads((path.parent / SAMPLE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return tokenizer
    if isinstance(record, dict) and not isinstance(tokenizer, ByteTokenizer):
        tokenizer.sample = record  # type: ignore[misc]
    return tokenizer


def build_tokenizer(cfg: DataConfig, train_documents: Iterable[Document]) -> Tokenizer:
    """Create (bytes) or train (words, bpe, unigram) the tokenizer ``cfg`` asks for on the train documents."""
    if cfg.tokenizer == "bytes":
        return ByteTokenizer()
    if cfg.tokenizer == "pretrained":
        return load_pretrained(cfg.tokenizer_file)
    docs = list(train_documents)
    if not any(len(d) for d in docs):
        raise ConfigError(
            f"data.path: the train split is empty; the {cfg.tokenizer!r} tokenizer needs text to learn from"
        )
    if cfg.tokenizer == "words":
        return WordTokenizer.train(docs, min_freq=cfg.min_freq)
    return SubwordTokenizer.train(docs, kind=cfg.tokenizer, vocab_size=cfg.subword_vocab_size)


def load_tokenizer(directory: str | Path) -> Tokenizer:
    """Restore a tokenizer saved by ``save`` (a directory holding ``tokenizer.json``, or the file itself)."""
    path = Path(directory)
    if path.is_dir():
        path = path / TOKENIZER_FILE
    if not path.is_file():
        raise ConfigError(f"tokenizer: {path} does not exist; train one first (it is saved next to the run)")
    try:
        text = path.read_text(encoding="utf-8")
        obj = json.loads(text)
    except ValueError as e:  # not JSON, or not UTF-8 at all
        raise ConfigError(f"tokenizer: {path} is not valid JSON ({str(e)[:120]}); delete it to retrain") from None
    kind = obj.get("kind") if isinstance(obj, dict) else None
    if kind == "bytes":
        return ByteTokenizer()
    if kind == "words":
        vocab = obj.get("vocab")
        if not isinstance(vocab, list) or not all(isinstance(w, str) for w in vocab):
            raise ConfigError(f"tokenizer: {path} has no list of words (vocab); delete it to retrain")
        try:
            return _with_sample(WordTokenizer(vocab, obj.get("counts")), path)
        except (ValueError, TypeError) as e:
            raise ConfigError(
                f"tokenizer: {path} is not a word vocabulary this library reads ({e}); delete it"
            ) from None
    model = obj.get("model", {}).get("type", "") if isinstance(obj, dict) else ""
    if model:
        from tokenizers import Tokenizer as HFTokenizer  # loaded only for a subword tokenizer

        try:
            return _with_sample(SubwordTokenizer(HFTokenizer.from_str(text), model.lower()), path)
        except Exception as e:  # tokenizers raises a bare Exception for a file it cannot parse
            raise ConfigError(f"tokenizer: {path} is not a tokenizer.json the tokenizers library reads ({e})") from None
    raise ConfigError(f"tokenizer: {path} is not a tokenizer this library wrote; delete it to retrain")


def load_pretrained(path: str | Path) -> SubwordTokenizer:
    """A user's HuggingFace ``tokenizer.json`` (any model type; special tokens are never added to the text)."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(f"data.tokenizer_file: {file} does not exist; point it at a tokenizer.json")
    tok = load_tokenizer(file)
    if not isinstance(tok, SubwordTokenizer):
        raise ConfigError(
            f"data.tokenizer_file: {file} is not a HuggingFace tokenizers file; use a tokenizer.json saved by tokenizers"
        )
    return tok
