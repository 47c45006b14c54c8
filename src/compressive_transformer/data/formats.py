"""Corpus formats: the table of :class:`~compressive_transformer.core.registry.CorpusFormat` rows (the built-ins are
listed there, each naming its module of ``data/corpora/``), read by config validation (``data.format``), the readers
and the token cache (``files``, ``read``), ``data download`` and the CLI's choices (``sources``). Adding a corpus is one
module with its ``files`` and ``read`` plus one row, registered with :func:`register_format`."""

from __future__ import annotations

from compressive_transformer.core.registry import FORMATS, CorpusFormat, corpus_format, register_format


def path_formats() -> list[str]:
    """The formats read from a file or directory (``data.path``): what ``evaluate --data DIR --format`` accepts."""
    return [name for name, fmt in FORMATS.items() if fmt.needs_path]


__all__ = ["CorpusFormat", "corpus_format", "path_formats", "register_format"]
