"""The ``python-source`` corpus: the standard library's .py files split by a fixed rule on each file's relative
path; every included file in exactly one split, installed packages and test suites in none, one document per file
(so memory resets at each file's start)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from compressive_transformer.core.config import DataConfig
from compressive_transformer.core.registry import FORMATS
from compressive_transformer.data import build_tokenizer, load_corpus, read_split
from compressive_transformer.data.corpora.python_source import (
    NAME,
    SPLIT_BOUNDS,
    python_files,
    read_python_source,
    split_of,
    stdlib_root,
)
from compressive_transformer.data.streams import StreamBatcher

SPLITS = tuple(SPLIT_BOUNDS)


def test_the_rule_is_pinned() -> None:
    """sha256(path)[:8] mod 100: these values are the documented rule; a change would silently reshuffle the splits."""
    got = {p: split_of(p) for p in ("json/decoder.py", "argparse.py", "ast.py", "bisect.py", "_compression.py")}
    assert got == {
        "json/decoder.py": "validation",
        "argparse.py": "train",
        "ast.py": "test",
        "bisect.py": "validation",
        "_compression.py": "test",
    }


@given(st.lists(st.text(alphabet="abcdefgh_/", min_size=1, max_size=12), max_size=40))
def test_every_path_lands_in_exactly_one_split(paths: list[str]) -> None:
    for p in paths:
        assert [s for s in SPLITS if split_of(p) == s] == [split_of(p)]


def _tree(root: Path) -> None:
    files = {
        "a.py": "x = 1\n",
        "pkg/mod.py": "def f():\n    return 2\n",
        "pkg/sub/deep.py": "import os\n",
        "site-packages/third.py": "y = 1\n",
        "test/test_a.py": "assert True\n",
        "pkg/tests/t.py": "assert True\n",
        "idlelib/idle_test/t.py": "pass\n",
        "encodings/cp000.py": "table = ()\n",
        "pydoc_data/topics.py": "topics = {}\n",
        "_sysconfigdata__linux.py": "build_time_vars = {}\n",
        "notes.txt": "not python\n",
    }
    for i in range(40):
        files[f"gen/m{i:02d}.py"] = f"value_{i} = {i}\n"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "latin1.py").write_bytes(b"s = '\xe9'\n")  # not UTF-8: skipped when read


def test_splits_are_disjoint_and_cover_every_included_file(tmp_path: Path) -> None:
    _tree(tmp_path)
    by_split = {s: [p.relative_to(tmp_path).as_posix() for p in python_files(tmp_path, s)] for s in SPLITS}
    everything = [name for names in by_split.values() for name in names]
    assert len(everything) == len(set(everything)), "a file in two splits"
    expected = {"a.py", "pkg/mod.py", "pkg/sub/deep.py", "latin1.py"} | {f"gen/m{i:02d}.py" for i in range(40)}
    assert set(everything) == expected, "excluded directories and generated modules are in no split"
    for s, names in by_split.items():
        assert names == sorted(names) and all(split_of(n) == s for n in names)
    assert all(by_split[s] for s in SPLITS), "40 files reach every split"
    read = {s: read_python_source(tmp_path, s) for s in SPLITS}
    assert "latin1.py" not in [n for r in read.values() for n in r.names]
    for s, r in read.items():
        assert r.names == [n for n in by_split[s] if n != "latin1.py"]
        assert r.documents == [(tmp_path / n).read_text() for n in r.names]


def test_the_split_is_the_same_under_another_root(tmp_path: Path) -> None:
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    _tree(tmp_path / "one")
    _tree(tmp_path / "two")
    for s in SPLITS:
        a = [p.relative_to(tmp_path / "one") for p in python_files(tmp_path / "one", s)]
        b = [p.relative_to(tmp_path / "two") for p in python_files(tmp_path / "two", s)]
        assert a == b


def test_the_real_standard_library(tmp_path: Path) -> None:
    assert NAME in FORMATS and not FORMATS[NAME].needs_path
    cfg = DataConfig(format=NAME, tokenizer="bytes")
    raws = {s: read_split(cfg, s) for s in SPLITS}
    names = [n for r in raws.values() for n in r.names]
    assert len(names) == len(set(names)) > 100
    assert not any("site-packages" in n or n.startswith("test/") for n in names)
    assert all(str(p).startswith(str(stdlib_root())) for r in raws.values() for p in r.sources)
    assert {s: split_of(n) for s, r in raws.items() for n in r.names[:1]} == {s: s for s in SPLITS}
    # one document per file, so the stream resets memory exactly at each file's first token
    raw = raws["test"]
    tok = build_tokenizer(cfg, [])
    corpus = load_corpus(cfg, "test", tok, tmp_path / "cache")
    assert corpus.num_docs == len(raw.documents)
    lengths = np.diff(corpus.doc_offsets)
    assert lengths.tolist() == [len(d.encode("utf-8")) for d in raw.documents]
    batcher = StreamBatcher(corpus, batch_size=4, seg_len=64)
    starts = sum(int(b.reset.sum()) for b in batcher)
    assert starts == corpus.num_docs
