"""Encoded splits cached on disk as memory-mapped arrays, so a corpus is tokenized once per tokenizer.

Per split three files share a stem: ``.tokens.bin`` (ids, ``uint16`` when they fit else ``int32``), ``.offsets.bin``
(``int64``, document ``i`` is ``tokens[offsets[i]:offsets[i+1]]``) and ``.json`` (the fingerprint and counts). The
JSON is removed first and written last, each file via temp file + ``os.replace``: an interrupted build leaves no
JSON, hence no cache that looks valid.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from compressive_transformer.core.config import ConfigError, DataConfig
from compressive_transformer.core.fileio import exclusive, write_text_atomic
from compressive_transformer.core.registry import corpus_format
from compressive_transformer.data.readers import SPLITS, check_split, data_root_path, read_split, source_files
from compressive_transformer.data.tokenizers import Tokenizer, prepare_tokenizer
from compressive_transformer.data.units import TextSize, texts_size

logger = logging.getLogger(__name__)
CACHE_VERSION = 2  # 2: the split's characters and bytes are recorded (bits per character / byte)


@dataclass
class Corpus:
    """One encoded split: a flat token array and the offsets of its documents."""

    split: str
    tokens: np.ndarray  # (num_tokens,) memmap of uint16 / int32 ids
    doc_offsets: np.ndarray  # (num_docs + 1,) int64, starts at 0, ends at num_tokens
    num_words: int
    meta: dict[str, Any] = field(default_factory=dict)

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
        return list(self.meta.get("names", []))

    def document(self, i: int) -> np.ndarray:
        """The ids of document ``i`` (a view into the memmap)."""
        if not -self.num_docs <= i < self.num_docs:
            raise IndexError(f"document {i} out of range for {self.num_docs} documents")
        i %= self.num_docs
        return self.tokens[self.doc_offsets[i] : self.doc_offsets[i + 1]]


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.int32)


def cache_key(cfg: DataConfig, split: str, tokenizer: Tokenizer) -> dict[str, Any]:
    """Everything the cached ids depend on: corpus location, source files' size and mtime, and the tokenizer."""
    sources = [[str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns] for p in source_files(cfg, split)]
    settings = {k: getattr(cfg, k) for k in corpus_format(cfg.format).settings}
    return settings | {
        "version": CACHE_VERSION,
        "format": cfg.format,
        "path": str(Path(data_root_path(cfg.path)).expanduser().resolve()) if cfg.path else "",
        "train_file": cfg.train_file,
        "split": split,
        "tokenizer_kind": tokenizer.kind,
        "tokenizer": tokenizer.fingerprint,
        "sources": sources,
    }


def load_corpus(cfg: DataConfig, split: str, tokenizer: Tokenizer, cache_dir: str | Path) -> Corpus:
    """The encoded split, from the cache when its fingerprint matches, else encoded now and cached."""
    check_split(split)
    cache_dir = Path(cache_dir)
    key = cache_key(cfg, split, tokenizer)
    stem = cache_dir / f"{cfg.format}-{split}-{hashlib.sha256(key['path'].encode()).hexdigest()[:10]}"
    corpus = _open(stem, key)
    if corpus is None:
        with exclusive(cache_dir):  # processes sharing a cache (a study's parallel runs) build each split once
            corpus = _open(stem, key)  # another process may have built it while this one waited
            if corpus is None:
                _build(cfg, split, tokenizer, stem, key)
                corpus = _open(stem, key)
        assert corpus is not None, f"cache at {stem} unreadable right after writing it"
    return corpus


def cache_dir_for(cfg: DataConfig, run_dir: str | Path) -> Path:
    """``data.cache_dir`` when set, else ``<run_dir>/.cache``."""
    return Path(cfg.cache_dir).expanduser() if cfg.cache_dir else Path(run_dir) / ".cache"


def prepare_corpora(
    cfg: DataConfig, run_dir: str | Path, splits: tuple[str, ...] = SPLITS
) -> tuple[Tokenizer, dict[str, Corpus]]:
    """What a run needs: its tokenizer (``<run_dir>/tokenizer.json``, trained once) and the encoded splits."""
    tokenizer = prepare_tokenizer(cfg, run_dir)
    cache_dir = cache_dir_for(cfg, run_dir)
    return tokenizer, {split: load_corpus(cfg, split, tokenizer, cache_dir) for split in splits}


def _paths(stem: Path) -> tuple[Path, Path, Path]:
    return (
        stem.with_name(stem.name + ".tokens.bin"),
        stem.with_name(stem.name + ".offsets.bin"),
        stem.with_name(stem.name + ".json"),
    )


def _open(stem: Path, key: dict[str, Any]) -> Corpus | None:
    tokens_path, offsets_path, meta_path = _paths(stem)
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # not JSON, not UTF-8: no cache (rebuilt)
        return None
    if not isinstance(meta, dict) or meta.get("dtype") not in ("uint16", "int32"):
        return None
    if meta.get("key") != key:
        logger.info("token cache %s is stale (corpus or tokenizer changed); rebuilding", meta_path)
        return None
    dtype = np.dtype(meta["dtype"])
    n_tok, n_docs = int(meta["num_tokens"]), int(meta["num_docs"])
    if not tokens_path.is_file() or tokens_path.stat().st_size != n_tok * dtype.itemsize:
        return None
    if not offsets_path.is_file() or offsets_path.stat().st_size != (n_docs + 1) * 8:
        return None
    tokens = np.memmap(tokens_path, dtype=dtype, mode="r", shape=(n_tok,))
    offsets = np.fromfile(offsets_path, dtype=np.int64)
    return Corpus(meta["split"], tokens, offsets, int(meta["num_words"]), meta)


def _build(cfg: DataConfig, split: str, tokenizer: Tokenizer, stem: Path, key: dict[str, Any]) -> None:
    raw = read_split(cfg, split)
    size = texts_size(raw.documents)
    dtype = token_dtype(tokenizer.vocab_size)
    tokens_path, offsets_path, meta_path = _paths(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    offsets, names = [0], []
    fd, tmp_tokens = tempfile.mkstemp(dir=stem.parent, prefix=tokens_path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            docs = tqdm(
                zip(raw.documents, raw.names),
                total=len(raw.documents),
                desc=f"tokenize {split}",
                unit="doc",
                disable=None,
            )
            for doc, name in docs:
                ids = tokenizer.encode_array(doc)
                if len(ids) == 0:
                    continue  # an empty document holds nothing to predict and would only add a reset
                ids.astype(dtype).tofile(f)
                offsets.append(offsets[-1] + len(ids))
                names.append(name)
        if offsets[-1] == 0:
            raise ConfigError(
                f"data.path: the {split} split of {cfg.format} corpus {cfg.path or 'pydoc'} is empty (0 tokens); give it some text"
            )
        fd2, tmp_offsets = tempfile.mkstemp(dir=stem.parent, prefix=offsets_path.name, suffix=".tmp")
        with os.fdopen(fd2, "wb") as f:
            np.asarray(offsets, dtype=np.int64).tofile(f)
        meta_path.unlink(missing_ok=True)  # from here until the new JSON lands, no cache looks valid
        os.replace(tmp_tokens, tokens_path)
        os.replace(tmp_offsets, offsets_path)
    except BaseException:
        for tmp in (tmp_tokens, locals().get("tmp_offsets")):
            if tmp and os.path.exists(tmp):
                os.unlink(tmp)
        raise
    meta = {
        "key": key,
        "split": split,
        "dtype": dtype.name,
        "vocab_size": tokenizer.vocab_size,
        "num_docs": len(offsets) - 1,
        "num_tokens": offsets[-1],
        "num_words": raw.num_words,
        "num_chars": size.chars,
        "num_bytes": size.bytes,
        "num_articles": raw.num_articles,
        "names": names,
    }
    write_text_atomic(meta_path, json.dumps(meta))
    logger.info(
        "cached %s %s: %d documents, %d tokens, %d words",
        cfg.format,
        split,
        len(offsets) - 1,
        offsets[-1],
        raw.num_words,
    )
