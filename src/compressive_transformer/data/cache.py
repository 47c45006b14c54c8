"""Encoded splits cached on disk as memory-mapped arrays, so a corpus is tokenized once per tokenizer.

Per split four files share a stem: ``.tokens.bin`` (ids: ``uint8`` for bytes, ``uint16`` when they fit, else
``int32``), ``.offsets.bin`` (``int64``, document ``i`` is ``tokens[offsets[i]:offsets[i+1]]``), ``.names.jsonl``
(the documents' names, read only when asked for) and ``.json`` (the fingerprint, counts and the shards' hashes).
A split is built from its stream in shards (:mod:`~compressive_transformer.data.shards`) in ``<stem>.build/``,
resumable after any interruption; when it is done the ids, offsets and names move into place and the JSON is
written last: a cache is valid only once its JSON exists. Processes sharing a cache directory take turns
(a lock on the directory): one builds, the others wait and then map what it built.

The tokenizer a run trains is cached here too (``tokenizer-<key>/``, keyed by everything it learns from), so that
``data prepare`` can train it and build the splits on one machine and ``train`` on another find both ready.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from compressive_transformer.core.config import ConfigError, DataConfig
from compressive_transformer.core.fileio import exclusive, write_text_atomic
from compressive_transformer.core.registry import corpus_format
from compressive_transformer.data.documents import FileList, SplitStream
from compressive_transformer.data.readers import SPLITS, check_split, data_root_path, source_files, stream_split
from compressive_transformer.data.sample import UNTRAINED, prepare_tokenizer, train_tokenizer
from compressive_transformer.data.shards import BATCH_BYTES, SHARD_BYTES, build_split, peak_rss_mib
from compressive_transformer.data.tokenizers import TOKENIZER_FILE, Tokenizer, load_tokenizer
from compressive_transformer.data.units import TextSize

logger = logging.getLogger(__name__)
CACHE_VERSION = 4  # 3: built in shards from the split's stream, their hashes recorded; 4: files by fingerprint


@dataclass
class Corpus:
    """One encoded split: a flat token array and the offsets of its documents."""

    split: str
    tokens: np.ndarray  # (num_tokens,) memmap of uint8 / uint16 / int32 ids
    doc_offsets: np.ndarray  # (num_docs + 1,) int64, starts at 0, ends at num_tokens
    num_words: int
    meta: dict[str, Any] = field(default_factory=dict)
    summary: str = ""  # the one-line summary of the build that made it, when this call built it
    names_path: Path | None = None  # the documents' names, a JSON string a line

    @property
    def num_docs(self) -> int:
        return len(self.doc_offsets) - 1

    @property
    def num_tokens(self) -> int:
        return int(self.doc_offsets[-1])

    @property
    def size(self) -> TextSize:
        """Characters, bytes and words of the split's text (the denominators of bits per character etc.)."""
        return TextSize(int(self.meta.get("num_chars", 0)), int(self.meta.get("num_bytes", 0)), self.num_words)

    @property
    def tokenizer_kind(self) -> str:
        return str(self.meta.get("key", {}).get("tokenizer_kind", ""))

    @property
    def names(self) -> list[str]:
        """Each document's name (a file's stem, a book's id), read from the cache when asked for: a corpus of many
        documents keeps none of them in memory otherwise."""
        if self.names_path is None:
            return []
        with self.names_path.open(encoding="utf-8") as f:
            return [json.loads(line) for line in f]

    def document(self, i: int) -> np.ndarray:
        """The ids of document ``i`` (a view into the memmap)."""
        if not -self.num_docs <= i < self.num_docs:
            raise IndexError(f"document {i} out of range for {self.num_docs} documents")
        i %= self.num_docs
        return self.tokens[self.doc_offsets[i] : self.doc_offsets[i + 1]]


@dataclass(frozen=True)
class BuildOptions:
    progress: bool = True  # a bar per split and the summary line
    shard_bytes: int = SHARD_BYTES
    batch_bytes: int = BATCH_BYTES


def token_dtype(vocab_size: int) -> np.dtype:
    if vocab_size <= 1 << 8:
        return np.dtype(np.uint8)  # a byte corpus's cache is the size of its text
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.int32)


def sources_fingerprint(files: FileList) -> dict[str, Any]:
    """The corpus files' paths, sizes and mtimes as a count, a total and a hash: a key that does not grow with the
    corpus (the build keeps the listing itself, to say which file changed)."""
    digest = hashlib.sha256()
    for record in files.records():
        digest.update(json.dumps(record).encode() + b"\n")
    return {"files": len(files), "bytes": int(files.sizes.sum()), "sha256": digest.hexdigest()}


def cache_key(cfg: DataConfig, split: str, tokenizer: Tokenizer, files: FileList | None = None) -> dict[str, Any]:
    """Everything the cached ids depend on: corpus location, source files' size and mtime (``files``: the split's
    :func:`source_files`, listed now when not given), and the tokenizer."""
    files = source_files(cfg, split) if files is None else files
    settings = {k: getattr(cfg, k) for k in corpus_format(cfg.format).settings}
    return settings | {
        "version": CACHE_VERSION,
        "format": cfg.format,
        "path": str(Path(data_root_path(cfg.path)).expanduser().resolve()) if cfg.path else "",
        "train_file": cfg.train_file,
        "split": split,
        "tokenizer_kind": tokenizer.kind,
        "tokenizer": tokenizer.fingerprint,
        "sources": sources_fingerprint(files),
    }


def load_corpus(
    cfg: DataConfig,
    split: str,
    tokenizer: Tokenizer,
    cache_dir: str | Path,
    *,
    progress: bool = True,
    shard_bytes: int = SHARD_BYTES,
    batch_bytes: int = BATCH_BYTES,
) -> Corpus:
    """The encoded split, from the cache when its fingerprint matches, else encoded now (resuming an interrupted
    build) and cached; a build's one-line summary is the corpus's ``summary`` (and on stderr, on a terminal)."""
    check_split(split)
    cache_dir = Path(cache_dir)
    files = source_files(cfg, split)
    key = cache_key(cfg, split, tokenizer, files)
    stem = cache_dir / f"{cfg.format}-{split}-{hashlib.sha256(key['path'].encode()).hexdigest()[:10]}"
    corpus = _open(stem, key)
    if corpus is None:
        with exclusive(cache_dir):  # processes sharing a cache (a study's parallel runs) build each split once
            corpus = _open(stem, key)  # another process may have built it while this one waited
            if corpus is None:
                options = BuildOptions(progress, shard_bytes, batch_bytes)
                corpus = _build(cfg, split, tokenizer, stem, key, files, options)
    return corpus


def tokenizer_key(cfg: DataConfig) -> dict[str, Any]:
    """Everything a trained tokenizer depends on: the train split's files (size, mtime) and the settings."""
    settings = {k: getattr(cfg, k) for k in corpus_format(cfg.format).settings}
    return settings | {
        "version": 1,
        "format": cfg.format,
        "path": str(Path(data_root_path(cfg.path)).expanduser().resolve()) if cfg.path else "",
        "train_file": cfg.train_file,
        "tokenizer": cfg.tokenizer,
        "vocab_size": cfg.subword_vocab_size if cfg.tokenizer in ("bpe", "unigram") else 0,
        "min_freq": cfg.min_freq,
        "sample": cfg.tokenizer_sample,
        "seed": cfg.tokenizer_sample_seed,
        "sources": sources_fingerprint(source_files(cfg, "train")),
    }


def cached_tokenizer(cfg: DataConfig, cache_dir: str | Path, *, progress: bool = True) -> Tokenizer:
    """The tokenizer ``cfg`` trains, from ``cache_dir`` when one was trained there on the same files with the same
    settings (by ``data prepare``, or another run), else trained now on a sample of the train stream and kept
    there. Untrained tokenizers (bytes, pretrained) are made directly."""
    if cfg.tokenizer in UNTRAINED:
        return train_tokenizer(cfg, SplitStream("train", [], ()))
    cache_dir = Path(cache_dir)
    key = tokenizer_key(cfg)
    where = cache_dir / f"tokenizer-{hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]}"
    if (where / TOKENIZER_FILE).is_file():
        return load_tokenizer(where)
    with exclusive(cache_dir):
        if (where / TOKENIZER_FILE).is_file():  # trained by another process while this one waited
            return load_tokenizer(where)
        tok = train_tokenizer(cfg, stream_split(cfg, "train"), progress=progress)
        tmp = where.with_name(where.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        tok.save(tmp)
        write_text_atomic(tmp / "key.json", json.dumps(key))
        os.replace(tmp, where)  # whole or not at all
    return tok


def cache_dir_for(cfg: DataConfig, run_dir: str | Path) -> Path:
    """``data.cache_dir`` when set, else ``<run_dir>/.cache``."""
    return Path(cfg.cache_dir).expanduser() if cfg.cache_dir else Path(run_dir) / ".cache"


def prepare_corpora(
    cfg: DataConfig, run_dir: str | Path, splits: tuple[str, ...] = SPLITS, *, progress: bool = True
) -> tuple[Tokenizer, dict[str, Corpus]]:
    """What a run needs: its tokenizer (``<run_dir>/tokenizer.json``, trained once on a sample of the train split)
    and the encoded splits."""
    tokenizer = prepare_tokenizer(cfg, run_dir)
    cache_dir = cache_dir_for(cfg, run_dir)
    return tokenizer, {split: load_corpus(cfg, split, tokenizer, cache_dir, progress=progress) for split in splits}


def _paths(stem: Path) -> tuple[Path, Path, Path, Path]:
    return (
        stem.with_name(stem.name + ".tokens.bin"),
        stem.with_name(stem.name + ".offsets.bin"),
        stem.with_name(stem.name + ".names.jsonl"),
        stem.with_name(stem.name + ".json"),
    )


def _open(stem: Path, key: dict[str, Any]) -> Corpus | None:
    tokens_path, offsets_path, names_path, meta_path = _paths(stem)
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # not JSON, not UTF-8: no cache (rebuilt)
        return None
    if not isinstance(meta, dict) or meta.get("dtype") not in ("uint8", "uint16", "int32"):
        return None
    if meta.get("key") != key:
        logger.info("token cache %s is stale (corpus or tokenizer changed); rebuilding", meta_path)
        return None
    dtype = np.dtype(meta["dtype"])
    n_tok, n_docs = int(meta["num_tokens"]), int(meta["num_docs"])
    if not tokens_path.is_file() or tokens_path.stat().st_size != n_tok * dtype.itemsize:
        return None
    if not offsets_path.is_file() or offsets_path.stat().st_size != (n_docs + 1) * 8 or not names_path.is_file():
        return None
    return _mapped(tokens_path, np.memmap(offsets_path, dtype=np.int64, mode="r"), names_path, meta)


def _mapped(tokens_path: Path, offsets: np.ndarray, names_path: Path, meta: dict[str, Any]) -> Corpus:
    """The corpus of a cache's files: its tokens memory-mapped, as its JSON ``meta`` describes them."""
    tokens = np.memmap(tokens_path, dtype=np.dtype(meta["dtype"]), mode="r", shape=(int(meta["num_tokens"]),))
    return Corpus(meta["split"], tokens, offsets, int(meta["num_words"]), meta, names_path=names_path)


def _build(
    cfg: DataConfig,
    split: str,
    tokenizer: Tokenizer,
    stem: Path,
    key: dict[str, Any],
    files: FileList,
    options: BuildOptions,
) -> Corpus:
    """The split encoded into the cache at ``stem``, opened as :func:`_open` would open it (without reading back the
    JSON it has just written: with a record per document, that doubles a large corpus's bookkeeping at its end)."""
    progress = options.progress
    stream = stream_split(cfg, split)
    dtype = token_dtype(tokenizer.vocab_size)
    tokens_path, offsets_path, names_path, meta_path = _paths(stem)
    build_dir = stem.with_name(stem.name + ".build")
    built = build_split(
        stream,
        tokenizer,
        build_dir,
        key,
        dtype,
        shard_bytes=options.shard_bytes,
        batch_bytes=options.batch_bytes,
        progress=progress,
        listing=files,
    )
    if built.offsets[-1] == 0:
        shutil.rmtree(build_dir, ignore_errors=True)
        raise ConfigError(
            f"data.path: the {split} split of {cfg.format} corpus {cfg.path or 'pydoc'} is empty (0 tokens); give it some text"
        )
    t = built.totals
    meta = {
        "key": key,
        "split": split,
        "dtype": dtype.name,
        "vocab_size": tokenizer.vocab_size,
        "num_docs": len(built.offsets) - 1,
        "num_tokens": int(built.offsets[-1]),
        "num_words": t.words,
        "num_chars": t.chars,
        "num_bytes": t.bytes,
        "num_articles": t.articles,
        "shards": built.shards,
    }
    meta_path.unlink(missing_ok=True)  # from here until the new JSON lands, no cache looks valid
    os.replace(built.tokens_path, tokens_path)
    os.replace(built.offsets_path, offsets_path)
    os.replace(built.names_path, names_path)
    write_text_atomic(meta_path, json.dumps(meta))
    shutil.rmtree(build_dir, ignore_errors=True)
    mb = t.text_bytes / 1e6
    summary = (
        f"cached {cfg.format} {split}: {meta['num_docs']:,} documents, {meta['num_tokens']:,} tokens, {mb:,.1f} MB of "
        f"text in {built.seconds:,.1f} s ({mb / max(built.seconds, 1e-9):,.1f} MB/s), peak memory {peak_rss_mib():,.0f} MiB"
        + (f", resumed after {built.resumed_from} of {len(built.shards)} shards" if built.resumed_from else "")
    )
    logger.info(summary)
    if progress and sys.stderr.isatty():  # as the progress bar: on a terminal
        print(summary, file=sys.stderr)
    corpus = _mapped(tokens_path, np.memmap(offsets_path, dtype=np.int64, mode="r"), names_path, meta)
    corpus.summary = summary
    return corpus
