"""Every run knows what it models (text, audio or continuous observations), every command refuses an input of another
modality in one line before loading weights, and reported units follow the run's modality: bits per sample for
audio, whatever path the audio came in by."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from cli_helpers import assert_one_line_error, cli_run

from compressive_transformer.core.config import ConfigError
from compressive_transformer.core.modality import AUDIO, CONTINUOUS, TEXT, run_modality
from compressive_transformer.inference.text_eval import evaluate_text
from compressive_transformer.inference.textgen import generate_text
from compressive_transformer.runs.loading import load_run, read_modality
from compressive_transformer.runs.metrics import read_metrics

sf = pytest.importorskip("soundfile")
pytest.importorskip("soxr")
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def wavs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from test_audio import write_corpus

    root = tmp_path_factory.mktemp("wavs") / "wavs"
    write_corpus(root, 8000, {"train": [0.3, 0.2], "validation": [0.1], "test": [0.1]})
    return root


@pytest.fixture(scope="module")
def audio_run(wavs: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from compressive_transformer import cli

    run = tmp_path_factory.mktemp("audio") / "run"
    sets = [
        "data.format=audio", f"data.path={wavs}", "data.sample_rate=8000", "model.vocab_size=256",
        "model.d_model=8", "model.d_ff=8", "model.n_layers=1", "model.n_heads=1", "model.mem_len=16",
        "model.cmem_len=0", "model.seg_len=16", "train.steps=2", "train.batch_size=2", "train.val_batches=1",
        "train.amp=none", "train.progress=false", "eval.batch_size=1",
    ]  # fmt: skip
    assert cli.main(["train", "--run-dir", str(run), *[a for s in sets for a in ("--set", s)]]) == 0
    return run


@pytest.fixture
def text_file(tmp_path: Path) -> Path:
    path = tmp_path / "notes.txt"
    path.write_text("some words to score " * 10, encoding="utf-8")
    return path


def test_each_run_knows_its_modality(audio_run: Path, finished_run: Path) -> None:
    assert read_modality(audio_run) == AUDIO and load_run(audio_run).modality == AUDIO
    assert read_modality(finished_run) == TEXT
    cfg = load_run(finished_run).config
    continuous = cfg.__class__.from_raw({"model": {"vocab_size": 0, "input_dim": 4}})
    assert run_modality(continuous) == CONTINUOUS


def test_an_audio_run_refuses_text_in_one_line(
    audio_run: Path, text_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """It used to score the text's bytes as samples and report bits per character."""
    code, _, err = cli_run(capsys, "evaluate", str(audio_run), "--text", str(text_file))
    assert_one_line_error(code, err, "--text FILE", "this run models audio", "--format audio")
    corpus = tmp_path / "corpus"
    for split in ("train", "validation", "test"):
        (corpus / split).mkdir(parents=True)
        (corpus / split / "a.txt").write_text("text " * 20)
    code, _, err = cli_run(capsys, "evaluate", str(audio_run), "--data", str(corpus), "--format", "text")
    assert_one_line_error(code, err, "--format text", "this run models audio")
    run = load_run(audio_run)
    with pytest.raises(ConfigError, match="this run models audio"):
        evaluate_text(run, "some text")
    with pytest.raises(ConfigError, match="this run models audio"):
        generate_text(run, "some text")
    code, _, err = cli_run(capsys, "lm-eval", str(audio_run), "--tasks", "wikitext")
    assert_one_line_error(code, err, "lm-eval", "this run models audio")
    code, _, err = cli_run(capsys, "analyze", str(audio_run), "--only", "frequency")
    assert_one_line_error(code, err, "frequency", "this run models audio")


def test_a_text_run_refuses_audio_in_one_line(
    finished_run: Path, audio_run: Path, wavs: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    code, _, err = cli_run(capsys, "evaluate", str(finished_run), "--data", str(wavs), "--format", "audio")
    assert_one_line_error(code, err, "--format audio", "this run models text, not audio")
    sets = ["--set", "train.progress=false", "--set", f"train.init_from={audio_run}"]
    code, _, err = cli_run(capsys, "train", "--run-dir", str(tmp_path / "new"), *sets)
    assert_one_line_error(code, err, "--init-from", "this run models text, not audio")


def test_audio_scored_as_a_corpus_is_reported_in_bits_per_sample(
    audio_run: Path, wavs: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """``--data DIR --format audio`` reported nats per token and bits per character, with bits_per_sample null."""
    out = tmp_path / "data.json"
    argv = ["evaluate", str(audio_run), "--data", str(wavs), "--format", "audio", "--split", "test", "--out", str(out)]
    code, stdout, err = cli_run(capsys, *argv)
    assert code == 0, err
    assert "bits/sample over 799 samples" in stdout and "bits/char" not in stdout, stdout
    record = json.loads(out.read_text())
    split = tmp_path / "split.json"
    code, _, err = cli_run(capsys, "evaluate", str(audio_run), "--split", "test", "--out", str(split))
    assert code == 0, err
    same = json.loads(split.read_text())
    assert record["bits_per_sample"] == pytest.approx(same["bits_per_sample"])  # the same files, the same number
    assert record["bits_per_char"] is None and record["word_ppl"] is None


def test_an_exported_audio_model_generates_audio(
    audio_run: Path, wavs: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """An export's modality comes from its config.json: it used to be sampled as text."""
    export = tmp_path / "export"
    assert cli_run(capsys, "export", str(audio_run), str(export))[0] == 0
    assert read_modality(export) == AUDIO
    wav = tmp_path / "gen.wav"
    code, _, err = cli_run(capsys, "generate", str(export), "--seconds", "0.01", "--seed", "0", "--out", str(wav))
    assert code == 0, err
    assert sf.info(str(wav)).samplerate == 8000
    code, _, err = cli_run(capsys, "generate", str(export), "--prompt", "hello")
    assert_one_line_error(code, err, "--prompt", "models audio")


def test_an_audio_run_records_its_training_loss_per_sample(audio_run: Path) -> None:
    train = [r for r in read_metrics(audio_run) if "loss" in r]
    assert train and all(r["bits_per_sample"] == r["bits_per_token"] for r in train)
    assert any("val_bits_per_sample" in r for r in read_metrics(audio_run))
