"""Building one split's token cache from its stream: batch by batch, shard by shard, resumable after any kill.

The split's pieces (:mod:`~compressive_transformer.data.documents`) are encoded a batch at a time
(:data:`BATCH_BYTES` of text per ``encode_pieces`` call, so a subword tokenizer uses every core) and their ids
appended to ``<stem>.build/tokens.bin``. Every :data:`SHARD_BYTES` of text the build commits a shard: the tokens are
flushed to disk, then ``shard-NNNNN.json`` records where the stream stands (document and piece), the token count,
the ends and names of the documents finished in the shard, the running counts and a hash of the shard's text. A
build that stops, however it stops, resumes from its last shard: the tokens file is cut back to that shard's end,
documents wholly before it are skipped unread, and the document it stopped in is read again from its start (its
earlier pieces counted, not encoded). The shards' boundaries depend only on the stream, so a resumed build writes
the same bytes as one that never stopped. A build whose key (corpus files, their sizes and times, the tokenizer)
no longer matches is started again, with a line saying why; a file that changes while it is read stops the build.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import sys
import time
import zlib
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
from tqdm.auto import tqdm

from compressive_transformer.core.config import ConfigError
from compressive_transformer.core.fileio import write_text_atomic
from compressive_transformer.data.documents import Piece, Resolver, SplitStream, TextCounter, content_hash
from compressive_transformer.data.tokenizers import ByteTokenizer, Tokenizer, WordTokenizer, as_text
from compressive_transformer.data.word_ids import WordPool

SHARD_BYTES = 256 << 20  # text per shard: at most this much work is lost to a kill
BATCH_BYTES = 4 << 20  # text per encode_pieces call: a subword library is fastest near here (16 books of PG-19)
BUILD_VERSION = 2  # 2: the byte tokenizer's pieces are the file's blocks
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
    index: int
    doc: int  # the stream stands at piece `piece` of document `doc`
    piece: int
    tokens_end: int
    ends: list[int]  # token offsets at which documents finished in this shard end (non-empty documents only)
    names: list[str]
    totals: dict[str, int]
    hash: str
    files: list[list[Any]] = field(default_factory=list)  # [path, size, mtime_ns] of files read in this shard
    tokens_crc: str = ""  # CRC-32 of the shard's ids as written: a resumed build checks what the disk kept

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class BuildResult:
    """The finished split: its ids file, offsets, counts and shard fingerprints (for the cache's JSON)."""

    tokens_path: Path
    offsets: np.ndarray
    names: list[str]
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
) -> BuildResult:
    """Encode ``stream`` into ``build_dir`` (resuming what an earlier build of the same ``key`` left there)."""
    say = log or (lambda msg: print(msg, file=sys.stderr))
    start = time.perf_counter()
    shards = _resume(build_dir, key, dtype, shard_bytes, say)
    tokens_path = build_dir / "tokens.bin"
    done = shards[-1] if shards else None
    tokens_end = done.tokens_end if done else 0
    with tokens_path.open("r+b" if tokens_path.exists() else "wb") as f:
        f.truncate(tokens_end * dtype.itemsize)
        f.seek(0, os.SEEK_END)
        writer = _Writer(stream, tokenizer, build_dir, f, dtype, shard_bytes, batch_bytes, shards, key)
        if done is None or done.doc < len(stream.documents):  # else it stopped after its last shard: nothing to do
            try:
                writer.run(progress)
            finally:
                writer.close()
    shards = writer.shards
    offsets = np.concatenate([[0], *[np.asarray(s.ends, dtype=np.int64) for s in shards]]).astype(np.int64)
    names = [n for s in shards for n in s.names]
    totals = Totals(**shards[-1].totals) if shards else Totals()
    return BuildResult(
        tokens_path,
        offsets,
        names,
        totals,
        [{"doc": s.doc, "piece": s.piece, "tokens_end": s.tokens_end, "hash": s.hash} for s in shards],
        time.perf_counter() - start,
        len(shards) - writer.new_shards,
    )


def _resume(
    build_dir: Path, key: dict[str, Any], dtype: np.dtype, shard_bytes: int, say: Callable[[str], None]
) -> list[Shard]:
    """The shards an earlier build of the same key finished, or [] with ``build_dir`` emptied for a new build."""
    state = {"version": BUILD_VERSION, "key": key, "dtype": dtype.name, "shard_bytes": shard_bytes}
    why = _why_not_resumable(build_dir, state)
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
    write_text_atomic(build_dir / "build.json", json.dumps(state))
    return []


def _why_not_resumable(build_dir: Path, state: dict[str, Any]) -> str | None:
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
    changed = _changed_source(old.get("sources", []), new.get("sources", []))
    if changed:
        return f"the corpus changed since: {changed}"
    return "its settings changed"


def _changed_source(old: list[Any], new: list[Any]) -> str:
    before = {s[0]: s[1:] for s in old}
    for path, *stat in new:
        if path not in before:
            return f"{path} is new"
        if before[path] != stat:
            return f"{path} has another size or modification time"
    gone = set(before) - {s[0] for s in new}
    return f"{sorted(gone)[0]} is gone" if gone else ""


def _read_shards(build_dir: Path, dtype: np.dtype) -> list[Shard] | str:
    """The committed shards, in order, checked against the tokens file; a reason string when they do not fit."""
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
    tokens = build_dir / "tokens.bin"
    have = tokens.stat().st_size if tokens.exists() else 0
    if shards and have < shards[-1].tokens_end * dtype.itemsize:
        return "its tokens file is shorter than its shards say"
    # the ids are not synced to disk shard by shard (the build would run at the disk's speed, not the cache's); a
    # machine that stopped without writing back its cache may have kept a record without its ids: the last shard
    # whose ids check out is where the build resumes
    while (
        shards
        and _tokens_crc(tokens, shards[-2].tokens_end if len(shards) > 1 else 0, shards[-1].tokens_end, dtype)
        != shards[-1].tokens_crc
    ):
        shards.pop()
    return shards


def _tokens_crc(path: Path, start: int, end: int, dtype: np.dtype) -> str:
    """CRC-32 of ids ``[start, end)`` of a tokens file, read a block at a time."""
    crc, step = 0, (64 << 20) // dtype.itemsize
    with path.open("rb") as f:
        f.seek(start * dtype.itemsize)
        for at in range(start, end, step):
            crc = zlib.crc32(f.read((min(end, at + step) - at) * dtype.itemsize), crc)
    return f"{crc:08x}"


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
        f: Any,
        dtype: np.dtype,
        shard_bytes: int,
        batch_bytes: int,
        shards: list[Shard],
        key: dict[str, Any],
    ) -> None:
        self.stream, self.tokenizer, self.build_dir, self.f, self.dtype = stream, tokenizer, build_dir, f, dtype
        self.shard_bytes, self.batch_bytes = shard_bytes, batch_bytes
        self.shards, self.new_shards = shards, 0
        last = shards[-1] if shards else None
        self.totals = Totals(**last.totals) if last else Totals()
        self.tokens = last.tokens_end if last else 0
        self.doc_start = self._last_end()
        self.resume_at = (last.doc, last.piece) if last else (0, 0)
        self.stat = {s[0]: s[1:] for s in key.get("sources", [])}
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

    def _last_end(self) -> int:
        for s in reversed(self.shards):
            if s.ends:
                return s.ends[-1]
        return 0

    def _new_shard(self) -> None:
        self.ends: list[int] = []
        self.names: list[str] = []
        self.hash = content_hash()
        self.tokens_crc = 0
        self.shard_start = self.totals.text_bytes
        self.files: dict[str, Path] = {}

    def run(self, progress: bool) -> None:
        d0, k0 = self.resume_at
        documents = self.stream.documents
        bar = tqdm(
            total=self.stream.total_bytes, initial=sum(doc.size for doc in documents[:d0]), unit="B", unit_scale=True,
            desc=f"tokenize {self.stream.split}", disable=None if progress else True,
        )  # fmt: skip
        with bar:
            for d in range(d0, len(documents)):
                doc = documents[d]
                for path in doc.files:
                    self.files[self.resolved(path)] = path
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
            self._flush()
            self._commit(len(documents), 0, final=True)
        for note in self.stream.notes():
            print(note, file=sys.stderr)

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
                self.names.append(item.name)
                self.doc_start = self.tokens

    def _commit(self, doc: int, piece: int, *, final: bool = False) -> None:
        """Make the shard's ids reach the file, then write its record (a kill in between loses only this shard)."""
        while self.pending:
            self._write_oldest()
        self.counts.settle(self.totals)
        if not final and self.totals.text_bytes == self.shard_start and not self.ends:
            return
        self.f.flush()
        for name, path in self.files.items():
            st = path.stat() if path.exists() else None
            now = [st.st_size, st.st_mtime_ns] if st else None
            if name in self.stat and self.stat[name] != now:
                raise ConfigError(
                    f"data.path: {path} changed while its token cache was being built (its size or modification time); "
                    "build again once the corpus no longer changes"
                )
        shard = Shard(
            len(self.shards),
            doc,
            piece,
            self.tokens,
            self.ends,
            self.names,
            self.totals.to_dict(),
            self.hash.hexdigest(),
            [[n, *self.stat.get(n, [])] for n in sorted(self.files)],
            self.hash.hexdigest() if self.as_bytes else f"{self.tokens_crc:08x}",
        )
        write_text_atomic(self.build_dir / f"shard-{shard.index:05d}.json", json.dumps(shard.to_dict()))
        shard.files = []  # recorded, never read again: a long build keeps only what the cache's JSON needs
        self.shards.append(shard)
        self.new_shards += 1
        self._new_shard()


def peak_rss_mib() -> float:
    """This process's peak resident memory so far, in MiB (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 20) if sys.platform == "darwin" else peak / 1024


__all__ = ["BATCH_BYTES", "SHARD_BYTES", "BuildResult", "build_split", "peak_rss_mib"]
