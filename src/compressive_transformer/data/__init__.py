"""Data: corpus readers, tokenizers, the memory-mapped token cache, the batch-of-streams iterator, downloads.

The names below are imported on first use (PEP 562), so that a module of this package can be imported alone
without the rest (a word tokenizer's worker processes import only :mod:`~compressive_transformer.data.word_ids`).
"""

from __future__ import annotations

from compressive_transformer.core.lazy import lazy_names

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


__getattr__, __dir__ = lazy_names(__name__, _EXPORTS)

# `download` names a module of this package as well as its function: importing the module (anything may) would set
# the package's attribute to the module, so the function is bound here, as an eager import would have bound it
from compressive_transformer.data.download import download as download  # noqa: E402

__all__ = sorted(_EXPORTS)
