"""A split as a stream of documents, each read in pieces: what lets a corpus of any size be tokenized in bounded memory.

A format's ``stream(cfg, split)`` returns a :class:`SplitStream`: the split's documents as :class:`DocumentSource`
descriptors (a name, the bytes on disk, a function that reads it), none of them read yet. Reading a document yields
:class:`Piece` s whose texts concatenate to the document; they end just after a newline and hold at least
:data:`CHUNK_CHARS` characters (the last one ends with the document), so they are exactly the chunks
:func:`iter_chunks` cuts a whole document into, and the ids of a subword tokenizer, which encodes chunk by chunk, do
not depend on how the document was read. A line longer than :data:`MAX_PIECE_CHARS` is the one exception: it is cut
at a space between two words (which keeps the ids of a byte-level BPE), or anywhere when it has none.

Documents are ``str`` except where the text is not UTF-8 (or holds a NUL) and the byte tokenizer reads it, where
they are ``bytes``: which one is decided for the whole document, as
:func:`~compressive_transformer.data.readers.decode` decides it for a file read whole. The byte tokenizer's ids are
the bytes themselves, so it is given a file's bytes as they are read, blocks of :data:`BYTE_BLOCK` cut at a
character (``Piece.undecided``): whether they count as text (characters, ``str.split`` words) or as bytes is known
once the document ends, and :class:`TextCounter` counts both ways until then. No text is decoded whole for it: its
memory is one block, whatever the size of the document.
"""

from __future__ import annotations

import codecs
import os
import zlib
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Iterator, Sequence, TypeVar, overload

import numpy as np

from compressive_transformer.core.config import ConfigError

Document = str | bytes
CHUNK_CHARS = 1 << 20  # documents are encoded in line-aligned chunks of at least this many characters
MAX_PIECE_CHARS = 16 * CHUNK_CHARS  # a piece without a newline is cut here (see the module docstring)
READ_BLOCK = 4 << 20  # bytes read from a file at a time
WHOLE_FILE = READ_BLOCK  # files up to this size are read in one go; larger ones in blocks, in two passes
BYTE_BLOCK = 1 << 20  # bytes of a file the byte tokenizer is given at a time
T = TypeVar("T", str, bytes)


@dataclass(frozen=True, slots=True)
class Piece:
    """A run of a document's text: ``consumed`` source bytes were read to make it (progress), ``articles``: WikiText
    articles that start in it."""

    text: Document
    consumed: int = 0
    articles: int = 0
    raw: bytes | None = None  # the text's UTF-8 bytes, where the reader has them (not encoded again)
    undecided: bool = False  # bytes that are the document's text if it all turns out UTF-8 without a NUL

    def utf8(self) -> bytes:
        """The piece's UTF-8 bytes (its bytes themselves for a bytes piece)."""
        return self.raw if self.raw is not None else utf8_of(self.text)


@dataclass(frozen=True, slots=True)
class DocumentSource:
    """One document of a split, not yet read. ``size``: its bytes on disk (progress, sampling); ``files``: what it
    is read from (their size and mtime fingerprint it); ``read()`` yields its pieces; ``stamps``: the (size,
    mtime_ns) of each file when it was listed, if it was (a build checks that they have not changed since)."""

    name: str
    size: int
    files: tuple[Path, ...]
    read: Callable[[], Iterator[Piece]]
    stamps: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class SplitStream:
    """The documents of one split, in order, and the files they are read from (a sequence: a split of a file per
    document holds them as a :class:`FileList` and makes each :class:`DocumentSource` as it is reached)."""

    split: str
    documents: Sequence[DocumentSource]
    sources: Sequence[Path]
    notes: Callable[[], list[str]] = list  # what to say once every document has been read (stereo files mixed down)

    @property
    def total_bytes(self) -> int:
        if isinstance(self.documents, FileDocuments):
            return int(np.maximum(self.documents.files.sizes, 0).sum())
        return sum(d.size for d in self.documents)


class FileList(Sequence[Path]):
    """Files with the size and modification time they had when listed, held as arrays and one string of names:
    about 40 bytes a file, where a list of ``Path`` objects with their ``stat`` costs about 1 KB (a split of PG-19
    lists 28,602 books, and a build's memory must not grow with the corpus). A file that could not be ``stat``-ed
    has size -1."""

    def __init__(
        self,
        folders: list[Path],
        folder: np.ndarray,
        names: str,
        cuts: np.ndarray,
        sizes: np.ndarray,
        mtimes: np.ndarray,
    ) -> None:
        self.folders = folders  # the distinct folders
        self.folder = folder  # (n,) uint32: each file's index into `folders`
        self._names = names  # every file name, concatenated
        self._cuts = cuts  # (n + 1,) int64: name i is _names[cuts[i]:cuts[i + 1]]
        self.sizes = sizes  # (n,) int64
        self.mtimes = mtimes  # (n,) int64, ns

    @classmethod
    def of(cls, paths: Iterable[Path]) -> FileList:
        """The given files in the given order, each ``stat``-ed now."""
        rows = []
        for p in paths:
            try:
                st = p.stat()
                rows.append((p.parent, p.name, st.st_size, st.st_mtime_ns))
            except OSError:
                rows.append((p.parent, p.name, -1, 0))
        return cls._from_rows(rows)

    @classmethod
    def scan(cls, directory: Path, suffix: str, key: Callable[[str], Any] | None = None) -> FileList:
        """The files (links followed) of ``directory`` whose names end with ``suffix``, sorted by ``key`` of their
        names (the name itself by default): one ``scandir``, then a ``stat`` per file in order, no ``Path`` and no
        Python int per file (what a listing holds at its peak is a name and a sort key per file)."""
        with os.scandir(directory) as entries:
            names = [e.name for e in entries if e.name.endswith(suffix) and e.is_file()]
        names.sort(key=key)
        sizes, mtimes = array("q"), array("q")
        folder = os.fspath(directory)
        for name in names:
            try:
                st = os.stat(os.path.join(folder, name))
                sizes.append(st.st_size)
                mtimes.append(st.st_mtime_ns)
            except OSError:  # gone since the directory was read
                sizes.append(-1)
                mtimes.append(0)
        cuts = np.zeros(len(names) + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, names), dtype=np.int64, count=len(names)), out=cuts[1:])
        return cls(
            [directory],
            np.zeros(len(names), dtype=np.uint32),
            "".join(names),
            cuts,
            np.frombuffer(sizes, dtype=np.int64).copy(),
            np.frombuffer(mtimes, dtype=np.int64).copy(),
        )

    @classmethod
    def _from_rows(cls, rows: list[tuple[Path, str, int, int]]) -> FileList:
        folders: dict[Path, int] = {}
        index = [folders.setdefault(folder, len(folders)) for folder, *_ in rows]
        return cls(
            list(folders),
            np.asarray(index, dtype=np.uint32),
            "".join(r[1] for r in rows),
            np.concatenate([[0], np.cumsum([len(r[1]) for r in rows], dtype=np.int64)]).astype(np.int64),
            np.asarray([r[2] for r in rows], dtype=np.int64),
            np.asarray([r[3] for r in rows], dtype=np.int64),
        )

    def __len__(self) -> int:
        return len(self.sizes)

    @overload
    def __getitem__(self, i: int) -> Path: ...
    @overload
    def __getitem__(self, i: slice) -> FileList: ...
    def __getitem__(self, i: int | slice) -> Path | FileList:
        if isinstance(i, slice):
            lo, hi, step = i.indices(len(self))
            if step != 1:
                return FileList.of(self[j] for j in range(lo, hi, step))
            hi = max(lo, hi)
            cuts = self._cuts[lo : hi + 1]
            f = self.folder[lo:hi]
            return FileList(self.folders, f, self._names, cuts, self.sizes[lo:hi], self.mtimes[lo:hi])
        if not -len(self) <= i < len(self):
            raise IndexError(f"file {i} out of range for {len(self)} files")
        i %= len(self)
        return self.folders[self.folder[i]] / self.name(i)

    def name(self, i: int) -> str:
        return self._names[self._cuts[i] : self._cuts[i + 1]]

    def stamp(self, i: int) -> tuple[int, int]:
        """(size, mtime_ns) of file ``i`` when it was listed."""
        return int(self.sizes[i]), int(self.mtimes[i])

    def records(self) -> Iterator[list[Any]]:
        """``[resolved path, size, mtime_ns]`` of each file in order: what a cache's key fingerprints (as
        :class:`Resolver` names a file, without a ``Path`` per file)."""
        folders = [(os.fspath(f), str(f.resolve())) for f in self.folders]
        for i in range(len(self)):
            folder, resolved = folders[self.folder[i]]
            name = self.name(i)
            path = os.path.join(folder, name)
            yield [os.path.realpath(path) if os.path.islink(path) else os.path.join(resolved, name), *self.stamp(i)]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"FileList({len(self)} files in {len(self.folders)} folder(s))"


class FileDocuments(Sequence[DocumentSource]):
    """A :class:`FileList` as one document per file, named by ``name(path)``, each :class:`DocumentSource` made
    when it is asked for (none is held)."""

    def __init__(
        self, files: FileList, read: Callable[[Path], Iterator[Piece]], name: Callable[[str], str] = lambda n: n
    ) -> None:
        self.files, self._read, self._name = files, read, name

    def __len__(self) -> int:
        return len(self.files)

    @overload
    def __getitem__(self, i: int) -> DocumentSource: ...
    @overload
    def __getitem__(self, i: slice) -> FileDocuments: ...
    def __getitem__(self, i: int | slice) -> DocumentSource | FileDocuments:
        if isinstance(i, slice):
            return FileDocuments(self.files[i], self._read, self._name)
        path = self.files[i]
        i %= len(self.files)
        read = self._read
        stamp = self.files.stamp(i)
        return DocumentSource(self._name(self.files.name(i)), max(stamp[0], 0), (path,), lambda: read(path), (stamp,))


class Resolver:
    """``str(path.resolve())``, how a build's key names a file, with each folder resolved once: for a corpus of a
    file per document, resolving each path whole costs an ``lstat`` per component, and its transient objects."""

    def __init__(self) -> None:
        self.folders: dict[Path, Path] = {}

    def __call__(self, path: Path) -> str:
        if path.is_symlink():
            return str(path.resolve())
        folder = self.folders.get(path.parent)
        if folder is None:
            folder = self.folders[path.parent] = path.parent.resolve()
        return str(folder / path.name)


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
    if tokenizer == "bytes":  # its ids are the bytes: text or not, decided by the counter at the document's end
        yield from byte_blocks(path, lo, hi)
        return
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


def byte_blocks(path: Path, lo: int, hi: int, *, block: int | None = None) -> Iterator[Piece]:
    """Bytes ``[lo, hi)`` of a file as undecided pieces of about ``block`` bytes (:data:`BYTE_BLOCK`), each ending
    where a UTF-8 character does (the bytes of one cut by a block's end go with the next block), so that each piece
    can be counted as text on its own."""
    carry = b""
    with path.open("rb") as f:
        f.seek(lo)
        for data in read_blocks(f, hi - lo, block=block or BYTE_BLOCK):
            read = len(data)
            data = carry + data if carry else data
            end = _character_end(data)
            carry = data[end:]
            yield Piece(data[:end], read, undecided=True)
    if carry:
        yield Piece(carry, 0, undecided=True)


def _character_end(data: bytes) -> int:
    """The length of ``data`` without a UTF-8 character its end cuts off (no more than 3 bytes; none when the
    bytes before the end are not UTF-8: nothing to complete)."""
    n = len(data)
    for back in range(1, min(4, n) + 1):
        b = data[n - back]
        if b < 0x80:
            return n
        if b >= 0xC0:  # the lead byte of the last character: 2, 3 or 4 bytes long
            need = 2 if b < 0xE0 else 3 if b < 0xF0 else 4
            return n - back if need > back else n
    return n


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


def _wide_tables() -> tuple[np.ndarray, np.ndarray]:
    """By a character's first two bytes: 1 when they are a whitespace character, 2 + g when they may start one
    (g: which of the few such pairs); and by (g, third byte): whether the three are one."""
    pairs = np.zeros(1 << 16, dtype=np.uint8)
    starts = sorted({w[:2] for w in _WIDE_SPACE if len(w) == 3})
    thirds = np.zeros((len(starts), 256), dtype=bool)
    for w in _WIDE_SPACE:
        if len(w) == 2:
            pairs[w[0] << 8 | w[1]] = 1
        else:
            g = starts.index(w[:2])
            pairs[w[0] << 8 | w[1]] = 2 + g
            thirds[g, w[2]] = True
    return pairs, thirds


_WIDE_PAIRS, _WIDE_THIRDS = _wide_tables()
_BYTES_SPACE = np.zeros(256, dtype=bool)
_BYTES_SPACE[[9, 10, 11, 12, 13, 32]] = True  # bytes.split()'s whitespace


def utf8_of(text: Document) -> bytes:
    return text.encode("utf-8") if isinstance(text, str) else text


class _Words:
    """Whitespace-separated words over consecutive pieces: a word that a piece boundary cuts is counted once."""

    __slots__ = ("count", "in_word")

    def __init__(self) -> None:
        self.count, self.in_word = 0, False

    def add(self, words: int, first: bool, last: bool) -> None:
        """A piece of ``words`` words, whether it starts (``first``) and ends (``last``) inside one."""
        self.count += words - (1 if self.in_word and first else 0)
        self.in_word = last


class TextCounter:
    """Characters, UTF-8 bytes and whitespace words of a document fed piece by piece: the same numbers as
    :func:`~compressive_transformer.data.units.text_size` of the whole document (bytes that are not UTF-8 count
    one character each, as enwik8 is scored), words counted once where a piece boundary falls inside one.

    A document comes as ``str`` pieces (text), ``bytes`` pieces (a bytes document) or undecided bytes
    (:meth:`add_utf8`: text if it all turns out UTF-8 without a NUL, else a bytes document); ``is_text`` says, once
    :meth:`finish` has run, which it was."""

    def __init__(self) -> None:
        self.chars = self.bytes = 0
        self.is_text = True
        self._text_words = _Words()  # as str.split() counts them
        self._byte_words = _Words()  # as bytes.split() counts them
        self._raw = False  # bytes were given: characters and words are decided at the end
        self._may_be_text = True  # undecided bytes with no NUL and nothing but UTF-8 so far
        self._utf8 = True  # the bytes so far are UTF-8
        self._raw_chars = 0  # their characters if they are
        self._tail = b""  # the start of a character the last piece's end cut off

    def add_piece(self, piece: Piece) -> bytes:
        """Count one piece of a document as its kind says; its bytes."""
        raw = piece.utf8()
        if piece.undecided:
            self.add_utf8(raw)
        else:
            self.add(piece.text, raw)
        return raw

    def add(self, text: Document, raw: bytes) -> None:
        """Count ``text`` (its UTF-8 bytes ``raw``, the same object for a bytes piece)."""
        if not text:
            return
        if isinstance(text, str):
            self.bytes += len(raw)
            self.chars += len(text)
            arr = np.frombuffer(raw, dtype=np.uint8)
            wide = not text.isascii() and has_wide_space(raw)
            self._text_words.add(*_text_edges(raw, arr, wide, None, text))
        else:
            self._may_be_text = False
            self._add_raw(text)

    def add_utf8(self, raw: bytes) -> None:
        """Count undecided bytes, counted both as text and as bytes until :meth:`finish` knows which."""
        if raw:
            self._add_raw(raw)

    def _add_raw(self, raw: bytes) -> None:
        self._raw = True
        self.bytes += len(raw)
        if self._tail:
            raw = self._tail + raw
        end = _character_end(raw)  # counted up to a character's end: the rest with the next piece
        body, self._tail = (raw, b"") if end == len(raw) else (raw[:end], raw[end:])
        if not body:
            return
        arr = np.frombuffer(body, dtype=np.uint8)
        high = None if body.isascii() else np.flatnonzero(arr >= 0x80)
        if self._utf8:
            chars = len(body) if high is None else utf8_characters(body, arr, high)
            self._utf8 = chars is not None
            self._raw_chars += chars or 0
        if self._may_be_text and (not self._utf8 or b"\x00" in body):
            self._may_be_text = False
        controls, separators = _low_bytes(arr)
        clean = _edges(arr <= 32) if not (controls or separators) else None  # both ways' words, the usual case
        self._byte_words.add(*(clean or _edges(_BYTES_SPACE[arr])))
        if not self._may_be_text:
            return
        wide = high is not None and has_wide_space(body, high)
        self._text_words.add(*(clean if clean and not wide else _text_edges(body, arr, wide, controls)))

    def finish(self) -> tuple[int, int, int]:
        """(characters, bytes, words) of the document."""
        if not self._raw:
            return self.chars, self.bytes, self._text_words.count
        if self._tail:  # the document ends inside a character: not UTF-8, and those bytes are counted as bytes
            self._utf8 = False
            self._byte_words.add(*_edges(_BYTES_SPACE[np.frombuffer(self._tail, dtype=np.uint8)]))
        self.is_text = self._may_be_text and self._utf8
        self.chars = self._raw_chars if self._utf8 else self.bytes
        return self.chars, self.bytes, (self._text_words if self.is_text else self._byte_words).count


def utf8_characters(data: bytes, arr: np.ndarray, high: np.ndarray) -> int | None:
    """The characters of ``data`` (``arr``: its bytes as an array; ``high``: where its bytes >= 0x80 are) when it is
    UTF-8 that ends with a whole character, else None: the decoder's verdict, checked on the few non-ASCII bytes of
    a mostly ASCII text (at many times its speed), or by decoding where they are many."""
    if len(high) * 8 > len(arr):
        try:
            return len(data.decode("utf-8"))
        except UnicodeDecodeError:
            return None
    v = arr[high]
    lead = np.flatnonzero(v >= 0xC0)  # indices into `high` of the characters' first bytes
    lv = v[lead]
    if not len(lead) or lead[0] != 0 or ((lv < 0xC2) | (lv > 0xF4)).any():  # C0, C1: overlong; F5-FF: too high
        return None
    length = 2 + (lv >= 0xE0).astype(np.int64) + (lv >= 0xF0)
    ends = lead + length  # each character's continuation bytes are the next length - 1 high bytes ...
    if ends[-1] != len(high) or (ends[:-1] != lead[1:]).any():
        return None
    if ((high[ends - 1] - high[lead]) != length - 1).any():  # ... and they follow it with nothing between
        return None
    second = v[lead + 1]
    if (
        ((lv == 0xE0) & (second < 0xA0))  # overlong
        | ((lv == 0xED) & (second >= 0xA0))  # a surrogate
        | ((lv == 0xF0) & (second < 0x90))  # overlong
        | ((lv == 0xF4) & (second >= 0x90))  # beyond U+10FFFF
    ).any():
        return None
    return len(arr) - (len(high) - len(lead))


def has_wide_space(raw: bytes, high: np.ndarray | None = None) -> bool:
    """Whether UTF-8 text holds a whitespace character beyond ASCII (as ``str.isspace`` has them): its bytes
    searched for their encodings from the few places one could start, by table, at memory speed (a regular
    expression over the decoded text runs at a tenth of it). ``high``: where its bytes >= 0x80 are, if known."""
    arr = np.frombuffer(raw, dtype=np.uint8)
    lo, hi = _WIDE_LEADS
    if high is None:
        at = np.flatnonzero((arr - np.uint8(lo)) <= np.uint8(hi - lo))  # lead bytes from the first to the last
    else:
        at = high[(arr[high] - np.uint8(lo)) <= np.uint8(hi - lo)]
    if not len(at):
        return False
    last = len(arr) - 1  # a character cut off by the end reads its own bytes again: at worst a false alarm
    pairs = arr[at].astype(np.int64) << 8 | arr[np.minimum(at + 1, last)]
    kind = _WIDE_PAIRS[pairs]
    if (kind == 1).any():
        return True
    maybe = np.flatnonzero(kind >= 2)
    if not len(maybe):
        return False
    return bool(_WIDE_THIRDS[kind[maybe] - 2, arr[np.minimum(at[maybe] + 2, last)]].any())


def _text_edges(
    raw: bytes, arr: np.ndarray, wide: bool, controls: bool | None, text: str | None = None
) -> tuple[int, bool, bool]:
    """Words of UTF-8 text as ``str.split`` counts them, and whether it starts and ends inside one: over its bytes
    ``arr`` when its whitespace is ASCII (``wide``: it holds some beyond, :func:`has_wide_space`; ``controls``:
    :func:`_low_bytes`' first answer, found here when None), else by ``str.split`` of ``text`` (decoded here when
    not at hand)."""
    if not wide:
        controls = _low_bytes(arr)[0] if controls is None else controls
        return _edges(_STR_SPACE[arr] if controls else arr <= 32)
    text = raw.decode("utf-8") if text is None else text
    return len(text.split()), not text[0].isspace(), not text[-1].isspace()


def _low_bytes(arr: np.ndarray) -> tuple[bool, bool]:
    """Whether ``arr`` holds control bytes (0-8, 14-27: whitespace to neither ``str.split`` nor ``bytes.split``)
    and separators (28-31: whitespace to ``str.split`` only). Every whitespace byte is <= 32, so without them
    ``arr <= 32`` is the whitespace mask, at memory speed; text rarely holds either, and then the mask is a table
    looked up byte by byte. (Counts of comparisons: numpy's boolean ``&`` and ``~`` run at a tenth of their speed.)"""
    if arr.min() >= 9 and np.count_nonzero(arr < 32) == np.count_nonzero(arr < 14):  # nothing but \t-\r below 32
        return False, False
    below = [np.count_nonzero(arr < k) for k in (9, 14, 28, 32)]  # bytes below 9, 14, 28 and 32
    return below[0] + below[2] - below[1] > 0, below[3] > below[2]


def _edges(ws: np.ndarray) -> tuple[int, bool, bool]:
    """Words of a run by its whitespace mask, and whether it starts and ends inside a word."""
    starts = int(np.count_nonzero(ws[:-1] > ws[1:])) + (0 if ws[0] else 1)  # a word after a space
    return starts, not bool(ws[0]), not bool(ws[-1])


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
    "FileDocuments",
    "FileList",
    "FileScan",
    "Piece",
    "Resolver",
    "SplitStream",
    "TextCounter",
    "byte_blocks",
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
    "utf8_characters",
    "utf8_of",
]
