"""A split as a stream of documents, each read in pieces: what lets a corpus of any size be tokenized in bounded memory.

A format's ``stream(cfg, split)`` returns a :class:`SplitStream`: the split's documents as :class:`DocumentSource`
descriptors (a name, the bytes on disk, a function that reads it), none of them read yet. Reading a document yields
:class:`Piece` s whose texts concatenate to the document; they end just after a newline and hold at least
:data:`CHUNK_CHARS` characters (the last one ends with the document), so they are exactly the chunks
:func:`iter_chunks` cuts a whole document into, and the ids of a subword tokenizer, which encodes chunk by chunk, do
not depend on how the document was read. A line longer than :data:`MAX_PIECE_CHARS` is the one exception: it is cut
at a space between two words (which keeps the ids of a byte-level BPE), or anywhere when it has none.

Documents are ``str`` except where the text is not UTF-8 (or holds a NUL) and the byte tokenizer reads it, where
they are ``bytes``: which one is decided for the whole document, from a first pass over a large file, as
:func:`~compressive_transformer.data.readers.decode` decides it for a file read whole.
"""

from __future__ import annotations

import codecs
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Iterable, Iterator, TypeVar

import numpy as np

from compressive_transformer.core.config import ConfigError

Document = str | bytes
CHUNK_CHARS = 1 << 20  # documents are encoded in line-aligned chunks of at least this many characters
MAX_PIECE_CHARS = 16 * CHUNK_CHARS  # a piece without a newline is cut here (see the module docstring)
READ_BLOCK = 4 << 20  # bytes read from a file at a time
WHOLE_FILE = READ_BLOCK  # files up to this size are read in one go; larger ones in blocks, in two passes
T = TypeVar("T", str, bytes)


@dataclass(frozen=True, slots=True)
class Piece:
    """A run of a document's text: ``consumed`` source bytes were read to make it (progress), ``articles``: WikiText
    articles that start in it."""

    text: Document
    consumed: int = 0
    articles: int = 0
    raw: bytes | None = None  # the text's UTF-8 bytes, where the reader has them (not encoded again)

    def utf8(self) -> bytes:
        """The piece's UTF-8 bytes (its bytes themselves for a bytes piece)."""
        return self.raw if self.raw is not None else utf8_of(self.text)


@dataclass(frozen=True)
class DocumentSource:
    """One document of a split, not yet read. ``size``: its bytes on disk (progress, sampling); ``files``: what it
    is read from (their size and mtime fingerprint it); ``read()`` yields its pieces."""

    name: str
    size: int
    files: tuple[Path, ...]
    read: Callable[[], Iterator[Piece]]


@dataclass(frozen=True)
class SplitStream:
    """The documents of one split, in order, and the files they are read from."""

    split: str
    documents: list[DocumentSource]
    sources: tuple[Path, ...]
    notes: Callable[[], list[str]] = list  # what to say once every document has been read (stereo files mixed down)

    @property
    def total_bytes(self) -> int:
        return sum(d.size for d in self.documents)


def iter_chunks(text: T, size: int = CHUNK_CHARS) -> Iterator[T]:
    """Consecutive pieces of ``text`` of at least ``size`` characters, each ending just after a newline (the last
    piece ends where the text does); pieces concatenate back to ``text``."""
    newline = b"\n" if isinstance(text, bytes) else "\n"
    start, n = 0, len(text)
    while start < n:
        nl = text.find(newline, start + size)  # type: ignore[arg-type]
        end = n if nl < 0 else nl + 1
        yield text[start:end]
        start = end


def rechunk(blocks: Iterable[T], size: int = CHUNK_CHARS, cap: int = MAX_PIECE_CHARS) -> Iterator[T]:
    """The :func:`iter_chunks` pieces of the concatenation of ``blocks``, holding about ``size`` characters plus
    one block in memory (``cap`` for a line without a newline: it is cut there, see the module docstring)."""
    buf: T | None = None
    start = 0
    for block in blocks:
        if not block:
            continue
        buf = block if buf is None or start >= len(buf) else buf[start:] + block
        start = 0
        while (cut := _next_cut(buf, start, size, cap, final=False)) is not None:
            yield buf[start:cut]
            start = cut
    while buf is not None and start < len(buf):
        cut = _next_cut(buf, start, size, cap, final=True)
        assert cut is not None
        yield buf[start:cut]
        start = cut


def _next_cut(buf: T, start: int, size: int, cap: int, *, final: bool) -> int | None:
    """The end of the chunk that starts at ``start``: just after the first newline at least ``size`` characters
    in, if that comes within ``cap``; else inside the line at ``cap``; None when not decided before more is read."""
    newline = b"\n" if isinstance(buf, bytes) else "\n"
    n = len(buf) - start
    if n <= size:
        return len(buf) if final and n > 0 else None
    nl = buf.find(newline, start + size, start + cap)  # type: ignore[arg-type]
    if nl >= 0:
        return nl + 1
    if n > cap:
        return start + _cut_in_line(buf[start : start + cap + 1], cap)
    return len(buf) if final else None


def _cut_in_line(text: T, cap: int) -> int:
    """Where to cut a line longer than ``cap``: before the last space in it that follows a non-space and precedes a
    non-space (a byte-level BPE's pre-tokenizer starts a word there in any case), else at ``cap``."""
    space = b" " if isinstance(text, bytes) else " "
    i = text.rfind(space, 1, cap)  # type: ignore[arg-type]
    while i > 0:
        if not text[i - 1 : i].isspace() and i + 1 < len(text) and not text[i + 1 : i + 2].isspace():
            return i
        i = text.rfind(space, 1, i)  # type: ignore[arg-type]
    return cap


# ---------------------------------------------------------------------------------------------------------------
# reading files in pieces


@dataclass(frozen=True)
class FileScan:
    """What a first pass over bytes ``[lo, hi)`` of a file learnt: whether they are text (UTF-8 without NUL; else the
    first offending byte), and their characters with a checkpoint ``(byte, char)`` per block, to find a character's
    byte offset later without decoding everything again."""

    path: Path
    lo: int
    hi: int
    bad: int | None  # absolute offset of the first NUL or invalid UTF-8 byte, None for text
    chars: int
    marks: tuple[tuple[int, int], ...]  # (absolute byte offset, chars before it), ascending


def scan_file(path: Path, lo: int = 0, hi: int | None = None, *, block: int | None = None) -> FileScan:
    """One streaming pass: text or not (the first NUL, else the first byte that is not UTF-8, as
    :func:`~compressive_transformer.data.readers.decode` reports it), and characters (bytes when it is not text)."""
    hi = path.stat().st_size if hi is None else hi
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    nul = invalid = None
    chars, marks = 0, []
    with path.open("rb") as f:
        f.seek(lo)
        pos = lo
        for data in read_blocks(f, hi - lo, block=block or READ_BLOCK):
            if nul is None and (i := data.find(b"\x00")) >= 0:
                nul = pos + i
            if invalid is None:
                pending = len(decoder.getstate()[0])
                marks.append((pos - pending, chars))  # a character starts there, after `chars` of them
                try:
                    chars += len(decoder.decode(data, final=False))
                except UnicodeDecodeError as e:
                    invalid = pos - pending + e.start
            pos += len(data)
        if invalid is None:
            pending = len(decoder.getstate()[0])
            try:
                decoder.decode(b"", final=True)
            except UnicodeDecodeError as e:
                invalid = pos - pending + e.start
    bad = nul if nul is not None else invalid
    if bad is not None:
        return FileScan(path, lo, hi, bad, hi - lo, ())
    return FileScan(path, lo, hi, None, chars, tuple(marks))


def byte_of_char(scan: FileScan, char: int) -> int:
    """The absolute byte offset at which character ``char`` (counted from ``scan.lo``) starts."""
    if scan.bad is not None:
        return scan.lo + char
    marks = list(scan.marks) or [(scan.lo, 0)]
    i = max(j for j, (_, before) in enumerate(marks) if before <= char)
    start, before = marks[i]
    end = marks[i + 1][0] if i + 1 < len(marks) else scan.hi
    with scan.path.open("rb") as f:
        f.seek(start)
        data = f.read(min(end + 4, scan.hi) - start)  # the block, and the rest of a character it ends inside
    text = data.decode("utf-8", errors="ignore")
    return start + len(text[: char - before].encode("utf-8"))


def find_byte(path: Path, needle: bytes, start: int, hi: int) -> int:
    """The absolute offset of the first ``needle`` byte in ``[start, hi)`` of the file, or -1."""
    with path.open("rb") as f:
        f.seek(start)
        pos = start
        while pos < hi:
            data = f.read(min(READ_BLOCK, hi - pos))
            if not data:
                break
            i = data.find(needle)
            if i >= 0:
                return pos + i
            pos += len(data)
    return -1


def read_blocks(f: BinaryIO, n: int | None, *, block: int | None = None) -> Iterator[bytes]:
    """``n`` bytes (all, for None) of an open binary file from where it stands, a block at a time."""
    block = block or READ_BLOCK
    left = n
    while left is None or left > 0:
        data = f.read(block if left is None else min(block, left))
        if not data:
            return
        if left is not None:
            left -= len(data)
        yield data


def decoded_pieces(blocks: Iterable[bytes], as_text: bool) -> Iterator[Piece]:
    """The pieces of a document read as ``blocks`` of bytes: UTF-8 text decoded (the caller has checked it is text),
    else the bytes themselves."""
    consumed = [0]

    def texts() -> Iterator[Document]:
        decoder = codecs.getincrementaldecoder("utf-8")("strict")
        for data in blocks:
            consumed[0] += len(data)
            yield decoder.decode(data) if as_text else data
        if as_text:
            yield decoder.decode(b"", final=True)

    done = 0
    for text in rechunk(texts()):
        yield Piece(text, consumed[0] - done)
        done = consumed[0]


def file_pieces(
    path: Path, tokenizer: str, error: Callable[[Path, int], ConfigError], lo: int = 0, hi: int | None = None
) -> Iterator[Piece]:
    """Bytes ``[lo, hi)`` of a file as one document's pieces: text when they are UTF-8 without a NUL, else bytes for
    the byte tokenizer; for any other tokenizer ``error(path, offset)`` is raised."""
    hi = path.stat().st_size if hi is None else hi
    if hi - lo <= WHOLE_FILE:
        with path.open("rb") as f:
            f.seek(lo)
            data = f.read(hi - lo)
        text, bad = decoded(data)
        if text is None and tokenizer != "bytes":
            raise error(path, lo + (bad or 0))
        doc: Document = data if text is None else text
        for i, piece in enumerate(rechunk([doc])):
            whole = i == 0 and len(piece) == len(doc)  # the usual case (a document under a chunk): its bytes are read
            yield Piece(piece, len(data) if i == 0 else 0, raw=data if whole else None)
        return
    scan = scan_file(path, lo, hi)
    if scan.bad is not None and tokenizer != "bytes":
        raise error(path, scan.bad)
    with path.open("rb") as f:
        f.seek(lo)
        yield from decoded_pieces(read_blocks(f, hi - lo), scan.bad is None)


def first_bad(data: bytes) -> int | None:
    """The offset of the first NUL, else of the first byte that is not UTF-8; None when ``data`` is text."""
    return decoded(data)[1]


def decoded(data: bytes) -> tuple[str | None, int | None]:
    """``data`` decoded when it is text (UTF-8 without a NUL), else None and the offset of the first NUL or of the
    first byte that is not UTF-8: one decode, whichever it is."""
    nul = data.find(b"\x00")
    if nul >= 0:
        return None, nul
    try:
        return data.decode("utf-8"), None
    except UnicodeDecodeError as e:
        return None, e.start


# ---------------------------------------------------------------------------------------------------------------
# counting what the units divide by, piece by piece


_STR_SPACE = np.zeros(256, dtype=bool)
_STR_SPACE[[9, 10, 11, 12, 13, 28, 29, 30, 31, 32]] = True  # str.split()'s whitespace among ASCII characters
# str.split()'s whitespace beyond ASCII; a text without any is counted over its UTF-8 bytes, whose non-ASCII bytes
# all belong to characters that are not whitespace
_WIDE_SPACE = [c.encode("utf-8") for c in map(chr, range(128, 0x3001)) if c.isspace()]
_WIDE_LEADS = (min(w[0] for w in _WIDE_SPACE), max(w[0] for w in _WIDE_SPACE))  # 0xc2 and 0xe3


def _wide_pairs() -> np.ndarray:
    """By a character's first two bytes: 1 when they are a whitespace character, 2 when they may start one."""
    table = np.zeros(1 << 16, dtype=np.uint8)
    for w in _WIDE_SPACE:
        table[w[0] << 8 | w[1]] = 1 if len(w) == 2 else 2
    return table


_WIDE_PAIRS = _wide_pairs()
_WIDE_TRIPLES = np.array(sorted(w[0] << 16 | w[1] << 8 | w[2] for w in _WIDE_SPACE if len(w) == 3), dtype=np.int64)
_BYTES_SPACE = np.zeros(256, dtype=bool)
_BYTES_SPACE[[9, 10, 11, 12, 13, 32]] = True  # bytes.split()'s whitespace


def utf8_of(text: Document) -> bytes:
    return text.encode("utf-8") if isinstance(text, str) else text


class TextCounter:
    """Characters, UTF-8 bytes and whitespace words of a document fed piece by piece: the same numbers as
    :func:`~compressive_transformer.data.units.text_size` of the whole document (bytes that are not UTF-8 count
    one character each, as enwik8 is scored), words counted once where a piece boundary falls inside one."""

    def __init__(self) -> None:
        self.chars = self.bytes = self.words = 0
        self._in_word = False
        self._raw_chars = 0  # for bytes documents: characters if the whole turns out to be UTF-8
        self._decoder: codecs.IncrementalDecoder | None = None
        self._utf8 = True

    def add(self, text: Document, raw: bytes) -> None:
        """Count ``text`` (its UTF-8 bytes ``raw``, the same object for a bytes piece)."""
        if not text:
            return
        self.bytes += len(raw)
        if isinstance(text, str):
            self.chars += len(text)
            if text.isascii() or not has_wide_space(raw):  # its whitespace is ASCII: count over its bytes
                words, first, last = _words_of(raw, _STR_SPACE)
            else:
                words = len(text.split())
                first, last = not text[0].isspace(), not text[-1].isspace()
        else:
            self._add_bytes(text)
            words, first, last = _words_of(text, _BYTES_SPACE)
        self.words += words - (1 if self._in_word and first else 0)
        self._in_word = last

    def _add_bytes(self, data: bytes) -> None:
        if self._decoder is None:
            self._decoder = codecs.getincrementaldecoder("utf-8")("strict")
        if self._utf8:
            try:
                self._decoder.decode(data)
            except UnicodeDecodeError:
                self._utf8 = False
        arr = np.frombuffer(data, dtype=np.uint8)
        self._raw_chars += int(np.count_nonzero((arr & 0xC0) != 0x80))

    def finish(self) -> tuple[int, int, int]:
        """(characters, bytes, words) of the document."""
        if self._decoder is not None:
            if self._utf8:
                try:
                    self._decoder.decode(b"", final=True)
                except UnicodeDecodeError:
                    self._utf8 = False
            self.chars += self._raw_chars if self._utf8 else self.bytes
        return self.chars, self.bytes, self.words


def has_wide_space(raw: bytes) -> bool:
    """Whether UTF-8 text holds a whitespace character beyond ASCII (as ``str.isspace`` has them): its bytes
    searched for their encodings from the few places one could start, by table, at memory speed (a regular
    expression over the decoded text runs at a tenth of it)."""
    arr = np.frombuffer(raw, dtype=np.uint8)
    lo, hi = _WIDE_LEADS
    at = np.flatnonzero((arr - np.uint8(lo)) <= np.uint8(hi - lo))  # lead bytes from the first to the last
    if not len(at):
        return False
    last = len(arr) - 1  # a character cut off by the end reads the lead again, which never completes a match
    pairs = arr[at].astype(np.int64) << 8 | arr[np.minimum(at + 1, last)]
    kind = _WIDE_PAIRS[pairs]
    if (kind == 1).any():
        return True
    maybe = np.flatnonzero(kind == 2)
    if not len(maybe):
        return False
    triples = pairs[maybe] << 8 | arr[np.minimum(at[maybe] + 2, last)]
    return bool(np.isin(triples, _WIDE_TRIPLES).any())


def _words_of(raw: bytes, space: np.ndarray) -> tuple[int, bool, bool]:
    """Words of ASCII or byte text by a whitespace table, and whether it starts and ends inside a word."""
    arr = np.frombuffer(raw, dtype=np.uint8)
    # every whitespace byte is <= 32; when no other byte <= 32 is present (text rarely holds control characters),
    # that comparison is the table, at memory speed; else the table is looked up byte by byte
    others = np.flatnonzero(~space[:33])  # the bytes <= 32 that are not whitespace: 0-8 and 14-27 (or 14-31)
    runs = [(int(a), int(b)) for a, b in _runs(others)]
    clean = not any(np.count_nonzero((arr - np.uint8(a)) <= np.uint8(b - a)) for a, b in runs)
    ws = arr <= 32 if clean else space[arr]
    starts = int(np.count_nonzero(ws[:-1] & ~ws[1:])) + (0 if ws[0] else 1)
    return starts, not bool(ws[0]), not bool(ws[-1])


def _runs(values: np.ndarray) -> list[tuple[int, int]]:
    """Sorted integers as (first, last) runs of consecutive values."""
    runs: list[tuple[int, int]] = []
    for v in values.tolist():
        if runs and runs[-1][1] == v - 1:
            runs[-1] = (runs[-1][0], v)
        else:
            runs.append((v, v))
    return runs


class content_hash:  # noqa: N801 - used as hashlib's constructors are
    """The fingerprint of a shard's text: CRC-32 (zlib), at the speed of the disk where a cryptographic hash is not
    (it tells a changed corpus from an unchanged one, which is all it is for)."""

    def __init__(self) -> None:
        self.value = 0

    def update(self, data: bytes) -> None:
        self.value = zlib.crc32(data, self.value)

    def hexdigest(self) -> str:
        return f"{self.value:08x}"


__all__ = [
    "CHUNK_CHARS",
    "Document",
    "DocumentSource",
    "FileScan",
    "Piece",
    "SplitStream",
    "TextCounter",
    "byte_of_char",
    "content_hash",
    "decoded_pieces",
    "file_pieces",
    "find_byte",
    "has_wide_space",
    "iter_chunks",
    "read_blocks",
    "rechunk",
    "scan_file",
    "utf8_of",
]
