"""Data: corpus readers, tokenizers, the memory-mapped token cache, the batch-of-streams iterator, downloads.

The names below are imported on first use (PEP 562), so that a module of this package can be imported alone
without the rest (a word tokenizer's worker processes import only :mod:`~compressive_transformer.data.word_ids`).
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> the module (below this package) that defines it
_EXPORTS = {
    **dict.fromkeys(("Corpus", "cache_dir_for", "load_corpus", "prepare_corpora"), "cache"),
    **dict.fromkeys(("Pg19Book", "read_pg19_metadata"), "corpora.pg19"),
    **dict.fromkeys(("DownloadError", "Source", "download", "sources"), "download"),
    **dict.fromkeys(("SPLITS", "RawSplit", "count_words", "read_documents", "read_split", "stream_split"), "readers"),
    **dict.fromkeys(("prepare_tokenizer", "train_tokenizer"), "sample"),
    **dict.fromkeys(("IGNORE_INDEX", "Batch", "StreamBatcher"), "streams"),
    **dict.fromkeys(
        ("ByteTokenizer", "SubwordTokenizer", "Tokenizer", "WordTokenizer", "build_tokenizer", "load_tokenizer"),
        "tokenizers",
    ),
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


__all__ = sorted(_EXPORTS)
