"""Corpus readers: a format's files on disk -> the documents of one split, plus the counts metrics need.

Every reader returns a :class:`RawSplit`; documents are ``str`` except where the text is not UTF-8 and the byte
tokenizer is in use (enwik8 always, a binary ``text`` file), where they are ``bytes``. ``num_words`` is the number
of whitespace-separated words of the split: PG-19 divides the total log-likelihood by it whatever the tokenizer.
"""

from __future__ import annotations

import csv
import gzip
import logging
import os
import re
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

from compressive_transformer.core.config import ConfigError, DataConfig
from compressive_transformer.core.registry import CorpusFormat, corpus_format
from compressive_transformer.data.download import Source
from compressive_transformer.data.formats import register_format

logger = logging.getLogger(__name__)

Document = str | bytes
SPLITS = ("train", "validation", "test")
SPLIT_FRACTIONS = (0.90, 0.05, 0.05)
ENWIK8_SIZE = 100_000_000
ENWIK8_SPLIT = (90_000_000, 95_000_000)  # train | validation | test boundaries of the standard split
WIKITEXT_FILES = {"train": "wiki.train.tokens", "validation": "wiki.valid.tokens", "test": "wiki.test.tokens"}
EOS = "<eos>"
UNK = "<unk>"


@dataclass(frozen=True)
class RawSplit:
    """The documents of one split, in order, with where they came from and how many words they hold."""

    split: str
    documents: list[Document]
    names: list[str]  # one per document: topic key, file stem, book id, or the split name
    num_words: int
    sources: tuple[Path, ...]
    num_articles: int = 0  # wikitext: articles counted by their top-level " = Title = " lines


@dataclass(frozen=True)
class Pg19Book:
    id: str
    title: str
    year: int | None
    url: str


def count_words(document: Document) -> int:
    """Whitespace-separated words (the PG-19 normaliser); bytes split on ASCII whitespace."""
    return len(document.split())


def check_split(split: str) -> str:
    if split not in SPLITS:
        raise ConfigError(f"split {split!r}: unknown split; use one of {', '.join(SPLITS)}")
    return split


def read_split(cfg: DataConfig, split: str) -> RawSplit:
    """Read one split of the corpus ``cfg`` describes; user mistakes raise a one-line :class:`ConfigError`."""
    check_split(split)
    raw = corpus_format(cfg.format).read(cfg, split)
    if not raw.documents:
        raise ConfigError(
            f"data.path: the {split} split of {_where(cfg)} has no documents; point data.path at a non-empty corpus"
        )
    return raw


def read_documents(cfg: DataConfig, split: str) -> list[Document]:
    """The raw documents of one split (text, or bytes for enwik8 and non-UTF-8 files under the byte tokenizer)."""
    return read_split(cfg, split).documents


def source_files(cfg: DataConfig, split: str) -> list[Path]:
    """The files a split is read from, without reading them (the token cache fingerprints their size and mtime)."""
    check_split(split)
    return corpus_format(cfg.format).files(cfg, split)


# ---------------------------------------------------------------------------------------------------------------
# pydoc: the help topics shipped with every Python


def _pydoc_files(cfg: DataConfig, split: str) -> list[Path]:
    import pydoc_data.topics  # a large standard-library module: loaded only for this corpus

    return [Path(pydoc_data.topics.__file__)]


def _read_pydoc(cfg: DataConfig, split: str) -> RawSplit:
    import pydoc_data.topics  # loaded only for this corpus (see _pydoc_files)

    topics = pydoc_data.topics.topics
    keys = _by_fraction(sorted(topics), split)
    docs: list[Document] = [topics[k] for k in keys]
    return RawSplit(split, docs, keys, sum(map(count_words, docs)), tuple(source_files(cfg, split)))


def _by_fraction(items: list, split: str) -> list:
    """Deterministic 90/5/5 split of a list by count, at least one item in each split."""
    n = len(items)
    if n < 3:
        return items if split == "train" else []
    n_val = max(1, round(n * SPLIT_FRACTIONS[1]))
    n_test = max(1, round(n * SPLIT_FRACTIONS[2]))
    n_train = n - n_val - n_test
    bounds = {"train": (0, n_train), "validation": (n_train, n_train + n_val), "test": (n_train + n_val, n)}
    lo, hi = bounds[split]
    return items[lo:hi]


# ---------------------------------------------------------------------------------------------------------------
# text: one file split by characters, or a directory of .txt files


def _read_text(cfg: DataConfig, split: str) -> RawSplit:
    root = _existing(cfg)
    if root.is_file():
        data = _decode(root.read_bytes(), root, cfg)
        lo, hi = _line_bounds(data, root)[split]
        logger.info("%s: one file, split 90/5/5 by characters on line boundaries; %s = [%d, %d)", root, split, lo, hi)
        doc = data[lo:hi]
        return RawSplit(split, [doc], [split], count_words(doc), (root,))
    files = source_files(cfg, split)
    docs = [_decode(f.read_bytes(), f, cfg) for f in files]
    return RawSplit(split, docs, [f.stem for f in files], sum(map(count_words, docs)), tuple(files))


def _text_files(cfg: DataConfig, split: str) -> list[Path]:
    root = _existing(cfg)
    if root.is_file():
        return [root]
    split_dirs = _text_split_dirs(root)
    if split_dirs:
        return _txt_files(split_dirs[split])
    everything = _txt_files(root)
    if len(everything) < 3:
        raise ConfigError(
            f"data.path: {root} holds {len(everything)} .txt file(s); a directory needs at least 3 (one per split) "
            "or train/ validation/ test/ subdirectories"
        )
    return _by_fraction(everything, split)


def _text_split_dirs(root: Path) -> dict[str, Path] | None:
    """``train/ validation/ test/`` (``valid/`` accepted) when the directory has them, else None."""
    found = {s: root / s for s in SPLITS if (root / s).is_dir()}
    if "validation" not in found and (root / "valid").is_dir():
        found["validation"] = root / "valid"
    if not found:
        return None
    missing = [s for s in SPLITS if s not in found]
    if missing:
        raise ConfigError(f"data.path: {root} has split subdirectories but no {missing[0]}/; add {root / missing[0]}")
    return found


def _txt_files(directory: Path) -> list[Path]:
    files = sorted(p for p in directory.glob("*.txt") if p.is_file())
    if not files:
        raise ConfigError(f"data.path: {directory} has no .txt files; point data.path at a directory of .txt documents")
    return files


def _line_bounds(data: Document, path: Path) -> dict[str, tuple[int, int]]:
    """90/5/5 cut points of one text, each moved forward to just after the next newline."""
    n = len(data)
    newline = b"\n" if isinstance(data, bytes) else "\n"
    cuts = []
    for frac in (SPLIT_FRACTIONS[0], SPLIT_FRACTIONS[0] + SPLIT_FRACTIONS[1]):
        c = int(n * frac)
        nl = data.find(newline, c)  # type: ignore[arg-type]
        cuts.append(n if nl < 0 else nl + 1)
    bounds = {"train": (0, cuts[0]), "validation": (cuts[0], cuts[1]), "test": (cuts[1], n)}
    if any(hi <= lo for lo, hi in bounds.values()):
        raise ConfigError(
            f"data.path: {path} ({n} characters) is too short to split 90/5/5 on line boundaries; "
            "use a longer file or a directory with train/ validation/ test/"
        )
    return bounds


def decode_file(path: str | Path, tokenizer: str) -> Document:
    """A whole file as UTF-8 text, or raw bytes for the byte tokenizer when it is not text."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: is not a file; give a text file")
    return _decode_bytes(path.read_bytes(), path, tokenizer)


def _decode(data: bytes, path: Path, cfg: DataConfig) -> Document:
    return _decode_bytes(data, path, cfg.tokenizer)


def _decode_bytes(data: bytes, path: Path, tokenizer: str) -> Document:
    """UTF-8 text, or the raw bytes when only the byte tokenizer will see them; binary data for a text tokenizer is an error."""
    bad = data.find(b"\x00")  # NUL never occurs in text, though it is valid UTF-8
    if bad < 0:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            bad = e.start
    if tokenizer == "bytes":
        return data
    raise ConfigError(
        f"data.tokenizer: {path} is binary or not UTF-8 (byte {bad}); the {tokenizer!r} tokenizer needs text, "
        "set tokenizer = 'bytes'"
    )


# ---------------------------------------------------------------------------------------------------------------
# enwik8: 10^8 bytes of Wikipedia XML, split 90M / 5M / 5M


def _read_enwik8(cfg: DataConfig, split: str) -> RawSplit:
    path = _enwik8_file(cfg)
    data = _enwik8_bytes(path)
    n = len(data)
    if n == ENWIK8_SIZE:
        c1, c2 = ENWIK8_SPLIT
    else:
        if n < 3:
            raise ConfigError(f"data.path: {path} holds {n} bytes; enwik8 needs at least 3 to split")
        c1, c2 = round(n * SPLIT_FRACTIONS[0]), round(n * (SPLIT_FRACTIONS[0] + SPLIT_FRACTIONS[1]))
        warnings.warn(
            f"{path} has {n:,} bytes, not the 100,000,000 of enwik8: split 90/5/5 proportionally "
            "(label results 'enwik8 prefix')",
            stacklevel=3,
        )
    lo, hi = {"train": (0, c1), "validation": (c1, c2), "test": (c2, n)}[split]
    doc = data[lo:hi]
    return RawSplit(split, [doc], [split], count_words(doc), (path,))


def _enwik8_file(cfg: DataConfig) -> Path:
    root = _existing(cfg)
    if root.is_file():
        return root
    for name in ("enwik8", "enwik8.zip", "enwik8.gz"):
        if (root / name).is_file():
            return root / name
    raise ConfigError(f"data.path: {root} has no enwik8, enwik8.zip or enwik8.gz; point data.path at the enwik8 file")


def _enwik8_bytes(path: Path) -> bytes:
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                return f.read()
        if path.suffix == ".zip":
            with zipfile.ZipFile(path) as z:
                names = [n for n in z.namelist() if not n.endswith("/")]
                member = "enwik8" if "enwik8" in names else (names[0] if len(names) == 1 else None)
                if member is None:
                    raise ConfigError(
                        f"data.path: {path} has no member 'enwik8'; use the enwik8.zip of the Hutter prize"
                    )
                return z.read(member)
    except (OSError, zipfile.BadZipFile, EOFError) as e:
        raise ConfigError(f"data.path: {path} is not a readable archive ({e}); download it again") from None
    return path.read_bytes()


# ---------------------------------------------------------------------------------------------------------------
# wikitext: wiki.{train,valid,test}.tokens, word tokens with <eos> per line


def _read_wikitext(cfg: DataConfig, split: str) -> RawSplit:
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


def _wikitext_file(cfg: DataConfig, split: str) -> Path:
    root = _existing(cfg)
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


# ---------------------------------------------------------------------------------------------------------------
# pg19: train/ validation/ test/ of <id>.txt books, metadata.csv without header


def _read_pg19(cfg: DataConfig, split: str) -> RawSplit:
    books = _pg19_books(cfg, split)
    docs: list[Document] = []
    for f in books:
        docs.append(_decode(f.read_bytes(), f, cfg))
    return RawSplit(split, docs, [f.stem for f in books], sum(map(count_words, docs)), tuple(books))


def _pg19_books(cfg: DataConfig, split: str) -> list[Path]:
    root = _existing(cfg)
    directory = root / split
    if not directory.is_dir():
        raise ConfigError(f"data.path: PG-19 directory {root} has no {split}/ subdirectory; add {directory}")
    books = [p for p in directory.glob("*.txt") if p.is_file()]
    if not books:
        raise ConfigError(f"data.path: {directory} has no <id>.txt books; put the {split} books there")
    return sorted(books, key=lambda p: (0, int(p.stem), "") if p.stem.isdigit() else (1, 0, p.stem))


def read_pg19_metadata(directory: str | Path) -> dict[str, Pg19Book]:
    """``metadata.csv`` as PG-19 ships it: ``id,title,year,url`` rows, no header, titles quoted where needed."""
    path = Path(directory) / "metadata.csv"
    if not path.is_file():
        raise ConfigError(f"data.path: {directory} has no metadata.csv; download it with the PG-19 books")
    books: dict[str, Pg19Book] = {}
    with path.open(newline="", encoding="utf-8") as f:
        for i, row in enumerate(csv.reader(f), start=1):
            if not row:
                continue
            if len(row) != 4:
                raise ConfigError(f"{path}:{i}: expected 4 fields (id,title,year,url), got {len(row)}; fix the line")
            book_id, title, year, url = row
            books[book_id] = Pg19Book(book_id, title, int(year) if year.strip().isdigit() else None, url)
    return books


# ---------------------------------------------------------------------------------------------------------------


DATA_ROOT_ENV = "CT_DATA_ROOT"


def data_root_path(path: str) -> str:
    """``data/<corpus>`` (a relative path under ``data``, where ``data download`` puts corpora) read from
    ``$CT_DATA_ROOT/<corpus>`` when that variable is set; any other path unchanged."""
    root = os.environ.get(DATA_ROOT_ENV)
    parts = Path(path).parts if path else ()
    if root and parts and parts[0] == "data" and not Path(path).is_absolute():
        return str(Path(root).expanduser().joinpath(*parts[1:]))
    return path


def _existing(cfg: DataConfig) -> Path:
    path = Path(data_root_path(cfg.path)).expanduser()
    if not path.exists():
        hint = (
            f"`compressive-transformer data download` fills data/, or set {DATA_ROOT_ENV} to the directory holding it"
        )
        raise ConfigError(f"data.path: {path} does not exist; point it at the {cfg.format} corpus ({hint})")
    return path


def _where(cfg: DataConfig) -> str:
    return f"{cfg.format} corpus {cfg.path}" if corpus_format(cfg.format).needs_path else f"the {cfg.format} corpus"


# ---------------------------------------------------------------------------------------------------------------
# the built-in formats; download sizes and sha256 as recorded by the HuggingFace ``datasets`` checksums of the same URLs


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


register_format(CorpusFormat("pydoc", _pydoc_files, _read_pydoc, needs_path=False))
register_format(CorpusFormat("text", _text_files, _read_text))
register_format(
    CorpusFormat(
        "enwik8",
        lambda cfg, split: [_enwik8_file(cfg)],
        _read_enwik8,
        sources={
            "enwik8": Source(
                url="http://mattmahoney.net/dc",
                filename="enwik8.zip",
                size=36_445_475,
                sha256="547994d9980ebed1288380d652999f38a14fe291a6247c157c3d33d4932534bc",
                members={"enwik8": 100_000_000},
                target="enwik8",
            ),
        },
        tokenizers=("bytes",),
        tokenizer_reason="enwik8 is modelled byte by byte (it is not all valid UTF-8)",
    )
)
register_format(
    CorpusFormat(
        "wikitext",
        lambda cfg, split: [_wikitext_file(cfg, split)],
        _read_wikitext,
        sources={
            "wikitext-103": _wikitext_source(
                "wikitext-103", 190_229_076, "242ba0f20b329cfdf1ccc61e9e9e5b59becf189db7f7a81cd2a0e2fc31539590"
            ),
            "wikitext-2": _wikitext_source(
                "wikitext-2", 4_475_746, "92675f1d63015c1c8b51f1656a52d5bdbc33aafa60cc47a218a66e7ee817488c"
            ),
        },
        train_file=True,
    )
)
register_format(
    CorpusFormat(
        "pg19",
        _pg19_books,
        _read_pg19,
        sources={"pg19": Source(url="https://storage.googleapis.com", bucket="deepmind-gutenberg", target="pg19")},
    )
)
