"""Ingestion at any size: documents read in pieces, the cache built in shards and resumed after a kill byte for byte,
a corpus changed during a build refused, the tokenizer's sample drawn reproducibly, no split ever held whole."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from compressive_transformer.core.config import ConfigError, DataConfig
from compressive_transformer.data import ByteTokenizer, WordTokenizer, load_corpus, read_split, stream_split
from compressive_transformer.data import cache as cache_module
from compressive_transformer.data import documents as documents_module
from compressive_transformer.data import shards as shards_module
from compressive_transformer.data.corpora import text as text_format
from compressive_transformer.data.documents import (
    Resolver,
    TextCounter,
    byte_blocks,
    file_pieces,
    has_wide_space,
    iter_chunks,
    rechunk,
    utf8_characters,
    utf8_of,
)
from compressive_transformer.data.readers import not_text
from compressive_transformer.data.sample import Sample, train_tokenizer
from compressive_transformer.data.units import text_size

TEXT = st.text(alphabet=st.sampled_from(list("ab \n\t\x1céé€\u2003x")), max_size=300)


@settings(max_examples=200, deadline=None)
@given(TEXT, st.lists(st.integers(1, 40), max_size=20), st.integers(1, 30))
def test_rechunk_cuts_a_stream_as_iter_chunks_cuts_the_whole(text: str, cuts: list[int], size: int) -> None:
    blocks, rest = [], text
    for c in cuts:
        blocks.append(rest[:c])
        rest = rest[c:]
    blocks.append(rest)
    assert list(rechunk(blocks, size, cap=10_000)) == list(iter_chunks(text, size))
    encoded = [b.encode() for b in blocks]
    assert list(rechunk(encoded, size, cap=10_000)) == list(iter_chunks(text.encode(), size))


@settings(max_examples=200, deadline=None)
@given(TEXT, st.integers(2, 30))
def test_a_line_longer_than_the_cap_is_cut_and_nothing_is_lost(text: str, cap: int) -> None:
    pieces = list(rechunk([text], 1, cap=cap))
    assert "".join(pieces) == text
    assert all(len(p) <= cap + 1 for p in pieces[:-1]) or all("\n" in p for p in pieces[:-1])


@settings(max_examples=200, deadline=None)
@given(st.lists(TEXT, max_size=6), st.booleans())
def test_counts_piece_by_piece_equal_the_whole_documents(parts: list[str], as_bytes: bool) -> None:
    whole: str | bytes = "".join(parts)
    pieces: list[str | bytes] = list(parts)
    if as_bytes:  # cut bytes anywhere, even inside a character: still counted as the whole document is
        raw = "".join(parts).encode()
        whole, pieces = raw, [raw[i : i + 3] for i in range(0, len(raw), 3)]
    counter = TextCounter()
    for p in pieces:
        counter.add(p, utf8_of(p))
    expected = text_size(whole)
    assert counter.finish() == (expected.chars, expected.bytes, expected.words)


SPACES = [chr(c) for c in range(0x3001) if chr(c).isspace()]  # every whitespace character there is


@settings(max_examples=500, deadline=None)
@given(st.text(st.characters(codec="utf-8"), max_size=40) | st.text(st.sampled_from([*SPACES, "\u2030", "\xe9", "a"])))
def test_wide_whitespace_is_found_in_the_bytes_exactly_where_str_sees_it(text: str) -> None:
    assert has_wide_space(text.encode()) == any(c.isspace() and not c.isascii() for c in text)


BYTES = st.binary(max_size=60) | st.text(st.characters(codec="utf-8"), max_size=30).map(str.encode)


@settings(max_examples=500, deadline=None)
@given(BYTES, st.integers(0, 200))
def test_utf8_is_checked_on_its_high_bytes_as_the_decoder_checks_it(data: bytes, ascii_pad: int) -> None:
    for raw in (data, b"a" * ascii_pad + data + b"b" * ascii_pad):  # dense (decoded) and sparse (by the array)
        arr = np.frombuffer(raw, dtype=np.uint8)
        try:
            expected: int | None = len(raw.decode("utf-8"))
        except UnicodeDecodeError:
            expected = None
        if raw.isascii():
            continue
        assert utf8_characters(raw, arr, np.flatnonzero(arr >= 0x80)) == expected


@settings(max_examples=300, deadline=None)
@given(BYTES | st.lists(TEXT, max_size=4).map(lambda t: "".join(t).encode()), st.lists(st.integers(1, 9), max_size=12))
def test_undecided_bytes_count_as_their_document_whatever_the_cuts(data: bytes, cuts: list[int]) -> None:
    """Text when the whole is UTF-8 without a NUL (str's characters and words), else a bytes document."""
    counter, at = TextCounter(), 0
    for c in [*cuts, len(data)]:  # cut anywhere, even inside a character
        counter.add_utf8(data[at : at + c])
        at += c
    try:
        whole: str | bytes = data.decode("utf-8") if b"\x00" not in data else data
    except UnicodeDecodeError:
        whole = data
    expected = text_size(whole)
    assert counter.finish() == (expected.chars, expected.bytes, expected.words)
    assert counter.is_text == isinstance(whole, str)


@settings(max_examples=100, deadline=None)
@given(BYTES, st.integers(1, 9), st.integers(0, 5))
def test_byte_blocks_are_the_file_cut_at_characters(tmp_path_factory, data: bytes, block: int, lo: int) -> None:
    path = tmp_path_factory.mktemp("blocks") / "f.bin"
    path.write_bytes(data)
    lo = min(lo, len(data))
    pieces = list(byte_blocks(path, lo, len(data), block=block))
    assert b"".join(p.text for p in pieces) == data[lo:]
    assert sum(p.consumed for p in pieces) == len(data) - lo
    assert all(p.undecided for p in pieces)
    try:
        data[lo:].decode("utf-8")
    except UnicodeDecodeError:
        return
    for p in pieces:  # UTF-8 cut only between characters: each block decodes on its own
        p.text.decode("utf-8")


def test_invalid_utf8_bytes_count_one_character_each() -> None:
    counter = TextCounter()
    for p in (b"ab\xc3", b"\xa9 \xff"):
        counter.add(p, p)
    assert counter.finish() == (6, 6, 2)


TEXT_FILE = "café one\ntwo €\u2003 three\n".encode() * 300  # a wide space among the words
BINARY_FILE = b"bin\x00ary\n" * 200 + b"\xff\n"


def test_a_large_file_is_read_in_blocks_as_a_small_one_is_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "f.txt"
    path.write_bytes(TEXT_FILE)
    error = not_text(DataConfig(tokenizer="words"))
    whole = [p.text for p in file_pieces(path, "words", error)]
    monkeypatch.setattr(documents_module, "WHOLE_FILE", 100)
    monkeypatch.setattr(documents_module, "READ_BLOCK", 7)
    assert [p.text for p in file_pieces(path, "words", error)] == whole, "the same pieces, read whole or not"
    inner = [p.text for p in file_pieces(path, "words", error, 5, len(TEXT_FILE) - 1)]  # a range
    assert "".join(inner) == TEXT_FILE[5:-1].decode()


@pytest.mark.parametrize("content", [TEXT_FILE, BINARY_FILE])
def test_the_byte_tokenizer_reads_blocks_counted_as_the_whole_file_decides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: bytes
) -> None:
    path = tmp_path / "f.txt"
    path.write_bytes(content)
    monkeypatch.setattr(documents_module, "BYTE_BLOCK", 7)
    pieces = list(file_pieces(path, "bytes", not_text(DataConfig(tokenizer="bytes"))))
    assert len(pieces) > 100 and b"".join(p.text for p in pieces) == content
    counter = TextCounter()
    for p in pieces:
        counter.add_piece(p)
    whole = content.decode() if content is TEXT_FILE else content  # as a file read whole is decided
    expected = text_size(whole)
    assert counter.finish() == (expected.chars, expected.bytes, expected.words)
    assert counter.is_text == (content is TEXT_FILE)
    split = read_split(DataConfig(format="text", path=str(path), tokenizer="bytes"), "train")  # 90% of the file
    (doc,) = split.documents
    assert type(doc) is type(whole), "a document read whole is str or bytes as before"
    assert content.startswith(utf8_of(doc)) and len(utf8_of(doc)) > 0.8 * len(content)


def _old_line_bounds(text: str) -> dict[str, tuple[int, int]]:
    """The 90/5/5 rule on a text read whole: cut points in characters, each moved to just after a newline."""
    n, cuts = len(text), []
    for frac in (0.90, 0.95):
        nl = text.find("\n", int(n * frac))
        cuts.append(n if nl < 0 else nl + 1)
    return {"train": (0, cuts[0]), "validation": (cuts[0], cuts[1]), "test": (cuts[1], n)}


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.text(alphabet=st.sampled_from(list("aé€ \U0001f600")), min_size=1, max_size=12), min_size=8, max_size=60
    )
)
def test_one_file_is_split_by_characters_without_reading_it_whole(tmp_path_factory, lines: list[str]) -> None:
    text = "\n".join(lines) + "\n"
    path = tmp_path_factory.mktemp("one") / "book.txt"
    path.write_text(text, encoding="utf-8")
    cfg = DataConfig(format="text", path=str(path), tokenizer="bytes")
    old = _old_line_bounds(text)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(documents_module, "READ_BLOCK", 5)  # blocks end inside characters
        text_format._bounds.cache_clear()
        try:
            bounds = text_format.one_file_bounds(path, cfg)
        except ConfigError:
            assert any(hi <= lo for lo, hi in old.values())
            return
    for split, (lo, hi) in bounds.items():
        a, b = old[split]
        assert text.encode()[lo:hi].decode() == text[a:b]


def write_books(root: Path, n: int = 12, seed: int = 0) -> DataConfig:
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "épsilon", "zeta", "eta", "theta"]
    for split, count in (("train", n), ("validation", 2), ("test", 2)):
        (root / split).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            lines = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 12))) for _ in range(rng.randint(5, 80))]
            (root / split / f"{100 + i}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return DataConfig(format="pg19", path=str(root), tokenizer="words")


def cache_files(cache: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(cache.iterdir()) if p.is_file()}


def test_the_cache_is_the_same_whatever_the_shard_and_batch_sizes(tmp_path: Path) -> None:
    cfg = write_books(tmp_path / "books")
    tok = WordTokenizer.train(read_split(cfg, "train").documents)
    load_corpus(cfg, "train", tok, tmp_path / "a", progress=False)
    load_corpus(cfg, "train", tok, tmp_path / "b", progress=False, shard_bytes=300, batch_bytes=50)
    a, b = cache_files(tmp_path / "a"), cache_files(tmp_path / "b")
    assert {k: v for k, v in a.items() if not k.endswith(".json")} == {
        k: v for k, v in b.items() if not k.endswith(".json")
    }
    meta_a, meta_b = (json.loads(next(v for k, v in d.items() if k.endswith(".json"))) for d in (a, b))
    assert {k: v for k, v in meta_a.items() if k != "shards"} == {k: v for k, v in meta_b.items() if k != "shards"}
    assert len(meta_b["shards"]) > len(meta_a["shards"]) == 1


KILLED_BUILD = textwrap.dedent(
    """
    import os, signal, sys
    from compressive_transformer.core import fileio
    from compressive_transformer.core.config import DataConfig
    from compressive_transformer.data import WordTokenizer, load_corpus, load_tokenizer
    from compressive_transformer.data import shards

    cfg = DataConfig(format="pg19", path=sys.argv[1], tokenizer="words")
    tok = load_tokenizer(sys.argv[2])
    kill_at, calls = int(sys.argv[4]), [0]

    def maybe_die():
        calls[0] += 1
        if calls[0] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    real_encode, real_write = shards._Writer._encode, fileio.write_text_atomic
    shards._Writer._encode = lambda self, texts: (maybe_die(), real_encode(self, texts))[1]
    shards.write_text_atomic = lambda path, text: (maybe_die(), real_write(path, text), maybe_die())[1]
    load_corpus(cfg, "train", tok, sys.argv[3], progress=False, shard_bytes=400, batch_bytes=120)
    print("done")
    """
)


def test_a_build_killed_anywhere_resumes_to_the_same_bytes(tmp_path: Path) -> None:
    cfg = write_books(tmp_path / "books", n=10)
    tok = WordTokenizer.train(read_split(cfg, "train").documents)
    tok.save(tmp_path / "tok")
    load_corpus(cfg, "train", tok, tmp_path / "whole", progress=False, shard_bytes=400, batch_bytes=120)
    script = tmp_path / "build.py"
    script.write_text(KILLED_BUILD)
    rng, kills = random.Random(1), 0
    for _ in range(60):
        argv = [sys.executable, str(script), cfg.path, str(tmp_path / "tok"), str(tmp_path / "killed")]
        out = subprocess.run([*argv, str(rng.randint(1, 12))], capture_output=True, text=True, timeout=120)
        if out.returncode == 0 and "done" in out.stdout:
            break
        assert out.returncode == -9, out.stderr
        kills += 1
    else:
        pytest.fail("the build never finished")
    assert kills >= 3, "the kills landed inside the build"
    assert cache_files(tmp_path / "killed") == cache_files(tmp_path / "whole")
    assert not list((tmp_path / "killed").glob("*.build")), "the build directory is gone once the cache is complete"


def test_a_corpus_changed_during_the_build_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = write_books(tmp_path / "books")
    tok = WordTokenizer.train(read_split(cfg, "train").documents)
    first = tmp_path / "books" / "train" / "100.txt"
    real = shards_module._Writer._encode

    def change_then_encode(self, texts):
        first.write_text(first.read_text() + "more words\n")
        return real(self, texts)

    monkeypatch.setattr(shards_module._Writer, "_encode", change_then_encode)
    with pytest.raises(ConfigError, match="changed while its token cache was being built") as e:
        load_corpus(cfg, "train", tok, tmp_path / "cache", progress=False, shard_bytes=200)
    assert "\n" not in str(e.value)


def interrupt_encode(monkeypatch: pytest.MonkeyPatch, at_call: int) -> None:
    """Make the build's ``at_call``-th batch encoding raise KeyboardInterrupt (Ctrl-C while it encodes)."""
    real, calls = shards_module._Writer._encode, [0]

    def encode(self, texts):
        calls[0] += 1
        if calls[0] == at_call:
            raise KeyboardInterrupt
        return real(self, texts)

    monkeypatch.setattr(shards_module._Writer, "_encode", encode)


def test_a_build_interrupted_then_corpus_changed_starts_again_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    cfg = write_books(tmp_path / "books")
    tok = WordTokenizer.train(read_split(cfg, "train").documents)
    interrupt_encode(monkeypatch, at_call=3)
    with pytest.raises(KeyboardInterrupt):
        load_corpus(cfg, "train", tok, tmp_path / "cache", progress=False, shard_bytes=200, batch_bytes=100)
    monkeypatch.undo()
    assert list((tmp_path / "cache").glob("*.build/shard-*.json")), "finished shards are kept"
    (tmp_path / "books" / "train" / "105.txt").write_text("new text here\n")
    corpus = load_corpus(cfg, "train", tok, tmp_path / "cache", progress=False, shard_bytes=200, batch_bytes=100)
    assert "cannot be resumed (the corpus changed since" in capsys.readouterr().err
    fresh = load_corpus(cfg, "train", tok, tmp_path / "fresh", progress=False)
    assert np.array_equal(corpus.tokens, fresh.tokens) and corpus.names == fresh.names


def test_no_document_is_held_while_another_is_read_and_batches_stay_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = write_books(tmp_path / "books", n=30)
    stream = stream_split(cfg, "train")
    open_now, most, batch_bytes = [0], [0], 500

    def counted(read):
        def pieces():
            open_now[0] += 1
            most[0] = max(most[0], open_now[0])
            yield from read()
            open_now[0] -= 1

        return pieces

    docs = [type(d)(d.name, d.size, d.files, counted(d.read)) for d in stream.documents]
    monkeypatch.setattr(cache_module, "stream_split", lambda c, s: type(stream)(s, docs, stream.sources))
    tok = ByteTokenizer()
    sizes: list[int] = []
    real = tok.encode_pieces
    monkeypatch.setattr(
        tok, "encode_pieces", lambda pieces: (sizes.append(sum(map(len, map(utf8_of, pieces)))), real(pieces))[1]
    )
    load_corpus(cfg, "train", tok, tmp_path / "cache", progress=False, batch_bytes=batch_bytes)
    assert most[0] == 1, "one document is read at a time"
    longest_piece = max(len(utf8_of(p.text)) for d in stream.documents for p in d.read())
    assert len(sizes) > 5 and max(sizes) <= batch_bytes + longest_piece


def test_the_tokenizer_sample_is_seeded_spread_and_recorded(tmp_path: Path) -> None:
    cfg = write_books(tmp_path / "books", n=40)
    stream = stream_split(cfg, "train")
    budget = stream.total_bytes // 4

    def names(seed: int) -> list[str]:
        sample = Sample(stream, budget, seed, progress=False)
        for doc in sample.documents():
            list(doc)
        return sample.names

    assert names(0) == names(0) and names(0) != names(1)
    ids = sorted(int(n) for n in names(0))
    assert ids != list(range(100, 100 + len(ids))), "not the first books"
    assert ids[-1] - ids[0] > 20, "spread over the split"
    tok = train_tokenizer(
        DataConfig(format="pg19", path=cfg.path, tokenizer="words", tokenizer_sample=budget), stream, progress=False
    )
    record = tok.sample
    assert record["seed"] == 0 and record["sample_bytes"] == budget and 0 < record["bytes"] < stream.total_bytes
    tok.save(tmp_path / "tok")
    saved = json.loads((tmp_path / "tok" / "tokenizer_sample.json").read_text())
    assert saved["names"] == record["names"]


def test_a_sample_covering_the_split_trains_the_tokenizer_of_the_whole_split(tmp_path: Path) -> None:
    cfg = write_books(tmp_path / "books", n=6)
    whole = WordTokenizer.train(read_split(cfg, "train").documents)
    sampled = train_tokenizer(cfg, stream_split(cfg, "train"), progress=False)
    assert sampled.vocab == whole.vocab and sampled.sample["whole_split"]


@pytest.mark.parametrize(
    "key, value, fragment",
    [
        ("tokenizer_sample", -1, "must be >= 0"),
        ("tokenizer_sample", 10, "is not trained"),
        ("tokenizer_sample_seed", 3, "is not trained"),
    ],
)
def test_sample_settings_that_cannot_work_are_refused(key: str, value: int, fragment: str) -> None:
    tokenizer = "words" if value < 0 else "bytes"
    with pytest.raises(ConfigError, match=fragment):
        DataConfig(tokenizer=tokenizer, **{key: value})


def test_data_prepare_then_train_starts_from_the_prepared_cache(tmp_path: Path) -> None:
    cfg = write_books(tmp_path / "books", n=4)
    exe = Path(sys.executable).with_name("compressive-transformer")
    common = ["--set", "data.format=pg19", "--set", f"data.path={cfg.path}", "--set", "data.tokenizer=words"]
    prep = subprocess.run(
        [str(exe), "data", "prepare", *common, "--run-dir", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert prep.returncode == 0, prep.stderr
    assert "cached pg19 train: 4 documents" in prep.stdout and "train with the same config and --run-dir" in prep.stdout
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "run" / ".cache").rglob("*") if p.is_file()}
    train = subprocess.run(
        [
            str(exe),
            "train",
            *common,
            "--set",
            "train.steps=1",
            "--set",
            "train.val_every=0",
            "--run-dir",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert train.returncode == 0, train.stderr
    after = {p: p.stat().st_mtime_ns for p in before}
    assert after == before, "train read the prepared tokenizer and cache, rebuilding nothing"
    again = subprocess.run(
        [str(exe), "data", "prepare", *common, "--run-dir", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 2 and "already holds a run" in again.stderr


def test_releasing_the_mapped_pages_read_changes_no_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from compressive_transformer.data import StreamBatcher
    from compressive_transformer.data import streams as streams_module

    cfg = write_books(tmp_path / "books", n=6)
    corpus = load_corpus(cfg, "train", ByteTokenizer(), tmp_path / "cache", progress=False)
    released = []
    real = streams_module.release_pages
    monkeypatch.setattr(streams_module, "release_pages", lambda t: (released.append(1), real(t)))
    kept = StreamBatcher(corpus, batch_size=2, seg_len=64)
    kept.release_bytes = 1 << 60
    dropped = StreamBatcher(corpus, batch_size=2, seg_len=64)
    dropped.release_bytes = 1  # after every batch
    for a, b in zip(kept, dropped):
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.targets, b.targets)
    assert len(released) > 10


def test_word_ids_from_the_pool_of_processes_equal_those_of_one_process(tmp_path: Path) -> None:
    from compressive_transformer.data.word_ids import WordPool, word_ids

    cfg = write_books(tmp_path / "books", n=8)
    texts = [p.text for d in stream_split(cfg, "train").documents for p in d.read()]
    tok = WordTokenizer.train(["alpha beta gamma"])  # the other words are unknown
    pool = WordPool(tok._index, tok.unk_id, workers=2)
    try:
        pooled = pool(texts)
    finally:
        pool.close()
    alone = word_ids(texts, tok._index, tok.unk_id)
    assert len(pooled) == len(texts) and all(np.array_equal(a, b) for a, b in zip(pooled, alone))
    assert any((a == tok.unk_id).any() for a in alone)


def test_a_shard_whose_ids_the_disk_lost_is_built_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ids reach the file without a sync per shard: after a machine stopped before writing its cache back, a shard's
    record may outlive its ids. The resumed build checks each shard's ids and goes back to the last that holds."""
    cfg = write_books(tmp_path / "books")
    tok = WordTokenizer.train(read_split(cfg, "train").documents)
    whole = load_corpus(cfg, "train", tok, tmp_path / "whole", progress=False, shard_bytes=200, batch_bytes=100)
    interrupt_encode(monkeypatch, at_call=8)
    with pytest.raises(KeyboardInterrupt):
        load_corpus(cfg, "train", tok, tmp_path / "cache", progress=False, shard_bytes=200, batch_bytes=100)
    monkeypatch.undo()
    (build,) = (tmp_path / "cache").glob("*.build")
    records = sorted(build.glob("shard-*.json"))
    assert len(records) >= 2
    last = json.loads(records[-1].read_text())
    with (build / "tokens.bin").open("r+b") as f:  # the last shard's ids never reached the disk: garbage
        f.seek((last["tokens_end"] - 1) * np.dtype(whole.tokens.dtype).itemsize)
        f.write(b"\xff" * np.dtype(whole.tokens.dtype).itemsize)
    corpus = load_corpus(cfg, "train", tok, tmp_path / "cache", progress=False, shard_bytes=200, batch_bytes=100)
    assert np.array_equal(corpus.tokens, whole.tokens) and corpus.names == whole.names


def test_a_path_is_named_as_resolve_names_it_with_each_folder_resolved_once(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "a.txt").write_text("a")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    (tmp_path / "real" / "b.txt").symlink_to(tmp_path / "real" / "a.txt")
    resolve = Resolver()
    for path in [tmp_path / "real" / "a.txt", tmp_path / "link" / "a.txt", tmp_path / "link" / "b.txt",
                 tmp_path / "link" / ".." / "real" / "a.txt", tmp_path / "real" / "missing.txt"]:  # fmt: skip
        assert resolve(path) == str(path.resolve())
