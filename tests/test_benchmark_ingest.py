"""benchmarks/ingest.py: the synthetic corpora are seeded and in their formats' layouts, and a ``--quick`` run end to
end in a fresh process measures ours and the anchor, whose encoding with the project's tokenizer gives the same
ids, writes its results schema, reuses them on a second run and writes nothing inside the repository."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ingest = pytest.importorskip("benchmarks.ingest")
pytest.importorskip("tokenizers")

ROOT = Path(__file__).resolve().parents[1]


def tree(root: Path) -> dict[str, int]:
    """Every file of the checkout (not git's, the venv's or bytecode caches) with its mtime."""
    skip = {".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache"}
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in skip]
        for name in filenames:
            p = os.path.join(dirpath, name)
            out[p] = os.lstat(p).st_mtime_ns
    return out


def run(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.ingest", *args], cwd=ROOT, env=env, capture_output=True, text=True
    )


def test_synthetic_corpora_are_seeded_and_in_their_formats_layouts(tmp_path: Path):
    from compressive_transformer.data.corpora.pg19 import read_pg19_metadata

    a, manifest = ingest.corpus(tmp_path / "a", "pg19", 0.001, seed=3)
    b, _ = ingest.corpus(tmp_path / "b", "pg19", 0.001, seed=3)
    c, _ = ingest.corpus(tmp_path / "c", "pg19", 0.001, seed=4)
    books = sorted(p.relative_to(a) for p in a.rglob("*.txt"))
    assert books == sorted(p.relative_to(b) for p in b.rglob("*.txt")) and len(books) == manifest["documents"] == 3
    assert all((a / p).read_bytes() == (b / p).read_bytes() for p in books)  # same seed, same bytes
    assert {p.parent.name for p in books} == {"train", "validation", "test"}
    assert sorted(read_pg19_metadata(a)) == sorted(p.stem for p in books)
    assert (a / books[0]).read_bytes() != (c / sorted(c.rglob("*.txt"))[0].relative_to(c)).read_bytes()
    assert abs(manifest["bytes"] - 1_000_000) < 20_000
    text = "".join((a / p).read_text(encoding="utf-8") for p in books)
    assert "\n\n" in text and max(map(len, text.splitlines())) < 100 and len(text.encode()) > len(text)  # UTF-8

    stamp = (a / "corpus.json").stat().st_mtime_ns
    assert (
        ingest.corpus(tmp_path / "a", "pg19", 0.001, seed=3)[0] == a and (a / "corpus.json").stat().st_mtime_ns == stamp
    )

    wiki, _ = ingest.corpus(tmp_path, "wikitext", 0.001, seed=0)
    lines = (wiki / "wiki.train.tokens").read_text(encoding="utf-8").split("\n")
    assert lines[0].startswith(" = ") and " <unk> " in "\n".join(lines) and all(ln.startswith(" ") for ln in lines[:-1])
    enwik8, _ = ingest.corpus(tmp_path, "enwik8", 0.001, seed=0)
    data = (enwik8 / "enwik8").read_bytes()
    assert len(data) == 1_000_000 and b"<page>" in data and b"[[" in data and any(x >= 0x80 for x in data[:20_000])


def test_work_directory_inside_the_repository_is_refused_in_one_line():
    r = run("--quick", "--work", str(ROOT / "scratch"))
    assert r.returncode != 0 and "inside the repository" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (ROOT / "scratch").exists()


def check_results(out: Path) -> dict:
    data = json.loads((out / "results.json").read_text())
    assert data["command"].startswith("python -m benchmarks.ingest --quick")
    assert {"cpu", "cpu_flags", "cores", "ram_gib", "torch", "tokenizers", "numpy"} <= set(data["machine"])
    by_key = {}
    for m in data["measurements"]:
        assert "error" not in m, m
        s = m["settings"]
        assert set(m["phases"]) <= {"tokenizer", "encode"} and "encode" in m["phases"]
        for phase in m["phases"].values():
            assert phase["seconds"] >= 0 and phase["peak_rss_mib"] > 0 and phase["cpu_seconds"] >= 0
        assert set(m["tokens"]) == {"train", "validation", "test"} and set(m["ids_sha256"]) == set(m["tokens"])
        assert m["summary"]["total_tokens"] == sum(m["tokens"].values()) > 0 and m["summary"]["mb_per_s"] > 0
        by_key[s["format"], s["tokenizer"], s["size_gb"], s["pipeline"]] = m
    for (fmt, kind, size, pipeline), m in by_key.items():
        if pipeline == "anchor-encode" or (pipeline == "anchor" and kind == "bytes"):
            ours = by_key[fmt, kind, size, "ours"]  # the equivalence check: the same ids in every split
            assert m["tokens"] == ours["tokens"] and m["ids_sha256"] == ours["ids_sha256"], (fmt, kind, size)
    return data


@pytest.mark.parametrize(
    "options",
    [
        pytest.param(["--formats", "pg19", "--tokenizers", "bytes,bpe"], id="pg19"),
        pytest.param([], id="every-format-and-tokenizer", marks=pytest.mark.slow),
    ],
)
def test_quick_run_measures_ours_and_the_anchor_equally_and_reuses_its_results(tmp_path: Path, options):
    work, out = tmp_path / "work", tmp_path / "out"
    before = tree(ROOT)
    r = run("--quick", *options, "--work", str(work), "--out", str(out))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    data = check_results(out)
    kinds = {(m["settings"]["format"], m["settings"]["tokenizer"]) for m in data["measurements"]}
    assert ("pg19", "bpe") in kinds and ("enwik8", "bpe") not in kinds  # enwik8 is byte-level only
    pipelines = {m["settings"]["pipeline"] for m in data["measurements"] if m["settings"]["tokenizer"] == "bpe"}
    assert pipelines == {"ours", "anchor", "anchor-encode"}
    md = (out / "results.md").read_text()
    assert "## pg19, bpe" in md and "yes, ids equal" in md and "NO:" not in md and "DIFFER" not in md
    assert "pg19 bytes ours: seconds ≈" in md  # two byte sizes: a fit (its slope, at 1-2 MB, is timing noise)
    assert "the full PG-19 (11.7 GB, 28,602 books)" in md or "no positive slope" in md
    assert (out / "ingest.png").stat().st_size > 0
    assert not list((work / "runs").rglob("*.bin"))  # the token caches are removed after each measurement

    again = run("--quick", *options, "--work", str(work), "--out", str(out))
    assert again.returncode == 0, again.stderr[-2000:]
    assert " ours: " not in again.stdout and " anchor: " not in again.stdout  # nothing measured again
    assert json.loads((out / "results.json").read_text())["measurements"] == data["measurements"]
    assert tree(ROOT) == before  # nothing written inside the repository


def measurement(size_gb: float, seconds: float, rss: float) -> dict:
    settings = {"format": "pg19", "tokenizer": "bytes", "size_gb": size_gb, "pipeline": "ours"}
    summary = {"seconds": seconds, "mb_per_s": size_gb * 1e3 / seconds, "peak_rss_mib": rss}
    summary |= {"tree_pss_peak_mib": rss, "total_tokens": int(size_gb * 1e9)}
    return {
        "settings": settings,
        "phases": {"encode": {"seconds": seconds}},
        "summary": summary,
        "corpus": {"bytes": int(size_gb * 1e9), "documents": int(size_gb * 2600)},
        "tokens": {},
        "ids_sha256": "",
    }


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [
        ((10.0, 50.0), "the full PG-19 (11.7 GB, 28,602 books): 0.02 h"),  # 5 s + 5 s/GB x 11.7 GB = 63.5 s
        ((50.0, 10.0), "no positive slope"),
    ],
)
def test_the_fit_extrapolates_to_the_full_pg19_only_from_a_positive_slope(seconds, expected):
    data = {
        "date": "d",
        "command": "c",
        "measurements": [measurement(1.0, seconds[0], 50), measurement(9.0, seconds[1], 55)],
    }
    md = ingest.markdown(data)
    fit = next(line for line in md.splitlines() if line.startswith("- pg19 bytes ours"))
    assert "peak RSS 50 → 55 MiB (1.10×)" in fit
    assert expected in fit, fit


def test_the_anchor_trains_on_the_projects_sample_when_its_run_records_one(tmp_path: Path):
    root, _ = ingest.corpus(tmp_path, "pg19", 0.002, seed=0)
    train = ingest.split_files("pg19", root, "train")
    spec = {"format": "pg19", "corpus": str(root), "run_dir": str(tmp_path / "run")}
    (tmp_path / "run").mkdir()
    assert ingest.training_files(spec) == (train, "the whole train split (as the project)")
    record = {"names": [train[-1].stem], "bytes": 1234}
    (tmp_path / "run" / "tokenizer_sample.json").write_text(json.dumps(record))
    files, said = ingest.training_files(spec)
    assert files == [train[-1]] and said.startswith(f"the project's sample: 1 of {len(train)} train files")
    (tmp_path / "run" / "tokenizer_sample.json").write_text(json.dumps({"names": ["train"], "bytes": 1234}))
    assert ingest.training_files(spec)[0] == train  # names that are not files: the whole split, and it says so


def test_sample_settings_reach_a_data_config_that_has_them_and_are_left_out_of_one_that_does_not(monkeypatch):
    import dataclasses

    import compressive_transformer.core.config as config

    spec = {"format": "pg19", "corpus": "/c", "tokenizer": "bpe", "vocab_size": 300, "tokenizer_sample": 10**8}
    spec["tokenizer_sample_seed"] = 7
    fields = {f.name for f in dataclasses.fields(config.DataConfig)}
    if "tokenizer_sample" not in fields:
        cfg = ingest.data_config(spec)
        assert cfg.vocab_size == 300 and cfg.path == "/c"

    @dataclasses.dataclass(frozen=True)
    class WithSample:
        format: str
        path: str
        tokenizer: str
        vocab_size: int = 0
        tokenizer_sample: int = 0
        tokenizer_sample_seed: int = 0

    monkeypatch.setattr(config, "DataConfig", WithSample)
    assert ingest.data_config(spec) == WithSample("pg19", "/c", "bpe", 300, 10**8, 7)
    assert ingest.data_config(spec | {"tokenizer_sample": None}).tokenizer_sample == 0  # the project's default
