"""Data: corpus readers, tokenizers, the memory-mapped token cache, the batch-of-streams iterator, downloads."""

from compressive_transformer.data.cache import Corpus, cache_dir_for, load_corpus, prepare_corpora
from compressive_transformer.data.corpora.pg19 import Pg19Book, read_pg19_metadata
from compressive_transformer.data.download import DownloadError, Source, download, sources
from compressive_transformer.data.readers import SPLITS, RawSplit, count_words, read_documents, read_split, stream_split
from compressive_transformer.data.sample import prepare_tokenizer, train_tokenizer
from compressive_transformer.data.streams import IGNORE_INDEX, Batch, StreamBatcher
from compressive_transformer.data.tokenizers import (
    ByteTokenizer,
    SubwordTokenizer,
    Tokenizer,
    WordTokenizer,
    build_tokenizer,
    load_tokenizer,
)

__all__ = [
    "SPLITS",
    "IGNORE_INDEX",
    "Batch",
    "ByteTokenizer",
    "Corpus",
    "DownloadError",
    "Pg19Book",
    "RawSplit",
    "Source",
    "StreamBatcher",
    "SubwordTokenizer",
    "Tokenizer",
    "WordTokenizer",
    "build_tokenizer",
    "cache_dir_for",
    "count_words",
    "download",
    "sources",
    "load_corpus",
    "load_tokenizer",
    "prepare_corpora",
    "prepare_tokenizer",
    "read_documents",
    "read_pg19_metadata",
    "read_split",
    "stream_split",
    "train_tokenizer",
]
