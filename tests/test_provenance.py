"""runs.provenance: the code commit and whether the tree was dirty (read in a real temporary git repository, and
recorded as unknown, with why, where there is no git), the data's fingerprint per split (hashed in blocks, equal to
the whole file's hash), and the lines a study's report prints when its runs were made by different code or data."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

from compressive_transformer.core.config import DataConfig
from compressive_transformer.runs import provenance
from compressive_transformer.runs.provenance import code_label, code_state, data_fingerprint, is_mixed, mixed_lines

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True, capture_output=True
    )


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "src" / "model.py").write_text("x = 1\n")
    (repo / "out").mkdir()
    (repo / "out" / "results.md").write_text("old\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "first")
    return repo


@needs_git
def test_a_clean_tree_names_its_commit_and_a_changed_one_is_dirty(repo: Path) -> None:
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    clean = code_state(repo)
    assert clean["commit"] == head and clean["dirty"] is False and clean["why"] is None
    (repo / "src" / "model.py").write_text("x = 2\n")
    dirty = code_state(repo)
    assert dirty["commit"] == head and dirty["dirty"] is True and dirty["changed"] == ["src/model.py"]
    assert code_label(dirty) == head[:7] + " (dirty)"


@needs_git
def test_a_new_code_file_is_dirty_and_the_studys_own_output_is_not(repo: Path) -> None:
    (repo / "out" / "results.md").write_text("rewritten by the study\n")
    assert code_state(repo)["dirty"] is True
    assert code_state(repo, exclude=[repo / "out"])["dirty"] is False, (
        "a study rewriting its report is not a code change"
    )
    (repo / "src" / "new.py").write_text("y = 1\n")
    state = code_state(repo / "src", exclude=[repo / "out"])
    assert state["dirty"] is True and state["changed"] == ["src/new.py"]


def test_outside_a_git_tree_the_commit_is_unknown_and_says_why(tmp_path: Path) -> None:
    state = code_state(tmp_path)
    assert state["commit"] is None and state["dirty"] is None and "no git commit" in state["why"]
    assert code_label(state).startswith("unknown (no git commit")


def test_without_git_the_commit_is_unknown_and_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no git on it
    state = code_state(tmp_path)
    assert state["commit"] is None and state["dirty"] is None and state["why"] == "git is not installed"


def test_the_fingerprint_hashes_each_splits_files_in_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    corpus = tmp_path / "corpus"
    for split in ("train", "validation", "test"):
        (corpus / split).mkdir(parents=True)
    (corpus / "train" / "1.txt").write_text("a book of many words\n" * 5000)
    (corpus / "validation" / "2.txt").write_text("another book\n" * 100)
    (corpus / "test" / "3.txt").write_text("the test book\n" * 100)
    monkeypatch.setattr(provenance, "BLOCK", 1000)  # many blocks per file
    cfg = DataConfig(format="pg19", path=str(corpus))
    got = data_fingerprint(cfg, ("train", "validation", "test"))
    train = got["splits"]["train"]
    content = (corpus / "train" / "1.txt").read_bytes()
    assert train["files"] == [
        {"path": str(corpus / "train" / "1.txt"), "bytes": len(content), "sha256": hashlib.sha256(content).hexdigest()}
    ]
    assert train["file_count"] == 1 and train["bytes"] == len(content)
    assert len({s["sha256"] for s in got["splits"].values()}) == 3 and got["generator"] is None
    (corpus / "test" / "3.txt").write_text("the test book, edited\n" * 100)
    again = data_fingerprint(cfg, ("train", "test"))
    assert again["splits"]["train"]["sha256"] == train["sha256"]
    assert again["splits"]["test"]["sha256"] != got["splits"]["test"]["sha256"], "a changed file changes its split"


def test_one_shared_data_and_code_is_one_line_and_mixed_runs_are_listed_run_by_run() -> None:
    data = {"splits": {"test": {"sha256": "d" * 64}}}
    same = {f"txl seed {s}": {"code": {"commit": "a" * 40, "dirty": False}, "data": data} for s in (0, 1)}
    assert mixed_lines(same) == [f"Provenance: every run made by code {'a' * 7}, data test dddddddd."]
    assert not is_mixed(same)
    mixed = same | {"ct seed 0": {"code": {"commit": "b" * 40, "dirty": True}, "data": data}, "ct seed 1": None}
    lines = mixed_lines(mixed)
    assert is_mixed(mixed) and "3 code state(s)" in lines[0]
    assert "| ct seed 0 | bbbbbbb (dirty) | test dddddddd |" in lines
    assert "| ct seed 1 | unknown (no record) | unknown (no record) |" in lines
    assert "| txl seed 1 | aaaaaaa | test dddddddd |" in lines
