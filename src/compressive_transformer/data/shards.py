"""Building one split's token cache from its stream: batch by batch, shard by shard, resumable after any kill.

The split's pieces (:mod:`~compressive_transformer.data.documents`) are encoded a batch at a time
(:data:`BATCH_BYTES` of text per ``encode_pieces`` call, so a subword tokenizer uses every core) and their ids
appended to ``<stem>.build/tokens.bin``. Every :data:`SHARD_BYTES` of text the build commits a shard: the tokens,
and the ends and names of the documents finished in the shard (appended to ``offsets.bin`` and ``names.jsonl``:
nothing per document is kept in memory), are flushed to disk, then ``shard-NNNNN.json`` records where the stream
stands (document and piece), the lengths of those files, the running counts and a hash of the shard's text. A
build that stops, however it stops, resumes from its last shard: the files are cut back to that shard's end,
documents wholly before it are skipped unread, and the document it stopped in is read again from its start (its
earlier pieces counted, not encoded). The shards' boundaries depend only on the stream, so a resumed build writes
the same bytes as one that never stopped. A build whose key (corpus files, their sizes and times, the tokenizer)
no longer matches is started again, with a line saying why; a file that changes while it is read stops the build.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import resource
import shutil
import sys
import time
import zlib
from array import array
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator

import numpy as np
from tqdm.auto import tqdm

from compressive_transformer.core.config import ConfigError
from compressive_transformer.core.fileio import replace_file, write_text_atomic
from compressive_transformer.data.documents import (
    DocumentSource,
    FileList,
    Piece,
    Resolver,
    SplitStream,
    TextCounter,
    content_hash,
)
from compressive_transformer.data.tokenizers import ByteTokenizer, Tokenizer, WordTokenizer, as_text
from compressive_transformer.data.word_ids import WordPool

SOURCES_FILE = "sources.jsonl"  # a build's corpus files, [path, size, mtime_ns] a line: to say which one changed
SHARD_BYTES = 256 << 20  # text per shard: at most this much work is lost to a kill
BATCH_BYTES = 4 << 20  # text per encode_pieces call: a subword library is fastest near here (16 books of PG-19)
BUILD_VERSION = 3  # 2: the byte tokenizer's pieces are the file's blocks; 3: the corpus's files by fingerprint
COUNT_AHEAD = 4  # pieces read ahead of their counting (a byte cache's: a MiB each)
IN_FLIGHT = 2  # word batches being encoded at once: the next is read while one encodes, two fill each other's tails


@dataclass
class Totals:
    """Counts over the documents finished so far (what the cache's JSON records)."""

    chars: int = 0
    bytes: int = 0
    words: int = 0
    articles: int = 0
    documents: int = 0  # finished documents, empty ones included
    text_bytes: int = 0  # UTF-8 bytes of every piece so far, finished documents or not (shard boundaries)

    def to_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class Shard:
    """A committed shard's record, ``shard-NNNNN.json``. The documents' ends and names are not in it: they are
    appended to ``offsets.bin`` and ``names.jsonl`` beside the ids, so that nothing per document stays in memory."""

    index: int
    doc: int  # the stream stands at piece `piece` of document `doc`
    piece: int
    tokens_end: int
    ends: int  # documents ended so far (non-empty ones): offsets.bin holds 1 + this many int64
    last_end: int  # the token offset at which the last of them ends
    names_bytes: int  # the length of names.jsonl so far
    totals: dict[str, int]
    hash: str
    files: str  # sha256 of [path, size, mtime_ns] of each file read in this shard
    tokens_crc: str  # CRC-32 of the shard's ids as written: a resumed build checks what the disk kept
    index_crc: str  # CRC-32 of the shard's ends, then its names, as written

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class BuildResult:
    """The finished split: its ids file, offsets, counts and shard fingerprints (for the cache's JSON)."""

    tokens_path: Path
    offsets: np.ndarray  # (documents + 1,) int64, memory-mapped from offsets_path
    offsets_path: Path
    names_path: Path  # the documents' names, one JSON string a line
    totals: Totals
    shards: list[dict[str, Any]]
    seconds: float
    resumed_from: int  # shards found done when the build started


def build_split(
    stream: SplitStream,
    tokenizer: Tokenizer,
    build_dir: Path,
    key: dict[str, Any],
    dtype: np.dtype,
    *,
    shard_bytes: int = SHARD_BYTES,
    batch_bytes: int = BATCH_BYTES,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
    listing: FileList | None = None,
) -> BuildResult:
    """Encode ``stream`` into ``build_dir`` (resuming what an earlier build of the same ``key`` left there).
    ``listing``: the corpus files ``key`` fingerprints, kept beside the build to say which one changed."""
    say = log or (lambda msg: print(msg, file=sys.stderr))
    start = time.perf_counter()
    shards = _resume(build_dir, key, dtype, shard_bytes, say, listing)
    paths = tokens_path, offsets_path, names_path = [
        build_dir / n for n in ("tokens.bin", "offsets.bin", "names.jsonl")
    ]
    done = shards[-1] if shards else None
    sizes = (done.tokens_end * dtype.itemsize, (done.ends + 1) * 8, done.names_bytes) if done else (0, 0, 0)
    with contextlib.ExitStack() as files:
        tokens, offsets_file, names = [files.enter_context(_cut(p, n)) for p, n in zip(paths, sizes)]
        if done is None:
            offsets_file.write(np.zeros(1, dtype=np.int64).tobytes())  # offsets start at 0
        writer = _Writer(
            stream, tokenizer, build_dir, (tokens, offsets_file, names), dtype, shard_bytes, batch_bytes, shards
        )
        if done is None or done.doc < len(stream.documents):  # else it stopped after its last shard: nothing to do
            try:
                writer.run(progress)
            finally:
                writer.close()
    shards = writer.shards
    totals = Totals(**shards[-1].totals) if shards else Totals()
    return BuildResult(
        tokens_path,
        np.memmap(offsets_path, dtype=np.int64, mode="r"),
        offsets_path,
        names_path,
        totals,
        [{"doc": s.doc, "piece": s.piece, "tokens_end": s.tokens_end, "hash": s.hash} for s in shards],
        time.perf_counter() - start,
        len(shards) - writer.new_shards,
    )


def _resume(
    build_dir: Path,
    key: dict[str, Any],
    dtype: np.dtype,
    shard_bytes: int,
    say: Callable[[str], None],
    listing: FileList | None,
) -> list[Shard]:
    """The shards an earlier build of the same key finished, or [] with ``build_dir`` emptied for a new build."""
    state = {"version": BUILD_VERSION, "key": key, "dtype": dtype.name, "shard_bytes": shard_bytes}
    why = _why_not_resumable(build_dir, state, listing)
    if why is None:
        shards = _read_shards(build_dir, dtype)
        if isinstance(shards, str):
            why = shards
        else:
            if shards:
                say(
                    f"resuming the token cache build in {build_dir} after shard {len(shards)} ({shards[-1].totals['text_bytes']:,} bytes done)"
                )
            return shards
    if why and build_dir.exists():
        say(f"note: the interrupted token cache build in {build_dir} cannot be resumed ({why}); starting it again")
    if build_dir.exists():
        shutil.rmtree(build_dir)
    build_dir.mkdir(parents=True)
    if listing is not None:
        replace_file(build_dir / SOURCES_FILE, lambda tmp: _write_records(tmp, listing))
    write_text_atomic(build_dir / "build.json", json.dumps(state))
    return []


def _why_not_resumable(build_dir: Path, state: dict[str, Any], listing: FileList | None) -> str | None:
    """Why the build in ``build_dir`` cannot continue as ``state`` describes ("" when there is none to continue)."""
    try:
        saved = json.loads((build_dir / "build.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        return ""
    except (OSError, ValueError):
        return "its build.json is unreadable"
    if not isinstance(saved, dict):
        return "its build.json is unreadable"
    if saved.get("version") != state["version"] or saved.get("dtype") != state["dtype"]:
        return "it was made by another version"
    if saved.get("shard_bytes") != state["shard_bytes"]:
        return "it used another shard size"
    old, new = saved.get("key", {}), state["key"]
    if old == new:
        return None
    if old.get("tokenizer") != new.get("tokenizer"):
        return "the tokenizer changed"
    if old.get("sources") != new.get("sources"):
        changed = _changed_source(build_dir / SOURCES_FILE, listing) if listing is not None else ""
        return f"the corpus changed since: {changed or 'its files differ'}"
    return "its settings changed"


def _write_records(path: Path, listing: FileList) -> None:
    with path.open("w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in listing.records())


def _changed_source(saved: Path, listing: FileList) -> str:
    """The first file that differs between the listing a build kept and the corpus's now (both in the corpus's
    order, read side by side: nothing per file is held)."""
    try:
        f = saved.open(encoding="utf-8")
    except OSError:
        return ""
    with f:
        for line, now in itertools.zip_longest(f, listing.records()):
            try:
                then = json.loads(line) if line is not None else None
            except ValueError:
                return ""
            if then == now:
                continue
            if then is None:
                return f"{now[0]} is new"
            if now is None:
                return f"{then[0]} is gone"
            if then[0] == now[0]:
                return f"{now[0]} has another size or modification time"
            return f"{then[0]} is gone or {now[0]} is new"
    return ""


def _read_shards(build_dir: Path, dtype: np.dtype) -> list[Shard] | str:
    """The committed shards, in order, checked against the files they were appended to; a reason string when they
    do not fit."""
    shards: list[Shard] = []
    while True:
        path = build_dir / f"shard-{len(shards):05d}.json"
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            shards.append(Shard(**raw))
        except FileNotFoundError:
            break
        except (OSError, ValueError, TypeError):
            return f"{path.name} is unreadable"
    tokens, offsets, names = (build_dir / n for n in ("tokens.bin", "offsets.bin", "names.jsonl"))
    if shards:
        last = shards[-1]
        needs = ((tokens, last.tokens_end * dtype.itemsize), (offsets, (last.ends + 1) * 8), (names, last.names_bytes))
        short = [p.name for p, n in needs if (p.stat().st_size if p.exists() else 0) < n]
        if short:
            return f"its {short[0]} is shorter than its shards say"
    # the files are not synced to disk shard by shard (the build would run at the disk's speed, not the cache's); a
    # machine that stopped without writing back its cache may have kept a record without what it records: the last
    # shard whose ids, ends and names check out is where the build resumes
    while shards:
        last, before = shards[-1], shards[-2] if len(shards) > 1 else None
        size = dtype.itemsize
        ids = _crc(tokens, (before.tokens_end if before else 0) * size, last.tokens_end * size)
        index = _crc(offsets, ((before.ends if before else 0) + 1) * 8, (last.ends + 1) * 8)
        index = _crc(names, before.names_bytes if before else 0, last.names_bytes, index)
        if f"{ids:08x}" == last.tokens_crc and f"{index:08x}" == last.index_crc:
            break
        shards.pop()
    return shards


def _crc(path: Path, start: int, end: int, crc: int = 0) -> int:
    """CRC-32 of bytes ``[start, end)`` of a file (continuing ``crc``), read a block at a time."""
    step = 64 << 20
    with path.open("rb") as f:
        f.seek(start)
        for at in range(start, end, step):
            crc = zlib.crc32(f.read(min(end, at + step) - at), crc)
    return crc


@contextlib.contextmanager
def _cut(path: Path, size: int) -> Iterator[BinaryIO]:
    """``path`` open for appending after its first ``size`` bytes (the rest, an unfinished shard's, cut off)."""
    with path.open("r+b" if path.exists() else "wb") as f:
        f.truncate(size)
        f.seek(0, os.SEEK_END)
        yield f


class _Counts:
    """Each document's characters, bytes and words (:class:`TextCounter`), added to the totals in document order:
    counted as each piece is read, or on a thread of their own beside the reads and writes (``threaded``: numpy
    and the file calls release the GIL), at most :data:`COUNT_AHEAD` pieces behind."""

    def __init__(self, *, threaded: bool) -> None:
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="count") if threaded else None
        self.pieces: deque[Future[bytes]] = deque()
        self.documents: deque[tuple[Future[tuple[int, int, int]], int]] = deque()

    def add(self, counter: TextCounter, piece: Piece) -> bytes:
        """Count ``piece`` of ``counter``'s document (now or soon); its bytes."""
        if self.pool is None:
            return counter.add_piece(piece)
        self.pieces.append(self.pool.submit(counter.add_piece, piece))
        while len(self.pieces) > COUNT_AHEAD:
            self.pieces.popleft().result()
        return piece.utf8()

    def finish(self, counter: TextCounter, articles: int, totals: Totals) -> None:
        """The document ends: its counts are added to ``totals`` once counted (by the next :meth:`settle` at the
        latest), in document order."""
        if self.pool is None:
            counted: Future[tuple[int, int, int]] = Future()
            counted.set_result(counter.finish())
        else:
            counted = self.pool.submit(counter.finish)
        self.documents.append((counted, articles))
        self.settle(totals, wait=False)

    def settle(self, totals: Totals, *, wait: bool = True) -> None:
        """Add the finished documents' counts to ``totals``: those counted so far, or (``wait``) every one sent."""
        while wait and self.pieces:
            self.pieces.popleft().result()
        while self.documents:
            counted, articles = self.documents[0]
            if not wait and not counted.done():
                return
            self.documents.popleft()
            chars, nbytes, words = counted.result()
            totals.chars, totals.bytes, totals.words = totals.chars + chars, totals.bytes + nbytes, totals.words + words
            totals.articles += articles
            totals.documents += 1

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)


@dataclass(frozen=True)
class _End:
    """In a batch: the document ``name`` ends here."""

    name: str


class _Writer:
    """The encoding loop: pieces gathered into batches, ids written, shards committed."""

    def __init__(
        self,
        stream: SplitStream,
        tokenizer: Tokenizer,
        build_dir: Path,
        files: tuple[BinaryIO, BinaryIO, BinaryIO],
        dtype: np.dtype,
        shard_bytes: int,
        batch_bytes: int,
        shards: list[Shard],
    ) -> None:
        self.stream, self.tokenizer, self.build_dir, self.dtype = stream, tokenizer, build_dir, dtype
        self.f, self.offsets_file, self.names_file = files  # ids; document ends; names (appended shard by shard)
        self.shard_bytes, self.batch_bytes = shard_bytes, batch_bytes
        self.shards, self.new_shards = shards, 0
        last = shards[-1] if shards else None
        self.totals = Totals(**last.totals) if last else Totals()
        self.tokens = last.tokens_end if last else 0
        self.doc_start = last.last_end if last else 0
        self.documents_ended = last.ends if last else 0
        self.names_bytes = last.names_bytes if last else 0
        self.resume_at = (last.doc, last.piece) if last else (0, 0)
        self.resolved = Resolver()
        self.batch: list[str | bytes | _End] = []  # pieces to encode, and the ends of documents among them
        self.batch_size = 0
        self.as_bytes = isinstance(tokenizer, ByteTokenizer)  # its ids are the text's bytes: it is given them
        if self.as_bytes:  # and has nothing to gain from batches: each piece is written as it is read
            self.batch_bytes = 1
        self.pool = WordPool(tokenizer._index, tokenizer.unk_id) if isinstance(tokenizer, WordTokenizer) else None
        if self.pool is not None:
            self.pool.start()  # before the encoding threads: its processes are forked from this one
        # a word tokenizer's batches are encoded on threads (waiting on its pool releases the GIL) while this one
        # reads and counts the next; their ids are written in order, so the file is the same as a build that encodes
        # one batch at a time. A subword library's encode_batch keeps every core busy by itself (two batches at once
        # measured 10-20% more CPU time for the same ids), and a byte cache's ids are its text: those encode here
        self.counts = _Counts(threaded=self.as_bytes)  # a byte cache's time is mostly counting: beside the writes
        self.in_flight = IN_FLIGHT if self.pool is not None else 0
        self.encoder = ThreadPoolExecutor(self.in_flight, thread_name_prefix="encode") if self.in_flight else None
        self.pending: deque[tuple[Future[list[np.ndarray]], list[str | bytes | _End]]] = deque()
        self._new_shard()

    def close(self) -> None:
        self.counts.close()
        if self.encoder is not None:
            self.encoder.shutdown(wait=True, cancel_futures=True)
        if self.pool is not None:
            self.pool.close()

    def _encode(self, texts: list[str | bytes]) -> list[np.ndarray]:
        """The batch's ids: a word tokenizer's on every core through its pool, any other's own way."""
        if not texts:
            return []
        if self.pool is not None:
            return self.pool([as_text(t, "words") for t in texts])
        return self.tokenizer.encode_pieces(texts)

    def _new_shard(self) -> None:
        self.ends = array("q")  # the shard's document ends and names, until it is committed
        self.names = bytearray()
        self.hash = content_hash()
        self.tokens_crc = 0
        self.shard_start = self.totals.text_bytes
        self.files = hashlib.sha256()  # [path, size, mtime_ns] of each file read in this shard
        self.unlisted: dict[str, tuple[Path, list[int] | None]] = {}  # files whose stream has no stamp for them

    def run(self, progress: bool) -> None:
        d0, k0 = self.resume_at
        documents = self.stream.documents
        bar = tqdm(
            total=self.stream.total_bytes, initial=sum(documents[d].size for d in range(d0)), unit="B", unit_scale=True,
            desc=f"tokenize {self.stream.split}", disable=None if progress else True,
        )  # fmt: skip
        with bar:
            for d in range(d0, len(documents)):
                doc = documents[d]
                self._note_files(doc)
                counter, articles = TextCounter(), 0
                for k, piece in enumerate(doc.read()):
                    raw = self.counts.add(counter, piece)
                    articles += piece.articles
                    bar.update(piece.consumed)
                    if (d, k) < (d0, k0) or not piece.text:
                        continue  # encoded before the build stopped: counted again, not written again
                    self.hash.update(raw)
                    self.batch.append(raw if self.as_bytes else piece.text)
                    self.batch_size += len(raw)
                    self.totals.text_bytes += len(raw)
                    if self.totals.text_bytes - self.shard_start >= self.shard_bytes:
                        self._flush()
                        self._commit(d, k + 1)
                    elif self.batch_size >= self.batch_bytes:
                        self._flush()
                self.counts.finish(counter, articles, self.totals)
                self.batch.append(_End(doc.name))  # placed once the ids before it are written
                for path, stamp in zip(doc.files, doc.stamps):  # read whole as it was listed, or it changed
                    self._check(path, list(stamp))
            self._flush()
            self._commit(len(documents), 0, final=True)
        for note in self.stream.notes():
            print(note, file=sys.stderr)

    def _note_files(self, doc: DocumentSource) -> None:
        """Record the document's files in the shard's fingerprint; those without a stamp from the stream (a file
        read by many documents) stamped when first read, checked when the shard is committed."""
        stamps = [list(s) for s in doc.stamps] if doc.stamps else [None] * len(doc.files)
        for path, stamp in zip(doc.files, stamps):
            name = self.resolved(path)
            if stamp is None:
                if name in self.unlisted:
                    continue
                stamp = _stamp(path)
                self.unlisted[name] = (path, stamp)
            self.files.update(json.dumps([name, *(stamp or [])]).encode() + b"\n")

    def _check(self, path: Path, stamp: list[int] | None) -> None:
        if _stamp(path) != stamp:
            raise ConfigError(
                f"data.path: {path} changed while its token cache was being built (its size or modification time); "
                "build again once the corpus no longer changes"
            )

    def _flush(self) -> None:
        """Send the batch's pieces to be encoded in one call; write the oldest batches beyond those kept in flight."""
        texts = [item for item in self.batch if not isinstance(item, _End)]
        if self.encoder is not None:
            future = self.encoder.submit(self._encode, texts)
        else:
            future = Future()
            future.set_result(self._encode(texts))
        self.pending.append((future, self.batch))
        self.batch, self.batch_size = [], 0
        while len(self.pending) > self.in_flight:
            self._write_oldest()

    def _write_oldest(self) -> None:
        """Write the ids of the oldest batch sent, and place the ends of the documents it closes."""
        future, items = self.pending.popleft()
        arrays = future.result()
        for ids in arrays:  # one at a time: no copy of the batch
            ids = ids.astype(self.dtype, copy=False)
            if not self.as_bytes:  # a byte cache's ids are its text: their CRC is the text's (``_commit``)
                self.tokens_crc = zlib.crc32(ids.data, self.tokens_crc)
            self.f.write(ids.data)
        lengths = iter([len(a) for a in arrays])
        for item in items:
            if not isinstance(item, _End):
                self.tokens += next(lengths)
            elif self.tokens > self.doc_start:  # an empty document holds nothing to predict: no reset for it
                self.ends.append(self.tokens)
                self.names += (json.dumps(item.name) + "\n").encode()
                self.doc_start = self.tokens

    def _commit(self, doc: int, piece: int, *, final: bool = False) -> None:
        """Make the shard's ids reach the file, then write its record (a kill in between loses only this shard)."""
        while self.pending:
            self._write_oldest()
        self.counts.settle(self.totals)
        if not final and self.totals.text_bytes == self.shard_start and not self.ends:
            return
        for path, listed in self.unlisted.values():
            self._check(path, listed)
        ends, names = self.ends.tobytes(), bytes(self.names)
        self.offsets_file.write(ends)
        self.names_file.write(names)
        for f in (self.f, self.offsets_file, self.names_file):
            f.flush()
        self.documents_ended += len(self.ends)
        self.names_bytes += len(names)
        shard = Shard(
            len(self.shards),
            doc,
            piece,
            self.tokens,
            self.documents_ended,
            self.doc_start,
            self.names_bytes,
            self.totals.to_dict(),
            self.hash.hexdigest(),
            self.files.hexdigest(),
            self.hash.hexdigest() if self.as_bytes else f"{self.tokens_crc:08x}",
            f"{zlib.crc32(names, zlib.crc32(ends)):08x}",
        )
        write_text_atomic(self.build_dir / f"shard-{shard.index:05d}.json", json.dumps(shard.to_dict()))
        self.shards.append(shard)
        self.new_shards += 1
        self._new_shard()


def _stamp(path: Path) -> list[int] | None:
    """[size, mtime_ns] of a file now; None when it is gone."""
    try:
        st = path.stat()
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns]


def peak_rss_mib() -> float:
    """This process's peak resident memory so far, in MiB (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 20) if sys.platform == "darwin" else peak / 1024


__all__ = ["BATCH_BYTES", "SHARD_BYTES", "BuildResult", "build_split", "peak_rss_mib"]
