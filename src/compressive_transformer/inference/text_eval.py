"""Scoring text a user brings: whole files (or a corpus directory of any format) with a trained run's tokenizer,
memory carried through each file from its start, results beside the run's split results but never over them."""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator, Sequence

import numpy as np

from compressive_transformer.core.config import ConfigError, DataConfig
from compressive_transformer.core.dtypes import amp_dtype
from compressive_transformer.core.fileio import check_new, free_name, require_writable
from compressive_transformer.core.modality import (
    AUDIO,
    TEXT,
    binary_reason,
    format_modality,
    require_modality,
    token_unit,
)
from compressive_transformer.data.cache import cache_dir_for, load_corpus, token_dtype
from compressive_transformer.data.documents import Document, DocumentSource, SplitStream, file_pieces, first_bad
from compressive_transformer.data.readers import decode_file, not_utf8_error, source_files
from compressive_transformer.data.shards import build_split
from compressive_transformer.data.units import TextSize, texts_size
from compressive_transformer.inference.evaluate import EvalResult, evaluate, write_eval_record
from compressive_transformer.runs.failures import EVALUATION_REMEDY, evaluation_sizes, sizes_to_lower
from compressive_transformer.runs.loading import Run
from compressive_transformer.runs.precision import inference_amp

TextInput = str | Path | Sequence[str | Path]
# what may change when scoring a user's text; anything else would be ignored, so it is refused
TEXT_EVAL_KEYS = ("eval.seg_len", "eval.mem_len", "eval.cmem_len", "eval.batch_size", "eval.max_batches")


@dataclass(frozen=True)
class TextSource:
    """Documents to score and where they came from (recorded in the result): in memory (``documents``), a stream
    of files (``stream``, encoded into a temporary cache) or a corpus split (``data``, encoded into the run's
    token cache), so that a large input is never held in memory."""

    name: str
    documents: list[Document] = field(default_factory=list)
    description: dict[str, Any] = field(default_factory=dict)
    stream: SplitStream | None = None
    data: DataConfig | None = None
    split: str = ""


def files_source(paths: Sequence[str | Path], tokenizer_kind: str, *, allow_binary: bool = False) -> TextSource:
    """Each file is one document, read in pieces when scored (UTF-8, or raw bytes for a byte-level run). A binary
    file (an executable, an archive: told from its first MB) is refused unless ``allow_binary``: its score would
    mean nothing as text."""
    if not paths:
        raise ConfigError("--text: give at least one file")
    docs, files = [], []
    for p in map(Path, paths):
        if not p.is_file():
            raise ConfigError(f"--text: {p} is not a file; give text files to score")
        with p.open("rb") as f:
            head = decode_head(f.read(BINARY_PROBE), p, tokenizer_kind)
        reason = None if allow_binary else binary_reason(head)
        if reason:
            raise ConfigError(f"--text: {p} is not text ({reason}); pass --allow-binary to score its bytes anyway")
        error = lambda path, offset: not_utf8_error(path, offset, tokenizer_kind)  # noqa: E731
        docs.append(
            DocumentSource(p.stem, p.stat().st_size, (p,), lambda p=p, e=error: file_pieces(p, tokenizer_kind, e))
        )
        files.append({"path": str(p.resolve()), "bytes": p.stat().st_size})
    stem = Path(paths[0]).stem + (f"-and-{len(paths) - 1}-more" if len(paths) > 1 else "")
    stream = SplitStream("text", docs, tuple(Path(p) for p in paths))
    return TextSource(f"text-{stem}", description={"kind": "files", "files": files}, stream=stream)


BINARY_PROBE = 1 << 20  # bytes of a --text file read to tell text from binary


def decode_head(data: bytes, path: Path, tokenizer_kind: str) -> Document:
    """The first bytes of a file as text (a character cut at the end dropped), or bytes for a byte-level run."""
    bad = first_bad(data)
    if bad is not None and len(data) == BINARY_PROBE and bad >= len(data) - 3 and b"\x00" not in data:
        bad = first_bad(data[:bad])  # the probe ended inside a character: not a fault of the file
    if bad is None:
        return data.decode("utf-8", errors="ignore")
    if tokenizer_kind == "bytes":
        return data
    raise not_utf8_error(path, bad, tokenizer_kind)


def corpus_source(run: Run, directory: str | Path, fmt: str, split: str) -> TextSource:
    """One split of a corpus in any supported format (``data.format`` values), read with the run's tokenizer settings."""
    path = Path(directory).expanduser().resolve()
    remedy = "give --format audio and a folder of sound files" if run.modality == AUDIO else "give a text format"
    require_modality(run.modality, format_modality(fmt), f"--data DIR --format {fmt}", remedy)
    try:
        data = dataclasses.replace(run.config.data, format=fmt, path=str(path), train_file="", cache_dir="")
    except ConfigError as e:
        raise ConfigError(f"--format: {e}") from None
    source_files(data, split)  # a missing split: one line, before any work
    return TextSource(
        f"data-{fmt}-{path.name}-{split}",
        description={"kind": "corpus", "format": fmt, "path": str(path), "split": split},
        data=data,
        split=split,
    )


def encode_documents(run: Run, documents: Sequence[Document]) -> SimpleNamespace:
    """Token ids of every non-empty document and their offsets (what the stream batcher reads)."""
    arrays = [a for a in (np.asarray(run.tokenizer.encode_array(d), dtype=np.int64) for d in documents) if len(a)]
    if not arrays:
        raise ConfigError("--text: the text is empty after tokenization; give some text to score")
    offsets = np.concatenate([[0], np.cumsum([len(a) for a in arrays])]).astype(np.int64)
    return SimpleNamespace(tokens=np.concatenate(arrays), doc_offsets=offsets)


def evaluate_text(
    run: Run,
    text_or_path: TextInput,
    *,
    batch_size: int | None = None,
    seg_len: int | None = None,
    mem_len: int | None = None,
    cmem_len: int | None = None,
    max_batches: int | None = None,
    progress: bool = False,
    name: str = "text",
) -> EvalResult:
    """Score text with ``run``: a ``str`` is the text itself, a :class:`~pathlib.Path` a file, a list one
    document per item (each a text or a path). Every document starts with empty memory that is then carried
    through it, exactly as a split is evaluated; so, as for a split, fewer documents than ``batch_size`` streams are
    cut into ``batch_size`` contiguous pieces that each start empty (``batch_size=1`` keeps one document one
    stream). Lengths default to the run's evaluation settings."""
    require_modality(run.modality, TEXT, "evaluate_text's input", "score sound files with evaluate_source")
    items = [text_or_path] if isinstance(text_or_path, (str, Path)) else list(text_or_path)
    for x in items:
        if isinstance(x, str) and _names_a_file(x):
            warnings.warn(
                f"evaluate_text: scoring the string {x!r} itself, which names a file; pass Path({x!r}) to score "
                "the file",
                stacklevel=2,
            )
    docs = [decode_file(x, run.tokenizer.kind) if isinstance(x, Path) else x for x in items]
    lengths = Lengths(batch_size, seg_len, mem_len, cmem_len, max_batches)
    return score_documents(run, docs, name=name, lengths=lengths, progress=progress)


def _names_a_file(text: str) -> bool:
    """Whether ``text`` (one short line) is the name of an existing file: then it was likely meant as one."""
    if "\n" in text or len(text) > 4096:
        return False
    try:
        return Path(text).is_file()
    except (OSError, ValueError):  # a name too long, a NUL: not a file name
        return False


@dataclass(frozen=True)
class Lengths:
    """What a scoring may set apart from the run's evaluation settings (None: the run's)."""

    batch_size: int | None = None
    seg_len: int | None = None
    mem_len: int | None = None
    cmem_len: int | None = None
    max_batches: int | None = None


def score_documents(
    run: Run, documents: Sequence[Document], *, name: str, lengths: Lengths = Lengths(), progress: bool = False
) -> EvalResult:
    corpus = encode_documents(run, documents)
    return score_corpus(run, corpus, texts_size(documents), name=name, lengths=lengths, progress=progress)


def fresh_result_path(run_dir: Path, name: str) -> Path:
    """``eval_<name>.json``, or with ``-2``, ``-3``... where that exists: earlier results are never replaced (and a
    name taken while evaluating gets the next free one when the result is written)."""
    return free_name(run_dir / f"eval_{name}.json")


def result_path(run_dir: Path | None, name: str, out: str | Path | None) -> Path:
    """Where a result is written: ``out`` (which must not exist: a result never replaces a file), else
    :func:`fresh_result_path` in the run; checked writable before any work."""
    if out is not None:
        return check_new(Path(out), "--out")
    if run_dir is None:
        raise ConfigError(
            "evaluate: results are written into a run directory; load a run written by `train` or pass --out FILE"
        )
    path = fresh_result_path(Path(run_dir), name)
    require_writable(path)
    return path


def run_record(run: Run, result: EvalResult, source: dict[str, Any]) -> dict[str, Any]:
    """What an evaluation JSON holds: the numbers, the data they came from, the lengths and the checkpoint."""
    return result.to_dict() | {
        "source": source,
        "checkpoint": str(run.checkpoint),
        "step": run.step,
        "device": str(run.device),
    }


def evaluate_source(
    run: Run, source: TextSource, *, progress: bool = True, out: Path | None = None
) -> tuple[EvalResult, Path]:
    """Score ``source`` and write ``RUN_DIR/eval_<name>.json`` under a name no earlier result holds (or ``out``);
    where that cannot be written it stops before computing anything."""
    path = result_path(run.run_dir, source.name, out)
    with sizes_to_lower("evaluating", evaluation_sizes(run.config), EVALUATION_REMEDY):
        if source.data is not None or source.stream is not None:
            with encoded_source(run, source) as (corpus, size):
                result = score_corpus(run, corpus, size, name=source.name, progress=progress)
        else:
            result = score_documents(run, source.documents, name=source.name, progress=progress)
    return result, write_eval_record(path, run_record(run, result, source.description))


@contextlib.contextmanager
def encoded_source(run: Run, source: TextSource) -> Iterator[tuple[Any, TextSize]]:
    """A streamed source's ids, memory-mapped: a corpus split from the run's token cache (built there once), files
    through a temporary cache beside it that is removed afterwards."""
    caches = Path(cache_dir_for(source.data or run.config.data, run.run_dir)) if run.run_dir else None
    if source.data is not None:
        if caches is None:
            caches = Path(tempfile.mkdtemp(prefix="ct-eval-"))
        corpus = load_corpus(source.data, source.split, run.tokenizer, caches)
        yield corpus, corpus.size
        return
    assert source.stream is not None
    if caches is not None:
        caches.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="eval-text-", dir=caches))
    try:
        dtype = token_dtype(run.tokenizer.vocab_size)
        built = build_split(source.stream, run.tokenizer, work / "build", {}, dtype)
        if built.offsets[-1] == 0:
            raise ConfigError("--text: the text is empty after tokenization; give some text to score")
        tokens = np.memmap(built.tokens_path, dtype=dtype, mode="r", shape=(int(built.offsets[-1]),))
        t = built.totals
        yield SimpleNamespace(tokens=tokens, doc_offsets=built.offsets), TextSize(t.chars, t.bytes, t.words)
        del tokens
    finally:
        shutil.rmtree(work, ignore_errors=True)


def score_corpus(
    run: Run, corpus: Any, size: TextSize, *, name: str, lengths: Lengths = Lengths(), progress: bool = False
) -> EvalResult:
    """Ids already encoded (in memory, or a memory-mapped corpus) scored with the run's model; lengths default to
    the run's evaluation settings."""
    e, n = run.config.eval, lengths
    return evaluate(
        run.model,
        corpus,
        split=name,
        batch_size=n.batch_size or e.batch_size,
        seg_len=n.seg_len or run.seg_len,
        mem_len=run.mem_len if n.mem_len is None else n.mem_len,
        cmem_len=run.cmem_len if n.cmem_len is None else n.cmem_len,
        max_batches=e.max_batches if n.max_batches is None else n.max_batches,
        progress=progress,
        size=size,
        tokenizer_kind=run.tokenizer.kind,
        token_unit=token_unit(run.modality),
        amp_dtype=amp_dtype(inference_amp(run.config, next(run.model.parameters()).device)),
        unknown_id=getattr(run.tokenizer, "unk_id", None),
    )


def check_text_overrides(overrides: Sequence[str], *, split: str | None, what: str) -> None:
    """Refuse what scoring a user's text would silently ignore."""
    bad = [o for o in overrides if o.strip().split("=", 1)[0].strip() not in TEXT_EVAL_KEYS]
    if bad:
        raise ConfigError(f"--set {bad[0]}: has no effect with {what}; only {', '.join(TEXT_EVAL_KEYS)} apply")
    if split is not None and what == "--text":
        raise ConfigError(
            "--split: files given with --text have no splits; drop --split (or use --data DIR --format F --split S)"
        )


__all__ = [
    "TextSource",
    "binary_reason",
    "files_source",
    "corpus_source",
    "evaluate_text",
    "evaluate_source",
    "fresh_result_path",
    "result_path",
    "check_text_overrides",
]
