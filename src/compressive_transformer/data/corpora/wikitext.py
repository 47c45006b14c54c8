"""wikitext: ``wiki.{train,valid,test}.tokens``, word tokens with ``<eos>`` per line (WikiText-2 and -103)."""

from __future__ import annotations

import codecs
import itertools
import re
from pathlib import Path
from typing import Iterator

from compressive_transformer.core.config import ConfigError, DataConfig
from compressive_transformer.data.documents import READ_BLOCK, DocumentSource, Piece, SplitStream, read_blocks, rechunk
from compressive_transformer.data.download import Source
from compressive_transformer.data.readers import EOS, RawSplit, existing_path, materialize

WIKITEXT_FILES = {"train": "wiki.train.tokens", "validation": "wiki.valid.tokens", "test": "wiki.test.tokens"}


def stream(cfg: DataConfig, split: str) -> SplitStream:
    """The split's file as one document (:func:`wikitext_stream`), read a block at a time."""
    path = _wikitext_file(cfg, split)
    return SplitStream(
        split, [DocumentSource(split, path.stat().st_size, (path,), lambda: wikitext_pieces(path))], (path,)
    )


def read(cfg: DataConfig, split: str) -> RawSplit:
    return materialize(stream(cfg, split))


def wikitext_stream(text: str) -> tuple[str, int]:
    """Each line's tokens plus ``<eos>`` (blank lines too, which reproduces the published split sizes, e.g. 245,569
    test tokens for WikiText-103) as one contiguous document, and the number of articles in it."""
    pieces = list(_document_pieces(iter([text]), [0]))
    return "".join(str(p.text) for p in pieces), sum(p.articles for p in pieces)


def wikitext_pieces(path: Path) -> Iterator[Piece]:
    """The pieces of :func:`wikitext_stream` of a file, read and decoded a block at a time."""
    consumed = [0]

    def texts() -> Iterator[str]:
        decoder = codecs.getincrementaldecoder("utf-8")("strict")
        with path.open("rb") as f:
            for data in itertools.chain(read_blocks(f, None), [b""]):
                pending = len(decoder.getstate()[0])
                try:
                    yield decoder.decode(data, final=not data)
                except UnicodeDecodeError as e:
                    raise ConfigError(
                        f"data.path: {path} is not UTF-8 text (byte {consumed[0] - pending + e.start}); WikiText files "
                        "are UTF-8, download them again"
                    ) from None
                consumed[0] += len(data)

    yield from _document_pieces(texts(), consumed)


def _document_pieces(texts: Iterator[str], consumed: list[int]) -> Iterator[Piece]:
    """The lines of ``texts`` (split on ``\\n``; a final newline starts no line) as ``tokens <eos>`` lines joined
    by newlines, in pieces; a piece counts the articles whose title lines were decided while it was made (a title
    needs a blank line or the text's end on each side, so it is decided one line late). ``consumed[0]``: source
    bytes read so far (progress)."""
    articles = [0]

    def blocks() -> Iterator[str]:
        parts: list[str] = []
        size, before, line = 0, None, None
        for i, nxt in enumerate(_lines(texts)):
            if i:
                articles[0] += _is_article(before, line, nxt)
                before = line
            line = nxt
            part = f"{nxt.strip()} {EOS}".lstrip()
            parts.append(part if not i else "\n" + part)
            size += len(part)
            if size >= READ_BLOCK:
                yield "".join(parts)
                parts, size = [], 0
        if line is not None:
            articles[0] += _is_article(before, line, None)
        yield "".join(parts)

    told_bytes = told_articles = 0
    for text in rechunk(blocks()):
        yield Piece(text, consumed[0] - told_bytes, articles[0] - told_articles)
        told_bytes, told_articles = consumed[0], articles[0]
    if articles[0] > told_articles:  # decided by the last line, after the last piece was cut
        yield Piece("", 0, articles[0] - told_articles)


def _lines(texts: Iterator[str]) -> Iterator[str]:
    """``"".join(texts).split("\\n")`` without its last element when that is empty, one line at a time."""
    carry = ""
    for text in texts:
        if not text:
            continue
        lines = (carry + text).split("\n")
        carry = lines.pop()
        yield from lines
    if carry:
        yield carry


_TITLE = re.compile(r" = [^=](.*[^=])? = ")


def _is_article(before: str | None, line: str, after: str | None) -> bool:
    """Articles start at a top-level title line `` = Title = `` (one ``=`` each side) between blank lines (or the
    text's ends)."""
    return bool(_TITLE.fullmatch(line)) and not (before or "").strip() and not (after or "").strip()


def count_wikitext_articles(lines: list[str]) -> int:
    """The articles of a text's lines (:func:`_is_article` of each)."""
    return sum(
        _is_article(lines[i - 1] if i else None, line, lines[i + 1] if i + 1 < len(lines) else None)
        for i, line in enumerate(lines)
    )


def files(cfg: DataConfig, split: str) -> list[Path]:
    return [_wikitext_file(cfg, split)]


def _wikitext_file(cfg: DataConfig, split: str) -> Path:
    root = existing_path(cfg)
    if not root.is_dir():
        raise ConfigError(
            f"data.path: {root} is a file; wikitext needs the directory holding wiki.{{train,valid,test}}.tokens"
        )
    if split == "train" and cfg.train_file:
        path = Path(cfg.train_file) if Path(cfg.train_file).is_absolute() else root / cfg.train_file
        if not path.is_file():
            raise ConfigError(f"data.train_file: {path} does not exist; name a file in {root}")
        return path
    path = root / WIKITEXT_FILES[split]
    if not path.is_file():
        if split == "train":
            raise ConfigError(
                f"data.train_file: {root} has no {path.name}; download it, or set data.train_file = 'wiki.valid.tokens' "
                "to train on another file (and say so in results)"
            )
        raise ConfigError(f"data.path: {root} has no {path.name}; point data.path at a complete WikiText directory")
    train = Path(cfg.train_file) if Path(cfg.train_file).is_absolute() else root / cfg.train_file
    if split != "train" and cfg.train_file and train.is_file() and train.resolve() == path.resolve():
        raise ConfigError(
            f"data.train_file: {path.name} is the training text of this run, so it cannot also be its {split} split; "
            "evaluate on another split (e.g. --split test)"
        )
    return path


# download sizes and sha256 as recorded by the HuggingFace ``datasets`` checksums of the same URLs
def _wikitext_source(name: str, size: int, sha256: str) -> Source:
    """One of the Salesforce WikiText archives: ``<name>/wiki.{train,valid,test}.tokens`` in ``<name>-v1.zip``."""
    return Source(
        url="https://s3.amazonaws.com/research.metamind.io/wikitext",
        filename=f"{name}-v1.zip",
        size=size,
        sha256=sha256,
        members={f"{name}/wiki.{s}.tokens": None for s in ("train", "valid", "test")},
        target=name,
    )


SOURCES = {
    "wikitext-103": _wikitext_source(
        "wikitext-103", 190_229_076, "242ba0f20b329cfdf1ccc61e9e9e5b59becf189db7f7a81cd2a0e2fc31539590"
    ),
    "wikitext-2": _wikitext_source(
        "wikitext-2", 4_475_746, "92675f1d63015c1c8b51f1656a52d5bdbc33aafa60cc47a218a66e7ee817488c"
    ),
}
