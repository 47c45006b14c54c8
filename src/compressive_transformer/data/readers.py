"""Reading a corpus: a split's documents through its format's entry (the formats themselves, one module each, are in
:mod:`compressive_transformer.data.corpora`), plus the counts metrics need and what the formats share.

A split is read as a stream (:func:`stream_split`, documents read piece by piece: what the token cache builds
from, in memory that does not grow with the corpus) or whole (:func:`read_split`, a :class:`RawSplit`: for small
corpora and analyses). Documents are ``str`` except where the text is not UTF-8 and the byte
tokenizer is in use (enwik8 always, a binary ``text`` file), where they are ``bytes``. ``num_words`` is the number
of whitespace-separated words of the split: PG-19 divides the total log-likelihood by it whatever the tokenizer.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence, TypeVar

from compressive_transformer.core.config import ConfigError, DataConfig
from compressive_transformer.core.registry import corpus_format
from compressive_transformer.data.documents import (
    Document,
    DocumentSource,
    FileDocuments,
    FileList,
    Piece,
    SplitStream,
    TextCounter,
    file_pieces,
    rechunk,
    utf8_of,
)

S = TypeVar("S", bound=Sequence)
SPLITS = ("train", "validation", "test")
SPLIT_FRACTIONS = (0.90, 0.05, 0.05)
EOS = "<eos>"
UNK = "<unk>"


@dataclass(frozen=True)
class RawSplit:
    """The documents of one split, in order, with where they came from and how many words they hold."""

    split: str
    documents: list[Document]
    names: list[str]  # one per document: topic key, file stem, book id, or the split name
    num_words: int
    sources: tuple[Path, ...]
    num_articles: int = 0  # wikitext: articles counted by their top-level " = Title = " lines


def count_words(document: Document) -> int:
    """Whitespace-separated words (the PG-19 normaliser); bytes split on ASCII whitespace."""
    return len(document.split())


def check_split(split: str) -> str:
    if split not in SPLITS:
        raise ConfigError(f"split {split!r}: unknown split; use one of {', '.join(SPLITS)}")
    return split


def read_split(cfg: DataConfig, split: str) -> RawSplit:
    """Read one split of the corpus ``cfg`` describes; user mistakes raise a one-line :class:`ConfigError`."""
    check_split(split)
    raw = corpus_format(cfg.format).read(cfg, split)
    if not raw.documents:
        raise ConfigError(
            f"data.path: the {split} split of {_where(cfg)} has no documents; point data.path at a non-empty corpus"
        )
    return raw


def stream_split(cfg: DataConfig, split: str) -> SplitStream:
    """One split as a stream of documents not yet read (a format without ``stream`` is read whole, then streamed);
    user mistakes raise a one-line :class:`ConfigError`."""
    check_split(split)
    fmt = corpus_format(cfg.format)
    if fmt.stream is None:
        raw = read_split(cfg, split)
        docs = [memory_document(name, doc, raw.sources) for doc, name in zip(raw.documents, raw.names)]
        return SplitStream(split, docs, raw.sources)
    stream = fmt.stream(cfg, split)
    if not stream.documents:
        raise ConfigError(
            f"data.path: the {split} split of {_where(cfg)} has no documents; point data.path at a non-empty corpus"
        )
    return stream


def materialize(stream: SplitStream) -> RawSplit:
    """A stream read whole: what :func:`read_split` returns for a format that streams."""
    docs, words, articles = [], 0, 0
    for source in stream.documents:
        counter, parts = TextCounter(), []
        for piece in source.read():
            counter.add_piece(piece)
            articles += piece.articles
            parts.append(piece.text)
        words += counter.finish()[2]
        doc = parts[0][:0].join(parts) if parts else ""
        docs.append(doc.decode("utf-8") if counter.is_text and isinstance(doc, bytes) else doc)
    for note in stream.notes():
        print(note, file=sys.stderr)
    return RawSplit(stream.split, docs, [d.name for d in stream.documents], words, stream.sources, articles)


def memory_document(name: str, doc: Document, files: tuple[Path, ...] = ()) -> DocumentSource:
    """A document already in memory (small built-in corpora, a user format without ``stream``)."""
    return DocumentSource(name, len(utf8_of(doc)), tuple(files), lambda: _memory_pieces(doc))


def _memory_pieces(doc: Document) -> Iterator[Piece]:
    for i, text in enumerate(rechunk([doc])):
        yield Piece(text, len(utf8_of(doc)) if i == 0 else 0)


def file_documents(files: FileList, cfg: DataConfig) -> FileDocuments:
    """Each file as one document named by its stem, read in pieces (text, or bytes where only the byte tokenizer
    reads it), made when it is reached."""
    tokenizer, error = cfg.tokenizer, not_text(cfg)
    return FileDocuments(
        files, lambda path: file_pieces(path, tokenizer, error), lambda name: os.path.splitext(name)[0]
    )


def not_text(cfg: DataConfig) -> Callable[[Path, int], ConfigError]:
    """The error for a corpus file a word or subword tokenizer cannot read (binary, or not UTF-8 at ``offset``)."""

    def error(path: Path, offset: int) -> ConfigError:
        return ConfigError(
            f"data.tokenizer: {path} is binary or not UTF-8 (byte {offset}); the {cfg.tokenizer!r} tokenizer needs "
            "text, set tokenizer = 'bytes'"
        )

    return error


def read_documents(cfg: DataConfig, split: str) -> list[Document]:
    """The raw documents of one split (text, or bytes for enwik8 and non-UTF-8 files under the byte tokenizer)."""
    return read_split(cfg, split).documents


def source_files(cfg: DataConfig, split: str) -> FileList:
    """The files a split is read from, without reading them, with their size and mtime (the token cache's
    fingerprint of the corpus)."""
    check_split(split)
    files = corpus_format(cfg.format).files(cfg, split)
    return files if isinstance(files, FileList) else FileList.of(files)


def empty_split(cfg: DataConfig, split: str) -> str | None:
    """Why ``split`` certainly holds no text, told from its files' sizes without reading them (a split of empty
    files); None when it has some, or when that cannot be told so cheaply."""
    try:
        files = source_files(cfg, split)
    except ConfigError as e:
        return str(e)
    if len(files) and (files.sizes == 0).all():
        return f"its {len(files)} file(s) are empty, e.g. {files[0]}"
    return None


def by_fraction(items: S, split: str) -> S:
    """Deterministic 90/5/5 split of a list by count, at least one item in each split."""
    n = len(items)
    if n < 3:
        return items if split == "train" else items[:0]  # type: ignore[return-value]
    n_val = max(1, round(n * SPLIT_FRACTIONS[1]))
    n_test = max(1, round(n * SPLIT_FRACTIONS[2]))
    n_train = n - n_val - n_test
    bounds = {"train": (0, n_train), "validation": (n_train, n_train + n_val), "test": (n_train + n_val, n)}
    lo, hi = bounds[split]
    return items[lo:hi]


def split_directory(root: Path, split: str, list_files: Callable[[Path], FileList], kind: str) -> FileList:
    """The files of ``split`` in directory ``root``: those of its ``split/`` subdirectory when it has train/
    validation/ test/, else a 90/5/5 split by count of all of them (``list_files`` finds them; ``kind`` names them).
    What every directory-of-files format (text, audio) shares."""
    split_dirs = _split_dirs(root)
    if split_dirs:
        return list_files(split_dirs[split])
    everything = list_files(root)
    if len(everything) < 3:
        raise ConfigError(
            f"data.path: {root} holds {len(everything)} {kind} file(s); a directory needs at least 3 (one per split) "
            "or train/ validation/ test/ subdirectories"
        )
    return by_fraction(everything, split)


def _split_dirs(root: Path) -> dict[str, Path] | None:
    """``train/ validation/ test/`` (``valid/`` accepted) when the directory has them, else None."""
    found = {s: root / s for s in SPLITS if (root / s).is_dir()}
    if "validation" not in found and (root / "valid").is_dir():
        found["validation"] = root / "valid"
    if not found:
        return None
    missing = [s for s in SPLITS if s not in found]
    if missing:
        raise ConfigError(f"data.path: {root} has split subdirectories but no {missing[0]}/; add {root / missing[0]}")
    return found


def decode_file(path: str | Path, tokenizer: str) -> Document:
    """A whole file to score with a trained run's tokenizer: UTF-8 text, or raw bytes for the byte tokenizer when
    it is not text (Latin-1, say); a word or subword tokenizer reads UTF-8 only, which the file must then be
    converted to (the run's tokenizer cannot change)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: is not a file; give a text file")
    try:
        return _decode_bytes(path.read_bytes(), tokenizer)
    except NotText as e:
        raise not_utf8_error(path, e.offset, tokenizer) from None


def not_utf8_error(path: Path, offset: int, tokenizer: str) -> ConfigError:
    """A file to score that a trained run's word or subword tokenizer cannot read."""
    return ConfigError(
        f"{path}: is not UTF-8 text (byte {offset}), and this run's {tokenizer!r} tokenizer reads UTF-8 only; "
        f"convert it (e.g. iconv -f latin1 -t utf-8 {path} > {path.stem}-utf8{path.suffix}) or score it with a "
        "byte-level run"
    )


def decode(data: bytes, path: Path, cfg: DataConfig) -> Document:
    """A corpus file for training: binary data or another encoding than UTF-8 needs the byte tokenizer."""
    try:
        return _decode_bytes(data, cfg.tokenizer)
    except NotText as e:
        raise not_text(cfg)(path, e.offset) from None


class NotText(ValueError):
    """Bytes a word or subword tokenizer cannot read: binary, or not UTF-8 (``offset``: the first such byte)."""

    def __init__(self, offset: int) -> None:
        super().__init__(f"not UTF-8 text at byte {offset}")
        self.offset = offset


def _decode_bytes(data: bytes, tokenizer: str) -> Document:
    """UTF-8 text, or the raw bytes when only the byte tokenizer will see them; :class:`NotText` otherwise."""
    bad = data.find(b"\x00")  # NUL never occurs in text, though it is valid UTF-8
    if bad < 0:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            bad = e.start
    if tokenizer == "bytes":
        return data
    raise NotText(bad)


# ---------------------------------------------------------------------------------------------------------------


DATA_ROOT_ENV = "CT_DATA_ROOT"


def data_root_path(path: str) -> str:
    """``data/<corpus>`` (a relative path under ``data``, where ``data download`` puts corpora) read from
    ``$CT_DATA_ROOT/<corpus>`` when that variable is set; any other path unchanged."""
    root = os.environ.get(DATA_ROOT_ENV)
    parts = Path(path).parts if path else ()
    if root and parts and parts[0] == "data" and not Path(path).is_absolute():
        return str(Path(root).expanduser().joinpath(*parts[1:]))
    return path


def existing_path(cfg: DataConfig) -> Path:
    path = Path(data_root_path(cfg.path)).expanduser()
    if not path.exists():
        if not corpus_format(cfg.format).sources:  # a user's own files: nothing to download
            if data_root_path(cfg.path) != cfg.path:
                where = f" (a data.path under data/ is read from {DATA_ROOT_ENV}={os.environ[DATA_ROOT_ENV]})"
            else:
                where = "" if path.is_absolute() else f" (a relative path starts at {Path.cwd()})"
            raise ConfigError(f"data.path: {path} does not exist{where}; point it at your {cfg.format} files")
        hint = (
            f"`compressive-transformer data download` fills data/, or set {DATA_ROOT_ENV} to the directory holding it"
        )
        raise ConfigError(f"data.path: {path} does not exist; point it at the {cfg.format} corpus ({hint})")
    return path


def _where(cfg: DataConfig) -> str:
    return f"{cfg.format} corpus {cfg.path}" if corpus_format(cfg.format).needs_path else f"the {cfg.format} corpus"
