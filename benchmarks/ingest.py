"""Corpus ingestion at scale: the project's token-cache build against Hugging Face ``tokenizers`` used as its README
shows it, on seeded synthetic corpora in PG-19's, enwik8's and WikiText's layouts, at several sizes.

    python -m benchmarks.ingest                          # the real run: bytes to 2 GB, words and bpe to 0.5 GB
    python -m benchmarks.ingest --quick --out /tmp/ingest   # smoke run

Per corpus (format x size) and tokenizer, three pipelines, each one child process (its peak RSS is its own:
``VmHWM``, reset between phases; CPU time from ``os.wait4``; the PSS of its process tree sampled):

- ``ours``: the public path of a ``train`` run, ``data.cache.prepare_corpora`` into a fresh run directory, after
  ``prepare_tokenizer`` (so tokenizer training and encoding are timed apart);
- ``anchor``: the library alone. bpe/unigram: a byte-level tokenizer with the settings of the project's
  ``SubwordTokenizer.train``, ``tokenizer.train(files, trainer)`` on the train files (on the files of the project's
  tokenizer sample when its run recorded one, so training cost is matched), then ``encode_batch`` over batches of 16
  documents, ids streamed to one flat file per split; words: ``WordLevel`` on ``WhitespaceSplit``; bytes: a plain
  copy of each document's UTF-8 bytes into ``uint16`` ids (disk speed);
- ``anchor-encode`` (words, bpe, unigram): the anchor's encoding loop with the project's trained tokenizer: its
  token count and ids (sha256 per split) must equal ours — the equivalence check.

Documents are what the project's format reads: PG-19 books whole; WikiText each line stripped plus `` <eos>``;
enwik8 the file's bytes split 90 / 5 / 5. Measurements are
written to ``<out>/results.json`` as each ends; one with the same settings is reused unless ``--force``. Corpora are
written under ``--work`` (never inside the repository) and reused while their manifest matches.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime
import functools
import hashlib
import itertools
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np

from benchmarks.common import ROOT, repo_path

GENERATOR_VERSION = 1  # bump when the synthetic text changes: corpora with another version are rewritten
FORMATS = ("pg19", "wikitext", "enwik8")
TOKENIZERS = ("bytes", "words", "bpe", "unigram")
FORMAT_TOKENIZERS = {"enwik8": ("bytes",)}  # the project models enwik8 byte by byte only
PIPELINES = ("ours", "anchor", "anchor-encode")
# GB per tokenizer: bytes reach disk speed, so they go to 2 GB; a 32K BPE costs minutes per 100 MB on 2 cores
DEFAULT_SIZES = {
    "bytes": [0.1, 0.5, 2.0],
    "words": [0.1, 0.25, 0.5],
    "bpe": [0.1, 0.25, 0.5],
    "unigram": [0.1, 0.25, 0.5],
}
SPLITS = ("train", "validation", "test")
BATCH_DOCS = 16  # documents per encode_batch call of the anchor
LINE_CHUNK = 384 << 10  # one-file corpora: lines grouped into documents of about a PG-19 book's characters
BOOK_BYTES = 385_000  # a typical PG-19 book (the mean is ~400 KB: 11.7 GB / 28,752 books)
PG19_FULL = {"gb": 11.7, "books": 28_602}
EOS, UNK = "<eos>", "<unk>"
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "ingest"
DEFAULT_WORK = Path(tempfile.gettempdir()) / "ct-ingest-bench"
GB = 1e9
MIB = 1 << 20

# ----------------------------------------------------------------------------------------------------------------
# synthetic corpora


LETTERS = np.frombuffer(b"etaoinshrdlcumwfgypbvkjxqz", dtype=np.uint8)
LETTER_P = np.array([12.7, 9.1, 8.2, 7.5, 7.0, 6.7, 6.3, 6.1, 6.0, 4.3, 4.0, 2.8, 2.8, 2.4, 2.4, 2.2, 2.0, 2.0, 1.9,
                     1.5, 1.0, 0.8, 0.15, 0.15, 0.1, 0.07])  # fmt: skip
ACCENTED = ("é", "ö", "ñ", "ç", "à", "ß")  # 2 UTF-8 bytes
WIDE = ("—", "€", "“", "”", "日")  # 3 UTF-8 bytes
WIDTH = 24  # bytes per vocabulary row: the longest word, its separator and 4 bytes of line / paragraph breaks
TABLE_BITS = 22  # the Zipf sampler: a uniform index into 2^22 slots, each holding a rank (inverse-CDF table)


@dataclasses.dataclass(frozen=True)
class Vocabulary:
    """~50K word types as fixed-width rows, so a text is one gather and one boolean compress (numpy, no loop)."""

    rows: np.ndarray  # (V, WIDTH / 8) uint64: a word's UTF-8 bytes then a space, zero-padded
    masks: np.ndarray  # (V, WIDTH / 8) uint64: 0xff where the row holds a byte of the word or its space
    lens: np.ndarray  # (V,) int64 bytes of word + space
    table: np.ndarray  # (2^TABLE_BITS,) int32 ranks: table[uniform index] is Zipf(1) distributed over the types
    mean_len: float


def vocabulary(rng: np.random.Generator, style: str, types: int = 50_000) -> Vocabulary:
    """Random letter strings, shorter ones more frequent; ``prose`` (PG-19, enwik8) has capitals and punctuation
    attached, ``tokens`` (WikiText) has punctuation, ``@-@`` and ``<unk>`` as words of their own, ``xml`` links and
    entities."""
    # frequent words are short: ~2 letters at the top ranks, ~8 at the bottom (~5 on average over the text)
    n_letters = np.clip(np.rint(2 + 0.55 * np.log1p(np.arange(types)) + rng.normal(0, 1.0, types)), 1, 12)
    letters = LETTERS[rng.choice(len(LETTERS), size=(types, 12), p=LETTER_P / LETTER_P.sum())]
    kind = rng.random(types)
    words: list[str] = []
    for i in range(types):
        w = letters[i, : int(n_letters[i])].tobytes().decode("ascii")
        if kind[i] < 0.02:
            w = w[:-1] + ACCENTED[i % len(ACCENTED)]
        elif kind[i] < 0.025:
            w = w[:-1] + WIDE[i % len(WIDE)]
        if style != "tokens" and 0.1 < kind[i] < 0.15:
            w = w.capitalize()
        if style != "tokens" and 0.2 < kind[i] < 0.3:
            w += ",;.:!?"[i % 6] if kind[i] > 0.27 else ","
        if style == "xml" and 0.4 < kind[i] < 0.43:
            w = f"[[{w}]]"
        words.append(w)
    special = {
        "tokens": {1: ",", 2: ".", 9: UNK, 31: "@-@", 44: "(", 45: ")", 70: '"'},
        "xml": {60: "&amp;", 75: "&quot;", 90: "'''"},
    }
    for rank, w in special.get(style, {}).items():
        words[rank] = w
    encoded = [w.encode("utf-8") + b" " for w in words]
    lens = np.array([len(e) for e in encoded], dtype=np.int64)
    assert lens.max() + 4 <= WIDTH, "a word too long for the fixed-width rows"
    rows = np.zeros((types, WIDTH), dtype=np.uint8)
    for i, e in enumerate(encoded):
        rows[i, : len(e)] = np.frombuffer(e, dtype=np.uint8)
    masks = (np.arange(WIDTH) < lens[:, None]).astype(np.uint8) * 255
    p = 1.0 / (np.arange(types) + 2.7)  # Zipf-Mandelbrot, exponent 1
    cdf = np.cumsum(p / p.sum())
    table = np.minimum(np.searchsorted(cdf, (np.arange(1 << TABLE_BITS) + 0.5) / (1 << TABLE_BITS)), types - 1)
    return Vocabulary(
        rows.view(np.uint64), masks.view(np.uint64), lens, table.astype(np.int32), float((p / p.sum()) @ lens)
    )


def text_block(rng: np.random.Generator, vocab: Vocabulary, n_bytes: int, *, line: int) -> bytes:
    """About ``n_bytes`` of Zipf-distributed words. ``line`` > 0: a newline every ~``line`` bytes and a blank line
    (paragraph) after ~1 line in 10 (PG-19, enwik8); 0: paragraphs as single lines, `` \\n \\n `` between them,
    ~120 words each (WikiText)."""
    n = int(n_bytes / vocab.mean_len) + 1
    ids = vocab.table[rng.integers(0, len(vocab.table), n)]
    b = vocab.rows[ids].view(np.uint8).reshape(n, WIDTH)  # (n, WIDTH) the words' bytes, a copy
    m = vocab.masks[ids].view(np.uint8).reshape(n, WIDTH)
    lens = vocab.lens[ids]
    if line:
        ends = np.cumsum(lens)
        brk = np.flatnonzero(np.diff(ends // line, prepend=0) > 0)  # words after which a line is full
        b[brk, lens[brk] - 1] = ord("\n")
        para = brk[rng.random(len(brk)) < 0.1]
        b[para, lens[para]] = ord("\n")
        m[para, lens[para]] = 255
    else:
        para = np.flatnonzero(rng.random(n) < 1 / 120)
        for k, ch in enumerate(b"\n \n "):  # "word \n \n next": the line ends, a blank line, the next line's space
            b[para, lens[para] + k] = ch
            m[para, lens[para] + k] = 255
    return b[m.view(bool)].tobytes()


class TextSource:
    """A seeded text: a pool of lines (or WikiText paragraphs) written by :func:`text_block`, drawn at random into
    pieces of a requested size, so the bulk of a corpus costs one ``bytes.join`` (hundreds of MB/s). The pool
    holds up to 2^20 lines (~75 MB): words keep their Zipf statistics, lines repeat across a large corpus."""

    def __init__(self, seed: int, style: str, *, line: int, size: int) -> None:
        self.rng = np.random.default_rng(seed)
        vocab = vocabulary(self.rng, style)
        n_lines = int(np.clip(size // (4 * (line or 600)), 1 << 12, 1 << 20))
        text = text_block(self.rng, vocab, n_lines * (line or 600), line=line)
        sep = b"\n" if line else b"\n \n"  # a line end / a paragraph's line and the blank line after it
        pool = [p + sep for p in text.split(sep)[1:-1]]  # whole lines only (PG-19: blank ones too, paragraphs)
        if not line:
            pool = [p if p.startswith(b" ") else b" " + p for p in pool]  # WikiText lines start with a space
        self.pool = np.array(pool, dtype=object)
        self.lens = np.array([len(p) for p in self.pool], dtype=np.int64)
        self.mean = float(self.lens.mean())

    def pieces(self, sizes: Iterable[int]) -> Iterator[bytes]:
        """One piece of at least each size (whole lines), about 64 MB of them drawn at a time."""
        group: list[int] = []
        total = 0
        for size in sizes:
            group.append(int(size))
            total += int(size)
            if total >= 64e6:
                yield from self._draw(group)
                group, total = [], 0
        if group:
            yield from self._draw(group)

    def _draw(self, group: list[int]) -> Iterator[bytes]:
        want = np.cumsum(np.asarray(group, dtype=np.int64))
        n = int(want[-1] / self.mean * 1.05) + 64 * len(group)
        while True:
            idx = self.rng.integers(0, len(self.pool), n)
            cum = np.cumsum(self.lens[idx])
            if cum[-1] >= want[-1]:
                break
            n *= 2
        cuts = np.searchsorted(cum, want) + 1  # piece j is lines cuts[j-1]:cuts[j]
        for a, b in zip(np.concatenate([[0], cuts[:-1]]), cuts):
            yield b"".join(self.pool[idx[a:b]])

    def take(self, n: int) -> bytes:
        return next(self.pieces([n]))

    def words(self, k: int) -> str:
        """``k`` words on one line (titles)."""
        return " ".join(self.take(16 * k).decode("utf-8").split()[:k])


def write_pg19(root: Path, size: int, seed: int) -> int:
    """``train/ validation/ test/`` of ``<id>.txt`` books (sizes lognormal around 385 KB, a title block first) and
    ``metadata.csv``; validation and test take 1% and 2% of the books, at most 50 and 100 (PG-19's counts)."""
    src = TextSource(seed, "prose", line=72, size=size)
    n = max(3, round(size / BOOK_BYTES))
    sizes = src.rng.lognormal(0.0, 0.6, n)
    sizes = np.maximum(sizes / sizes.sum() * size, 2_000).astype(np.int64)
    ids = np.sort(src.rng.choice(np.arange(10_000, 10_000 + 20 * n), n, replace=False))
    n_val, n_test = min(50, max(1, round(0.01 * n))), min(100, max(1, round(0.02 * n)))
    split_of = np.array(["train"] * n, dtype=object)
    held = src.rng.permutation(n)
    split_of[held[:n_val]], split_of[held[n_val : n_val + n_test]] = "validation", "test"
    for s in SPLITS:
        (root / s).mkdir(parents=True)
    titles = [src.words(1 + int(book) % 5).title() for book in ids]
    with (root / "metadata.csv").open("w", newline="", encoding="utf-8") as meta:
        rows = csv.writer(meta)
        for book, title in zip(ids, titles):
            rows.writerow([int(book), title, 1800 + int(book) % 119, f"http://www.gutenberg.org/ebooks/{book}"])
    heads = [f"{title.upper()}\n\nBY {src.words(2).upper()}\n\n\n".encode() for title in titles]
    bodies = src.pieces(int(nbytes) - len(head) for nbytes, head in zip(sizes, heads))
    for book, split, head, body in zip(ids, split_of, heads, bodies):
        (root / split / f"{book}.txt").write_bytes(head + body)
    return n


def write_enwik8(root: Path, size: int, seed: int) -> int:
    """One file ``enwik8`` of MediaWiki-XML pages (~4 KB each) whose text has links, entities and multi-byte UTF-8."""
    src = TextSource(seed, "xml", line=90, size=size)
    root.mkdir(parents=True)
    head = b'<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.3/" version="0.3" xml:lang="en">\n'
    titles = [src.words(2).title() for _ in range(4096)]
    bodies = src.pieces(int(src.rng.exponential(4_000)) + 100 for _ in itertools.count())
    with (root / "enwik8").open("wb") as f:
        written = f.write(head)
        pages = 0
        for body in bodies:
            if written >= size:
                break
            page = (
                (
                    f"  <page>\n    <title>{titles[pages % len(titles)]}</title>\n    <id>{pages + 1}</id>\n"
                    '    <revision>\n      <text xml:space="preserve">'
                ).encode()
                + body
                + b"</text>\n    </revision>\n  </page>\n"
            )
            written += f.write(page[: size - written])
            pages += 1
    return pages


def write_wikitext(root: Path, size: int, seed: int) -> int:
    """``wiki.{train,valid,test}.tokens``: articles `` = Title = `` with `` = = Section = = `` headings, paragraphs
    of space-separated tokens one per line, `` `` blank lines between; valid and test 1% each (at most 1.3 MB)."""
    src = TextSource(seed, "tokens", line=0, size=size)
    root.mkdir(parents=True)
    held = min(1_300_000, max(20_000, size // 100))
    articles = 0
    titles = [src.words(2).title() for _ in range(4096)]
    for name, target in (
        ("wiki.train.tokens", size - 2 * held),
        ("wiki.valid.tokens", held),
        ("wiki.test.tokens", held),
    ):
        sections = src.pieces(int(src.rng.exponential(5_000)) + 500 for _ in itertools.count())
        written = 0
        with (root / name).open("wb") as f:
            for i, section in enumerate(sections):
                if written >= target:
                    break
                title = titles[i % len(titles)]
                if i == 0 or src.rng.random() < 0.3:  # a new article
                    articles += 1
                    head = f" = {title} = \n \n"
                else:
                    head = f" = = {title} = = \n \n"
                written += f.write(head.encode() + section)
    return articles


WRITERS = {"pg19": write_pg19, "enwik8": write_enwik8, "wikitext": write_wikitext}


def corpus(work: Path, fmt: str, size_gb: float, seed: int) -> tuple[Path, dict[str, Any]]:
    """The synthetic corpus of ``fmt`` and size, written now or reused when its manifest (``corpus.json``) matches."""
    size = int(round(size_gb * GB))
    root = work / "corpora" / f"{fmt}-{size}-seed{seed}"
    want = {"format": fmt, "size": size, "seed": seed, "generator": GENERATOR_VERSION}
    try:
        manifest = json.loads((root / "corpus.json").read_text())
        if {k: manifest.get(k) for k in want} == want:
            return root, manifest
    except (OSError, ValueError):
        pass
    shutil.rmtree(root, ignore_errors=True)
    tmp = root.with_name(root.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    t0 = time.perf_counter()
    docs = WRITERS[fmt](tmp, size, seed)
    seconds = time.perf_counter() - t0
    nbytes = sum(p.stat().st_size for p in tmp.rglob("*") if p.is_file() and p.suffix != ".csv")
    manifest = want | {"bytes": nbytes, "documents": docs, "write_seconds": round(seconds, 3)}
    (tmp / "corpus.json").write_text(json.dumps(manifest, indent=1))
    os.replace(tmp, root)
    print(f"wrote {fmt} corpus {root}: {nbytes / GB:.3f} GB, {docs:,} documents, {nbytes / MIB / seconds:.0f} MiB/s")
    return root, manifest


# ----------------------------------------------------------------------------------------------------------------
# the documents each format reads, as the anchor streams them


def split_files(fmt: str, root: Path, split: str) -> list[Path]:
    """The files of ``split`` in the order the project reads them (PG-19: by numeric id)."""
    if fmt == "pg19":
        return sorted((root / split).glob("*.txt"), key=lambda p: int(p.stem))
    if fmt == "wikitext":
        return [root / f"wiki.{ {'validation': 'valid'}.get(split, split) }.tokens"]
    return [root / "enwik8"]


def wikitext_pieces(path: Path) -> Iterator[str]:
    """The WikiText convention of the project's format: each line stripped plus `` <eos>``, lines joined by
    newlines, streamed as line-aligned pieces of about ``LINE_CHUNK`` characters."""
    parts: list[str] = []
    size = 0
    with path.open("rb") as f:
        lines = (f"{raw.decode('utf-8').strip()} {EOS}".lstrip() for raw in f)
        held = next(lines, None)
        for line in lines:  # a newline after every line but the last
            parts.append(held + "\n")
            size += len(held) + 1
            held = line
            if size >= LINE_CHUNK:
                yield "".join(parts)
                parts, size = [], 0
    if held is not None:
        parts.append(held)
    if parts:
        yield "".join(parts)


def enwik8_range(path: Path, split: str) -> tuple[int, int]:
    """The split's bytes of the file: enwik8's standard 90 / 5 / 5, proportionally for another size."""
    n = path.stat().st_size
    cuts = (0, round(n * 0.9), round(n * 0.95), n)
    i = SPLITS.index(split)
    return cuts[i], cuts[i + 1]


def documents(fmt: str, root: Path, split: str, files: list[Path] | None = None) -> Iterator[str | bytes]:
    """The split's documents (text), or for enwik8 the split's bytes in pieces of ``LINE_CHUNK``."""
    for path in split_files(fmt, root, split) if files is None else files:
        if fmt == "wikitext":
            yield from wikitext_pieces(path)
        elif fmt == "enwik8":
            lo, hi = enwik8_range(path, split)
            with path.open("rb") as f:
                f.seek(lo)
                while lo < hi:
                    block = f.read(min(LINE_CHUNK, hi - lo))
                    lo += len(block)
                    yield block
        else:
            yield path.read_text(encoding="utf-8")


def batches(items: Iterable[Any], n: int) -> Iterator[list[Any]]:
    batch: list[Any] = []
    for item in items:
        batch.append(item)
        if len(batch) == n:
            yield batch
            batch = []
    if batch:
        yield batch


# ----------------------------------------------------------------------------------------------------------------
# inside a child: one pipeline, its phases timed


class Phases:
    """Wall seconds, CPU seconds and peak RSS per phase of this process (``VmHWM`` is reset between phases), and
    the process's peak over its imports and every phase (``peak_rss_mib``). ``ru_maxrss`` of the child as
    ``os.wait4`` reports it is no use here: Linux carries the forking parent's RSS into it across ``exec``."""

    def __init__(self) -> None:
        self.phases: dict[str, dict[str, float]] = {}
        self.peak_rss_mib = 0.0

    @staticmethod
    def _cpu() -> float:
        return sum(
            r.ru_utime + r.ru_stime
            for r in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN))
        )

    @staticmethod
    def _peak_mib() -> float:
        try:
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            pass
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux: the peak so far

    def run(self, name: str, fn, *args):
        self.peak_rss_mib = max(self.peak_rss_mib, self._peak_mib())
        try:
            Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
        except OSError:
            pass
        t0, c0 = time.perf_counter(), self._cpu()
        out = fn(*args)
        self.phases[name] = {
            "seconds": time.perf_counter() - t0,
            "cpu_seconds": self._cpu() - c0,
            "peak_rss_mib": self._peak_mib(),
        }
        self.peak_rss_mib = max(self.peak_rss_mib, self.phases[name]["peak_rss_mib"])
        return out


def ids_digest(arrays: Iterable[np.ndarray]) -> str:
    """sha256 of the ids as little-endian uint32, whatever dtype they are stored in."""
    h = hashlib.sha256()
    for a in arrays:
        for i in range(0, len(a), 1 << 24):
            h.update(np.ascontiguousarray(a[i : i + (1 << 24)], dtype="<u4").tobytes())
    return h.hexdigest()


def data_config(spec: dict[str, Any]):
    """The run's ``DataConfig``; the tokenizer-sample settings only where this version of it has them."""
    from compressive_transformer.core.config import DataConfig

    fields = {f.name for f in dataclasses.fields(DataConfig)}
    kwargs: dict[str, Any] = {"format": spec["format"], "path": spec["corpus"], "tokenizer": spec["tokenizer"]}
    if spec["tokenizer"] in ("bpe", "unigram"):
        kwargs["vocab_size"] = spec["vocab_size"]
    trained = spec["tokenizer"] in ("words", "bpe", "unigram")  # the bytes tokenizer learns nothing: no sample
    for key in ("tokenizer_sample", "tokenizer_sample_seed"):
        if spec.get(key) is not None and key in fields and trained:
            kwargs[key] = spec[key]
    return DataConfig(**kwargs)


def run_ours(spec: dict[str, Any], phases: Phases) -> dict[str, Any]:
    import compressive_transformer.data.cache as cache

    run_dir = Path(spec["run_dir"])
    cfg = data_config(spec)
    from compressive_transformer.data.sample import prepare_tokenizer

    phases.run("tokenizer", prepare_tokenizer, cfg, run_dir)
    build = functools.partial(cache.prepare_corpora, progress=False)  # no bar: its redraws would be timed too
    tok, corpora = phases.run("encode", build, cfg, run_dir)
    out = {
        "tokens": {s: c.num_tokens for s, c in corpora.items()},
        "documents": {s: c.num_docs for s, c in corpora.items()},
        "ids_sha256": {s: ids_digest([np.asarray(c.tokens)]) for s, c in corpora.items()},
        "vocab": tok.vocab_size,
        "settings_used": {k: getattr(cfg, k) for k in ("tokenizer_sample", "tokenizer_sample_seed") if hasattr(cfg, k)},
    }
    sample = run_dir / "tokenizer_sample.json"
    if sample.is_file():
        out["tokenizer_sample"] = json.loads(sample.read_text())
    return out


def anchor_tokenizer(kind: str, vocab_size: int):
    """A fresh tokenizer and trainer with the settings of the project's ``SubwordTokenizer.train`` (subword) or
    the library's word-level model on whitespace (words)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if kind == "words":
        tok = Tokenizer(models.WordLevel(unk_token=UNK))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        return tok, trainers.WordLevelTrainer(vocab_size=1 << 30, special_tokens=[UNK], show_progress=False)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    model, trainer = {"bpe": (models.BPE, trainers.BpeTrainer), "unigram": (models.Unigram, trainers.UnigramTrainer)}[
        kind
    ]
    tok = Tokenizer(model())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return tok, trainer(vocab_size=vocab_size, initial_alphabet=alphabet, special_tokens=[], show_progress=False)


def project_tokenizer(kind: str, run_dir: Path):
    """The project's trained tokenizer as a ``tokenizers.Tokenizer``: its tokenizer.json itself (subword), or its
    word list as a ``WordLevel`` model (the ids are the project's)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    path = run_dir / "tokenizer.json"
    if kind != "words":
        return Tokenizer.from_file(str(path))
    vocab = json.loads(path.read_text(encoding="utf-8"))["vocab"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok


def training_files(spec: dict[str, Any]) -> tuple[list[Path], str]:
    """The train files the anchor trains on, and what they are: the project's sample where its run recorded one
    whose names are train files, else the whole split."""
    root, files = Path(spec["corpus"]), split_files(spec["format"], Path(spec["corpus"]), "train")
    sample = Path(spec["run_dir"]) / "tokenizer_sample.json"
    if sample.is_file():
        names = [str(n) for n in json.loads(sample.read_text()).get("names", [])]
        by_stem = {p.stem: p for p in files}
        if names and all(n in by_stem for n in names):
            chosen = [by_stem[n] for n in names]
            mb = sum(p.stat().st_size for p in chosen) / 1e6
            return chosen, (
                f"the project's sample: {len(names)} of {len(files)} train files, {mb:.1f} MB "
                f"(the project's record: {json.loads(sample.read_text()).get('bytes', 0) / 1e6:.1f} MB)"
            )
        return files, f"the whole train split ({root.name}'s sample names are not its train files)"
    return files, "the whole train split (as the project)"


def encode_to_files(tok, spec: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    """``encode_batch`` over batches of ``BATCH_DOCS`` documents, ids appended to one flat file per split (bytes:
    each document's UTF-8 bytes as uint16 ids)."""
    fmt, root = spec["format"], Path(spec["corpus"])
    dtype = np.uint16 if tok is None or tok.get_vocab_size() <= 1 << 16 else np.int32
    tokens, docs = {}, {}
    for split in SPLITS:
        n_tok = n_doc = 0
        with (out_dir / f"{split}.ids").open("wb") as f:
            for batch in batches(documents(fmt, root, split), BATCH_DOCS):
                if tok is None:
                    arrays = [np.frombuffer(d if isinstance(d, bytes) else d.encode("utf-8"), np.uint8) for d in batch]
                else:
                    arrays = [np.asarray(e.ids, dtype=dtype) for e in tok.encode_batch(batch, add_special_tokens=False)]
                for a in arrays:
                    a.astype(dtype, copy=False).tofile(f)
                    n_tok += len(a)
                n_doc += len(batch)
        tokens[split], docs[split] = n_tok, n_doc
    return {"tokens": tokens, "documents": docs, "dtype": np.dtype(dtype).name}


def ids_file(path: Path, dtype: np.dtype) -> np.ndarray:
    return np.memmap(path, dtype=dtype, mode="r") if path.stat().st_size else np.zeros(0, dtype)


def run_anchor(spec: dict[str, Any], phases: Phases, own: bool) -> dict[str, Any]:
    kind, out_dir = spec["tokenizer"], Path(spec["out_dir"])
    out_dir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {}
    tok = None
    if kind != "bytes" and own:
        tok, trainer = anchor_tokenizer(kind, spec["vocab_size"])
        files, result["trained_on"] = training_files(spec)
        if spec["format"] == "pg19":
            phases.run("tokenizer", tok.train, [str(p) for p in files], trainer)
        else:  # the format's documents are transformed lines, not the file as it is
            texts = (d for p in files for d in documents(spec["format"], Path(spec["corpus"]), "train", [p]))
            phases.run("tokenizer", tok.train_from_iterator, texts, trainer)
    elif kind != "bytes":
        tok = phases.run("tokenizer", project_tokenizer, kind, Path(spec["run_dir"]))
    result |= phases.run("encode", encode_to_files, tok, spec, out_dir)
    dtype = np.dtype(result["dtype"])
    result["ids_sha256"] = {s: ids_digest([ids_file(out_dir / f"{s}.ids", dtype)]) for s in SPLITS}
    if tok is not None:
        result["vocab"] = tok.get_vocab_size()
    return result


def child_main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    phases = Phases()
    if spec["pipeline"] == "ours":
        result = run_ours(spec, phases)
    else:
        result = run_anchor(spec, phases, own=spec["pipeline"] == "anchor")
    result["phases"] = phases.phases
    result["peak_rss_mib"] = phases.peak_rss_mib  # the ids' hashing after the phases is not in it
    Path(spec["result"]).write_text(json.dumps(result))


# ----------------------------------------------------------------------------------------------------------------
# the parent: one child per measurement, results as each ends


def run_child(spec: dict[str, Any], work: Path, timeout: float | None = None) -> dict[str, Any]:
    """``spec`` run in a fresh interpreter: its phases and peak RSS, and its wall and CPU seconds (``os.wait4``)."""
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    stem = logs / spec["id"].replace("/", "_")
    spec = spec | {"result": str(stem) + ".result.json"}
    Path(spec["result"]).unlink(missing_ok=True)
    Path(str(stem) + ".spec.json").write_text(json.dumps(spec))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")])))
    t0 = time.perf_counter()
    with open(str(stem) + ".log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.ingest", "--child", str(stem) + ".spec.json"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        status, usage, timed_out, tree_peak = reap(proc, timeout)
    wall = time.perf_counter() - t0
    if timed_out:
        return {"error": f"timed out after {timeout:g} s (--timeout)", "log": str(stem) + ".log"}
    if proc.returncode != 0 or not Path(spec["result"]).is_file():
        tail = Path(str(stem) + ".log").read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
        return {"error": f"exit {proc.returncode}: {tail[0][:300]}", "log": str(stem) + ".log"}
    result = json.loads(Path(spec["result"]).read_text())
    result["process"] = {
        "seconds": wall,
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
        "tree_pss_peak_mib": tree_peak,  # sampled: the child with any worker processes it starts
    }
    return result


def tree_pss_mib(pid: int) -> float:
    """Proportional set size of ``pid`` and all its descendants (a worker pool's memory, shared pages counted
    once); 0 where /proc cannot say."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
                    break
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return total / 1024


def reap(proc: subprocess.Popen, timeout: float | None) -> tuple[int, Any, bool, float]:
    """Wait for ``proc`` (killed after ``timeout`` seconds): its wait status, its resource usage, whether it was
    killed, and the peak of its process tree's PSS, sampled every 0.2 s. ``os.wait4`` reaps it itself, since
    ``Popen.wait`` would take the usage with it."""
    deadline = None if timeout is None else time.monotonic() + timeout
    killed, peak = False, 0.0
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return status, usage, killed, peak
        peak = max(peak, tree_pss_mib(proc.pid))
        if deadline is not None and time.monotonic() > deadline:
            proc.kill()
            killed, deadline = True, None
        time.sleep(0.2)


def summarise(result: dict[str, Any], corpus_bytes: int) -> dict[str, Any]:
    """Totals a table reads: seconds of the timed phases, MB/s of the corpus, the process's peak RSS, tokens."""
    seconds = sum(p["seconds"] for p in result["phases"].values())
    return {
        "seconds": seconds,
        "mb_per_s": corpus_bytes / 1e6 / seconds if seconds else None,
        "peak_rss_mib": result["peak_rss_mib"],
        "tree_pss_peak_mib": result["process"]["tree_pss_peak_mib"],
        "total_tokens": sum(result["tokens"].values()),
        "total_documents": sum(result["documents"].values()),
    }


class Results:
    """``results.json``: every measurement, keyed by its settings, rewritten atomically after each one."""

    def __init__(self, out: Path, header: dict[str, Any]) -> None:
        self.path = out / "results.json"
        self.data = {"measurements": []}
        if self.path.is_file():
            try:
                self.data = json.loads(self.path.read_text())
                assert isinstance(self.data.get("measurements"), list)
            except (ValueError, AssertionError, AttributeError):
                raise SystemExit(
                    f"{self.path}: not a results file of this benchmark; move it away or pick another --out"
                ) from None
        self.data |= header
        self.machine_noted = False

    def note_machine(self) -> None:
        """The machine record, taken once per invocation that measures something (importing torch takes a while)."""
        if not self.machine_noted:
            self.data["machine"] = machine()
            self.machine_noted = True

    def find(self, settings: dict[str, Any]) -> dict[str, Any] | None:
        for m in self.data["measurements"]:
            if m["settings"] == settings and "error" not in m:
                return m
        return None

    def put(self, record: dict[str, Any]) -> None:
        self.data["measurements"] = [m for m in self.data["measurements"] if m["settings"] != record["settings"]]
        self.data["measurements"].append(record)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(".results.json.tmp")
        tmp.write_text(json.dumps(self.data, indent=1))
        os.replace(tmp, self.path)


def measure(args, results: Results, fmt: str, kind: str, size_gb: float, repeat: int) -> None:
    """The three pipelines for one corpus and tokenizer, each skipped when results hold it already."""
    root, manifest = corpus(args.work, fmt, size_gb, args.seed)
    base = {
        "format": fmt,
        "tokenizer": kind,
        "size_gb": size_gb,
        "seed": args.seed,
        "generator": GENERATOR_VERSION,
        "vocab_size": args.vocab_size if kind in ("bpe", "unigram") else None,
        "tokenizer_sample": args.tokenizer_sample,
        "tokenizer_sample_seed": args.tokenizer_sample_seed,
        "repeat": repeat,
    }
    tag = f"{fmt}-{kind}-{size_gb:g}gb-r{repeat}"
    run_dir, anchor_dir = args.work / "runs" / tag, args.work / "anchor" / tag
    pipelines = [p for p in PIPELINES if p in args.pipelines and not (p == "anchor-encode" and kind == "bytes")]
    for pipeline in pipelines:
        settings = base | {"pipeline": pipeline}
        have = None if args.force else results.find(settings)
        needs_run_dir = pipeline != "ours" and kind != "bytes"
        if have is not None and not (pipeline == "ours" and needs_ours_dir(args, results, base, run_dir)):
            continue
        if needs_run_dir and not (run_dir / "tokenizer.json").is_file():
            print(f"{tag} {pipeline}: skipped, it needs the tokenizer the project's build writes ({run_dir} has none)")
            continue
        if pipeline == "ours":
            shutil.rmtree(run_dir, ignore_errors=True)
            run_dir.mkdir(parents=True)
        spec = base | {
            "id": f"{tag}-{pipeline}",
            "pipeline": pipeline,
            "corpus": str(root),
            "run_dir": str(run_dir),
            "out_dir": str(anchor_dir / pipeline),
        }
        results.note_machine()
        warm_page_cache(root)
        load = os.getloadavg()  # a busy machine makes every number here slower: recorded beside each
        result = run_child(spec, args.work, args.timeout)
        record = {
            "settings": settings,
            "corpus": {k: manifest[k] for k in ("bytes", "documents")},
            "date": now(),
            "load_average_before": [round(x, 2) for x in load],
            "machine": {k: results.data["machine"].get(k) for k in ("cpu", "cpu_flags", "cores", "commit")},
        } | result
        if "error" not in result:
            record["summary"] = summarise(result, manifest["bytes"])
        results.put(record)
        if not args.keep:
            shutil.rmtree(run_dir / ".cache", ignore_errors=True)
            shutil.rmtree(anchor_dir / pipeline, ignore_errors=True)
        print(line_of(record))


def warm_page_cache(root: Path) -> None:
    """Read every file of the corpus once, untimed: each pipeline then starts with the corpus in the page cache
    (otherwise the first to run reads it from the disk and those after it from memory)."""
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        with path.open("rb") as f:
            while f.read(16 << 20):
                pass


def needs_ours_dir(args, results: Results, base: dict[str, Any], run_dir: Path) -> bool:
    """Whether ours must run again although measured: an anchor of a subword / word tokenizer is still to be
    measured and needs the tokenizer (and sample) that run wrote, which is gone."""
    if base["tokenizer"] == "bytes" or (run_dir / "tokenizer.json").is_file():
        return False
    wanted = [p for p in PIPELINES[1:] if p in args.pipelines]
    return any(args.force or results.find(base | {"pipeline": p}) is None for p in wanted)


def line_of(record: dict[str, Any]) -> str:
    s = record["settings"]
    head = f"{s['format']} {s['tokenizer']} {s['size_gb']:g} GB {s['pipeline']}"
    if "error" in record:
        return f"{head}: FAILED {record['error']} (log: {record['log']})"
    m, ph = record["summary"], record["phases"]
    parts = ", ".join(f"{k} {v['seconds']:.1f} s" for k, v in ph.items())
    return (
        f"{head}: {m['seconds']:.1f} s ({parts}), {m['mb_per_s']:.1f} MB/s, peak {m['peak_rss_mib']:.0f} MiB, "
        f"{m['total_tokens']:,} tokens"
    )


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def machine() -> dict[str, Any]:
    """The machine record of the project's runs (CPU model and flags, cores, torch) plus RAM and versions."""
    import tokenizers

    from compressive_transformer.runs.machine import machine_info

    info = machine_info()
    try:
        mem = next(ln for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemTotal"))
        info["ram_gib"] = round(int(mem.split()[1]) / (1 << 20), 1)
    except (OSError, StopIteration):
        pass
    info |= {
        "tokenizers": tokenizers.__version__,
        "numpy": np.__version__,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    try:
        git = ["git", "-C", str(ROOT)]
        info["commit"] = subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
        info["dirty"] = bool(
            subprocess.run(git + ["status", "--porcelain", "src"], capture_output=True, text=True).stdout
        )
    except OSError:
        pass
    return info


# ----------------------------------------------------------------------------------------------------------------
# report: markdown tables, the fit to the full PG-19, the plot


def medians(measurements: list[dict[str, Any]]) -> dict[tuple, dict[str, Any]]:
    """Per (format, tokenizer, size, pipeline): the repeat with the median seconds (all repeats stay in the JSON)."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for m in measurements:
        if "summary" in m:
            s = m["settings"]
            groups.setdefault((s["format"], s["tokenizer"], s["size_gb"], s["pipeline"]), []).append(m)
    return {k: sorted(v, key=lambda m: m["summary"]["seconds"])[(len(v) - 1) // 2] for k, v in groups.items()}


def fit(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """Least-squares seconds = a + b * GB over the sizes measured (None below two sizes)."""
    if len({x for x, _ in points}) < 2:
        return None
    b, a = np.polyfit([x for x, _ in points], [y for _, y in points], 1)
    return float(a), float(b)


def equivalence(ours: dict[str, Any] | None, other: dict[str, Any] | None) -> str:
    if ours is None or other is None:
        return ""
    if ours["tokens"] != other["tokens"]:
        return f"NO: {ours['summary']['total_tokens']:,} vs {other['summary']['total_tokens']:,}"
    return "yes, ids equal" if ours["ids_sha256"] == other["ids_sha256"] else "counts equal, ids DIFFER"


def ratio(ours: dict[str, Any] | None, other: dict[str, Any] | None, phase: str | None = None) -> str:
    """Ours' throughput over the other's on the same corpus: seconds of the other / seconds of ours."""
    if ours is None or other is None:
        return ""

    def secs(m):
        return m["phases"][phase]["seconds"] if phase else m["summary"]["seconds"]

    return f"{secs(other) / secs(ours):.2f}" if secs(ours) else ""


def machine_of(record: dict[str, Any]) -> str:
    """The CPU and commit a measurement ran on (the machine varies between runs: rows compare within one run)."""
    m = record.get("machine") or {}
    flags = ", ".join(m.get("cpu_flags") or [])
    commit = f", commit {m['commit'][:10]}" if m.get("commit") else ""
    return f"{m.get('cpu', 'an unrecorded machine')} ({flags}){commit}"


def markdown(data: dict[str, Any]) -> str:
    best = medians(data["measurements"])
    mach = data.get("machine", {})
    lines = [
        "# Corpus ingestion: the project's cache build against Hugging Face `tokenizers`",
        "",
        f"{data['date']}. Machine: {mach.get('cpu')} ({', '.join(mach.get('cpu_flags', []))}), "
        f"{mach.get('cores')} cores, {mach.get('ram_gib', '?')} GiB RAM, load average {mach.get('load_average')} at "
        f"the start; torch {mach.get('torch')}, tokenizers {mach.get('tokenizers')}, numpy {mach.get('numpy')}, "
        f"commit {mach.get('commit', '?')[:10]}{' (src modified)' if mach.get('dirty') else ''}.",
        "",
        "Seconds are the timed phases of each child (imports excluded); MB/s is the whole corpus (every split) over "
        "them; peak RSS is the child's own high-water mark (`VmHWM`) over its imports and phases; tree PSS the peak "
        "of the proportional set size of the child and any worker processes it starts, sampled every 0.2 s (shared "
        "pages counted once; a peak shorter than that can be missed), over the child's whole life: after its timed "
        "phases each child reads every id it wrote back from a memory map for the sha256 check, and those mapped "
        "pages count: tree PSS grows with the ids written; the build's own memory is peak RSS. `tokenizer` is "
        "tokenizer training (ours: "
        "`prepare_tokenizer`; anchor-encode: loading the project's file), `encode` the cache build / the anchor's "
        "encoding of every split. Ratios are ours' throughput over the other's (> 1: ours faster). `tokens equal`: "
        "the anchor's encoding with the project's own tokenizer gives ours' token count per split (and ids, by "
        "sha256). Measured by: " + "; ".join(f"`{c}`" for c in data.get("commands", [data["command"]])) + ".",
    ]
    combos = sorted({(k[0], k[1]) for k in best}, key=lambda c: (FORMATS.index(c[0]), TOKENIZERS.index(c[1])))
    fits: list[str] = []
    for fmt, kind in combos:
        lines += ["", f"## {fmt}, {kind}", ""]
        lines += [
            "| GB | documents | pipeline | tokenizer s | encode s | total s | MB/s | peak RSS MiB | tree PSS MiB | tokens | ours ÷ anchor "
            "(total) | ours ÷ anchor-encode (encode) | tokens equal |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        sizes = sorted({k[2] for k in best if k[:2] == (fmt, kind)})
        notes: list[str] = []
        for size in sizes:
            ours = best.get((fmt, kind, size, "ours"))
            anchor_encode = best.get((fmt, kind, size, "anchor-encode"))
            for pipeline in PIPELINES:
                m = best.get((fmt, kind, size, pipeline))
                if m is None:
                    continue
                ph, s = m["phases"], m["summary"]
                cells = [
                    f"{m['corpus']['bytes'] / GB:.3f}",
                    f"{m['corpus']['documents']:,}",
                    pipeline,
                    f"{ph['tokenizer']['seconds']:.1f}" if "tokenizer" in ph else "–",
                    f"{ph['encode']['seconds']:.1f}",
                    f"{s['seconds']:.1f}",
                    f"{s['mb_per_s']:.1f}",
                    f"{s['peak_rss_mib']:.0f}",
                    f"{s['tree_pss_peak_mib']:.0f}",
                    f"{s['total_tokens']:,}",
                    ratio(ours, best.get((fmt, kind, size, "anchor"))) if pipeline == "ours" else "",
                    ratio(ours, anchor_encode, "encode") if pipeline == "ours" else "",
                    equivalence(ours, m)
                    if pipeline != "ours" and (pipeline == "anchor-encode" or kind == "bytes")
                    else "",
                ]
                lines.append("| " + " | ".join(cells) + " |")
            trained = (best.get((fmt, kind, size, "anchor")) or {}).get("trained_on")
            if trained:
                notes.append(f"{size:g} GB: the anchor trained on {trained}.")
        machines = sorted({machine_of(m) for k, m in best.items() if k[:2] == (fmt, kind)})
        notes.append("Measured on " + "; ".join(machines) + ".")
        lines += [""] + notes
        for pipeline in PIPELINES:
            pts = [
                (k[2], v["summary"]["seconds"]) for k, v in best.items() if k[:2] == (fmt, kind) and k[3] == pipeline
            ]
            rss = [
                v["summary"]["peak_rss_mib"]
                for k, v in sorted(best.items())
                if k[:2] == (fmt, kind) and k[3] == pipeline
            ]
            f = fit(pts)
            if f is None:
                continue
            a, b = f
            note = f"{fmt} {kind} {pipeline}: seconds ≈ {a:.1f} + {b:.1f} × GB over {len(pts)} sizes"
            note += f"; peak RSS {rss[0]:.0f} → {rss[-1]:.0f} MiB ({rss[-1] / rss[0]:.2f}×)"
            if fmt == "pg19" and b <= 0:
                note += "; no positive slope (the sizes are too close for the noise), so no extrapolation"
            elif fmt == "pg19":
                hours = (a + b * PG19_FULL["gb"]) / 3600
                note += (
                    f"; the full PG-19 ({PG19_FULL['gb']} GB, {PG19_FULL['books']:,} books): {hours:.2f} h on the "
                    f"machine it was measured on ({PG19_FULL['gb'] / max(x for x, _ in pts):.0f}× beyond the largest size measured)"
                )
            fits.append("- " + note)
    lines += ["", "## Linear fits", ""] + (fits or ["- (at least two sizes per pipeline are needed)"])
    return "\n".join(lines) + "\n"


def plot(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    best = medians(data["measurements"])
    fmts = [f for f in FORMATS if any(k[0] == f for k in best)]
    fig, axes = plt.subplots(len(fmts), 2, figsize=(11, 3.6 * len(fmts)), squeeze=False)
    styles = {"ours": "-", "anchor": "--", "anchor-encode": ":"}
    for row, fmt in zip(axes, fmts):
        for ki, kind in enumerate(TOKENIZERS):
            for pipeline, ls in styles.items():
                pts = sorted((k[2], v["summary"]) for k, v in best.items() if k[:2] == (fmt, kind) and k[3] == pipeline)
                if not pts:
                    continue
                xs = [x for x, _ in pts]
                kw = {"color": f"C{ki}", "linestyle": ls, "marker": "o", "label": f"{kind} {pipeline}"}
                row[0].plot(xs, [s["seconds"] for _, s in pts], **kw)
                row[1].plot(xs, [s["peak_rss_mib"] for _, s in pts], **kw)
        for ax, ylabel in zip(row, ("seconds", "peak RSS (MiB)")):
            ax.set(xlabel="corpus size (GB)", ylabel=ylabel, title=fmt)
            ax.grid(alpha=0.3)
        row[1].set_ylim(bottom=0)
        row[0].legend(fontsize=7)
    mach = data.get("machine", {})
    fig.suptitle(
        f"{mach.get('cpu')}, {mach.get('cores')} cores; flags: {' '.join(mach.get('cpu_flags', []))}", fontsize=9
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------------------------
# command line


def floats(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give comma-separated sizes in GB, e.g. 0.1,0.5,2") from None
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: sizes must be > 0 GB")
    return values


def names(choices: tuple[str, ...]):
    def parse(text: str) -> list[str]:
        got = [x.strip() for x in text.split(",") if x.strip()]
        bad = [x for x in got if x not in choices]
        if bad or not got:
            raise argparse.ArgumentTypeError(f"{text!r}: use some of {','.join(choices)}")
        return got

    return parse


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.ingest", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--sizes", type=floats, default=None, help="corpus sizes in GB (all splits together) for every tokenizer"
    )
    for kind in TOKENIZERS:
        default = ",".join(f"{x:g}" for x in DEFAULT_SIZES[kind])
        p.add_argument(f"--{kind}-sizes", type=floats, default=None, help=f"the {kind} tokenizer's (default {default})")
    p.add_argument("--formats", type=names(FORMATS), default=list(FORMATS))
    p.add_argument("--tokenizers", type=names(TOKENIZERS), default=["bytes", "words", "bpe"])
    p.add_argument(
        "--pipelines",
        type=names(PIPELINES),
        default=list(PIPELINES),
        help="which to run (anchor-encode, the equivalence check, costs as much as the anchor's encoding)",
    )
    p.add_argument("--repeats", type=int, default=1, help="measurements per setting (the median is reported)")
    p.add_argument("--vocab-size", type=int, default=32_000, help="bpe/unigram vocabulary (configs/pg19.toml's)")
    p.add_argument("--tokenizer-sample", type=int, default=None, help="data.tokenizer_sample (default: the project's)")
    p.add_argument("--tokenizer-sample-seed", type=int, default=None, help="data.tokenizer_sample_seed")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic corpora")
    p.add_argument("--work", type=Path, default=DEFAULT_WORK, help="corpora, run directories, logs (not in the repo)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results.json, results.md, ingest.png")
    p.add_argument("--timeout", type=float, default=None, help="seconds one child may run (default: no limit)")
    p.add_argument("--force", action="store_true", help="measure again what results.json holds already")
    p.add_argument("--keep", action="store_true", help="keep the token caches and the anchor's id files")
    p.add_argument("--quick", action="store_true", help="a smoke run: 1-2 MB corpora, vocabulary 512")
    p.add_argument("--child", help=argparse.SUPPRESS)
    return p


def sizes_for(args, kind: str) -> list[float]:
    """``--<kind>-sizes``, else ``--sizes``, else the kind's default (BPE at 2 GB would take hours on 2 cores)."""
    return getattr(args, f"{kind}_sizes") or args.sizes or DEFAULT_SIZES[kind]


def check_sample_settings(args) -> None:
    """A tokenizer-sample option the installed ``DataConfig`` does not have would be silently ignored: refused."""
    from compressive_transformer.core.config import DataConfig

    fields = {f.name for f in dataclasses.fields(DataConfig)}
    for key in ("tokenizer_sample", "tokenizer_sample_seed"):
        if getattr(args, key) is not None and key not in fields:
            raise SystemExit(f"--{key.replace('_', '-')}: this version's DataConfig has no {key}; drop the option")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    if args.child:
        return child_main(args.child)
    if args.quick:
        args.sizes, args.vocab_size = [0.001], 512
        args.bytes_sizes = args.bytes_sizes or [0.001, 0.002]
    check_sample_settings(args)
    args.work = args.work.expanduser().absolute()
    if args.work.resolve().is_relative_to(ROOT.resolve()):
        raise SystemExit(f"--work {args.work}: is inside the repository; give a scratch directory, e.g. /tmp/ingest")
    command = " ".join(["python -m benchmarks.ingest", *argv])
    header = {
        "command": command,
        "date": now(),
        "python": platform.python_version(),
    }
    out = args.out.expanduser().absolute()
    results = Results(out, header)
    results.data["commands"] = list(dict.fromkeys([*results.data.get("commands", []), command]))  # every invocation
    plan = [
        (size, fmt, kind, r)
        for kind in args.tokenizers
        for size in sizes_for(args, kind)
        for fmt in args.formats
        if kind in FORMAT_TOKENIZERS.get(fmt, TOKENIZERS)
        for r in range(args.repeats)
    ]
    for size, fmt, kind, r in sorted(plan, key=lambda t: (t[0], FORMATS.index(t[1]), TOKENIZERS.index(t[2]), t[3])):
        measure(args, results, fmt, kind, size, r)
        write_report(results.data, out)
    write_report(results.data, out)
    print(f"results: {repo_path(out / 'results.md')}")


def write_report(data: dict[str, Any], out: Path) -> None:
    (out / "results.md").write_text(markdown(data))
    if any("summary" in m for m in data["measurements"]):
        plot(data, out / "ingest.png")


if __name__ == "__main__":
    main()
