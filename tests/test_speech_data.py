"""The speech studies' data can be made again: benchmarks/speech/data.json names the build (espeak-ng's version,
the script's options, the books' hashes) and the fingerprint of the files the studies ran on; the studies' own
per-run records agree with it, and regenerating the corpus here (where espeak-ng of that build and the books exist)
gives the recorded files byte for byte, at full size (about two seconds)."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from compressive_transformer.core.config import DataConfig
from compressive_transformer.runs.provenance import data_fingerprint, file_hash

ROOT = Path(__file__).resolve().parents[1]
RECORD = json.loads((ROOT / "benchmarks" / "speech" / "data.json").read_text(encoding="utf-8"))
BOOKS = ROOT.parent / "shared" / "data" / "pg19-sample"
STUDIES = ("full", "fair", "tuned", "lr-sweep")


@pytest.mark.parametrize("study", STUDIES)
def test_every_study_ran_on_the_recorded_files(study: str) -> None:
    """Each run's measured sample counts per split are the recorded corpus's, at 16 kHz."""
    results = sorted((ROOT / "benchmarks" / "speech" / study / "results").glob("*/seed-*.json"))
    assert results, study
    for path in results:
        evaluation = json.loads(path.read_text(encoding="utf-8"))["evaluations"]["train"]
        for split, record in evaluation.items():
            assert record["tokens"] == RECORD["splits"][split]["samples_at_16000_hz"], (path, split)
            assert record["documents"] == RECORD["splits"][split]["file_count"], (path, split)


def test_the_recorded_samples_are_the_files_frames_resampled() -> None:
    """1,322,933 frames at 22,050 Hz are the 959,951 samples at 16 kHz the test records give: one build, two rates."""
    for split in RECORD["splits"].values():
        assert split["frame_rate"] == 22050
        assert split["samples_at_16000_hz"] == pytest.approx(split["frames"] * 16000 / 22050, abs=split["file_count"])


def _espeak_build() -> str | None:
    if shutil.which("espeak-ng") is None or not BOOKS.is_dir():
        return None
    spec = importlib.util.spec_from_file_location("synth_speech", ROOT / "scripts" / "synth_speech.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.espeak_version()["package"]


def test_regenerating_the_corpus_gives_the_recorded_fingerprint(tmp_path: Path) -> None:
    build = _espeak_build()
    if build is None:
        pytest.skip("needs espeak-ng and ../shared/data/pg19-sample")
    if build != RECORD["synthesiser"]["package"]:
        pytest.skip(f"espeak-ng {build} is not the recorded build {RECORD['synthesiser']['package']}")
    books = {str(b.relative_to(BOOKS)): file_hash(b) for b in sorted(BOOKS.glob("*/*.txt"))}
    assert books == RECORD["books_sha256"], "the books are not the recorded ones"
    spec = importlib.util.spec_from_file_location("synth_speech", ROOT / "scripts" / "synth_speech.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "synth-speech"
    assert module.main(["--books", str(BOOKS), "--out", str(out)]) == 0
    fingerprint = data_fingerprint(DataConfig(format="audio", path=str(out)), ("train", "validation", "test"))
    for split, want in RECORD["splits"].items():
        got = fingerprint["splits"][split]
        assert (got["file_count"], got["bytes"], got["sha256"]) == (want["file_count"], want["bytes"], want["sha256"])
    generator = json.loads((out / "generator.json").read_text(encoding="utf-8"))
    assert generator["synthesiser"] == RECORD["synthesiser"] and generator["options"] == RECORD["options"]
    assert {s: v["sha256"] for s, v in generator["splits"].items()} == {
        s: v["sha256"] for s, v in RECORD["splits"].items()
    }
