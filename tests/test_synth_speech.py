"""scripts/synth_speech.py writes the number of files asked for per split, taking more passages from the books that
have them when one falls short, or says how many it could make and why; it never writes into a folder of WAV files.
espeak-ng is replaced by a stand-in that writes the file, so nothing here needs it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "synth_speech.py"


@pytest.fixture
def synth(monkeypatch: pytest.MonkeyPatch):
    spec = importlib.util.spec_from_file_location("synth_speech", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(module, "speak", lambda text, voice, path, speed: path.write_text(text))
    monkeypatch.setattr(module, "espeak_version", lambda: {"espeak-ng": "stand-in", "package": None})
    return module


def book(path: Path, sentences: int) -> None:
    """A PG-19-style book: 200 lines of front matter (skipped), then ``sentences`` sentences."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "\n".join(
        f"Sentence {i} of {path.stem} tells of a quick brown fox and a lazy dog." for i in range(sentences)
    )
    path.write_text("front matter\n" * 200 + text + "\n")


def test_a_short_book_is_made_up_for_by_the_others(synth, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    books = tmp_path / "books"
    book(books / "train" / "1.txt", 50)
    book(books / "validation" / "2.txt", 0)  # front matter only: no passage
    book(books / "validation" / "3.txt", 50)
    book(books / "test" / "4.txt", 50)
    assert synth.main(["--books", str(books), "--out", str(tmp_path / "out"), "--files", "3", "2", "1"]) == 0
    counts = {s: len(list((tmp_path / "out" / s).glob("*.wav"))) for s in ("train", "validation", "test")}
    assert counts == {"train": 3, "validation": 2, "test": 1}, capsys.readouterr()


def test_too_few_passages_are_written_and_explained(synth, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    books = tmp_path / "books"
    book(books / "train" / "1.txt", 50)
    book(books / "validation" / "2.txt", 1)  # one passage at most
    book(books / "test" / "3.txt", 50)
    assert synth.main(["--books", str(books), "--out", str(tmp_path / "out"), "--files", "2", "3", "1"]) == 0
    err = capsys.readouterr().err
    assert "validation: 1 files" in err and "not the 3 asked for" in err and "1 book(s)" in err, err
    assert len(list((tmp_path / "out" / "validation").glob("*.wav"))) == 1


def test_a_folder_of_wav_files_is_never_written_into(synth, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    books = tmp_path / "books"
    for split in ("train", "validation", "test"):
        book(books / split / "1.txt", 20)
    out = tmp_path / "out"
    (out / "validation").mkdir(parents=True)
    (out / "validation" / "0007.wav").write_bytes(b"an earlier corpus")
    assert synth.main(["--books", str(books), "--out", str(out), "--files", "1", "1", "1"]) == 2
    assert "already holds WAV files" in capsys.readouterr().err
    assert not (out / "train").exists() and (out / "validation" / "0007.wav").read_bytes() == b"an earlier corpus"
