"""wikitext: ``wiki.{train,valid,test}.tokens``, word tokens with ``<eos>`` per line (WikiText-2 and -103)."""

from __future__ import annotations

import re
from pathlib import Path

from compressive_transformer.core.config import ConfigError, DataConfig
from compressive_transformer.data.download import Source
from compressive_transformer.data.readers import EOS, RawSplit, count_words, existing_path

WIKITEXT_FILES = {"train": "wiki.train.tokens", "validation": "wiki.valid.tokens", "test": "wiki.test.tokens"}


def read(cfg: DataConfig, split: str) -> RawSplit:
    path = _wikitext_file(cfg, split)
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"data.path: {path} is not UTF-8 text (byte {e.start}); WikiText files are UTF-8, download them again"
        ) from None
    doc, n_articles = wikitext_stream(text)
    return RawSplit(split, [doc], [split], count_words(doc), (path,), n_articles)


def wikitext_stream(text: str) -> tuple[str, int]:
    """Each line's tokens plus ``<eos>`` (blank lines too, which reproduces the published split sizes, e.g. 245,569
    test tokens for WikiText-103) as one contiguous document, and the number of articles in it."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final newline ends the last line; it does not start another
    out = [f"{line.strip()} {EOS}".lstrip() for line in lines]
    return "\n".join(out), count_wikitext_articles(lines)


_TITLE = re.compile(r" = [^=](.*[^=])? = ")


def count_wikitext_articles(lines: list[str]) -> int:
    """Articles start at a top-level title line `` = Title = `` (one ``=`` each side) between blank lines."""
    n = 0
    for i, line in enumerate(lines):
        if _TITLE.fullmatch(line.rstrip("\n")):
            before = i == 0 or not lines[i - 1].strip()
            after = i + 1 >= len(lines) or not lines[i + 1].strip()
            n += before and after
    return n


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
