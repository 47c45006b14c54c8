"""Registering a corpus format: one :class:`~compressive_transformer.core.registry.CorpusFormat` per corpus, read by
config validation (``data.format``), the readers and the token cache (``files``, ``read``), ``data download`` and
the CLI's choices (``sources``). Adding a corpus is one module that builds its format and calls
:func:`register_format`."""

from __future__ import annotations

from compressive_transformer.core.registry import FORMATS, CorpusFormat, corpus_format


def register_format(fmt: CorpusFormat) -> CorpusFormat:
    """Make ``fmt.name`` usable as ``data.format`` and its sources downloadable (``data.download.sources`` reads
    them from the format); a name registered again is replaced."""
    FORMATS[fmt.name] = fmt
    return fmt


def path_formats() -> list[str]:
    """The formats read from a file or directory (``data.path``): what ``evaluate --data DIR --format`` accepts."""
    return [name for name, fmt in FORMATS.items() if fmt.needs_path]


__all__ = ["CorpusFormat", "corpus_format", "path_formats", "register_format"]
