"""pydoc: the help topics shipped with every Python, split 90/5/5 by topic (the demo's corpus)."""

from __future__ import annotations

from pathlib import Path

from compressive_transformer.core.config import DataConfig
from compressive_transformer.data.readers import Document, RawSplit, by_fraction, count_words, source_files


def files(cfg: DataConfig, split: str) -> list[Path]:
    import pydoc_data.topics  # a large standard-library module: loaded only for this corpus

    return [Path(pydoc_data.topics.__file__)]


def read(cfg: DataConfig, split: str) -> RawSplit:
    import pydoc_data.topics  # loaded only for this corpus (see files)

    topics = pydoc_data.topics.topics
    keys = by_fraction(sorted(topics), split)
    docs: list[Document] = [topics[k] for k in keys]
    return RawSplit(split, docs, keys, sum(map(count_words, docs)), tuple(source_files(cfg, split)))
