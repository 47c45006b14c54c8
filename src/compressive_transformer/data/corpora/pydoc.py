"""pydoc: the help topics shipped with every Python, split 90/5/5 by topic (the demo's corpus)."""

from __future__ import annotations

from pathlib import Path

from compressive_transformer.core.config import DataConfig
from compressive_transformer.data.documents import SplitStream
from compressive_transformer.data.readers import RawSplit, by_fraction, materialize, memory_document, source_files


def files(cfg: DataConfig, split: str) -> list[Path]:
    import pydoc_data.topics  # a large standard-library module: loaded only for this corpus

    return [Path(pydoc_data.topics.__file__)]


def stream(cfg: DataConfig, split: str) -> SplitStream:
    import pydoc_data.topics  # loaded only for this corpus (see files)

    topics = pydoc_data.topics.topics
    sources = tuple(source_files(cfg, split))
    keys = by_fraction(sorted(topics), split)
    return SplitStream(split, [memory_document(k, topics[k], sources) for k in keys], sources)


def read(cfg: DataConfig, split: str) -> RawSplit:
    return materialize(stream(cfg, split))
