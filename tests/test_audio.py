"""The audio corpus format: μ-law codes round-trip, resampling keeps the duration, each file is one stream whose
memory starts empty, and the audio settings reach the token cache. Audio is made here (tones, chirps, noise)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from compressive_transformer.core.config import ConfigError, DataConfig
from compressive_transformer.core.models import build_model
from compressive_transformer.core.streaming import stream
from compressive_transformer.data import load_corpus, read_split
from compressive_transformer.data.mulaw import mulaw_decode, mulaw_encode
from compressive_transformer.data.soundfiles import TruncatedAudioWarning, read_audio
from compressive_transformer.data.streams import StreamBatcher
from compressive_transformer.data.tokenizers import ByteTokenizer
from tests.conftest import tiny_config

sf = pytest.importorskip("soundfile")
pytest.importorskip("soxr")
torch.set_num_threads(1)

CODES = np.arange(256)


def test_every_code_round_trips_exactly() -> None:
    assert (mulaw_encode(mulaw_decode(CODES)) == CODES).all()
    assert mulaw_decode(CODES).min() == -1.0 and mulaw_decode(CODES).max() == 1.0
    assert mulaw_encode(np.array([0.0]))[0] == 128  # silence sits in the middle of the code range


@settings(max_examples=200, deadline=None)
@given(st.floats(-1.0, 1.0, allow_nan=False))
def test_an_amplitude_decodes_to_within_half_a_code(x: float) -> None:
    """Encoding picks the nearest code in the companded domain: decoding lands within half a step of x there."""
    q = mulaw_encode(np.array([x]))
    y = np.sign(x) * np.log1p(255 * abs(x)) / np.log1p(255)
    y_hat = 2.0 * q[0] / 255 - 1.0
    assert abs(y - y_hat) <= 1.0 / 255 + 1e-9
    assert mulaw_encode(np.array([2.0, -3.0])).tolist() == [255, 0]  # out-of-range amplitudes clip


def tone(seconds: float, rate: int, freq: float = 440.0) -> np.ndarray:
    t = np.arange(int(round(seconds * rate))) / rate
    return (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def write_corpus(root: Path, rate: int, lengths: dict[str, list[float]]) -> None:
    rng = np.random.default_rng(0)
    for split, secs in lengths.items():
        (root / split).mkdir(parents=True)
        for i, s in enumerate(secs):
            x = tone(s, rate, 200.0 + 100 * i) + 0.01 * rng.standard_normal(int(round(s * rate))).astype(np.float32)
            sf.write(root / split / f"{i}.wav", x, rate, subtype="FLOAT")


@pytest.mark.parametrize("rate_in", [8000, 16000, 22050, 44100])
def test_files_resample_to_the_sample_rate(tmp_path: Path, rate_in: int) -> None:
    write_corpus(tmp_path, rate_in, {"train": [0.5, 0.25], "validation": [0.1], "test": [0.3]})
    raw = read_split(DataConfig(format="audio", path=str(tmp_path), sample_rate=16000), "train")
    assert [len(d) for d in raw.documents] == [8000, 4000]  # duration kept: round(len * 16000 / rate_in)
    assert all(isinstance(d, bytes) for d in raw.documents)


def test_a_stored_code_stream_reads_back_exactly(tmp_path: Path) -> None:
    """A file holding decoded μ-law amplitudes at the model's rate reads back as the very same codes."""
    codes = np.random.default_rng(1).integers(0, 256, 4000).astype(np.uint8)
    for split in ("train", "validation", "test"):
        (tmp_path / split).mkdir()
        sf.write(tmp_path / split / "a.wav", mulaw_decode(codes), 16000, subtype="FLOAT")
    raw = read_split(DataConfig(format="audio", path=str(tmp_path)), "test")
    assert np.frombuffer(raw.documents[0], dtype=np.uint8).tolist() == codes.tolist()


def test_each_file_is_one_stream_with_memory_reset_between_files(tmp_path: Path) -> None:
    write_corpus(tmp_path, 16000, {"train": [0.02, 0.03, 0.015], "validation": [0.01], "test": [0.01]})
    cfg = DataConfig(format="audio", path=str(tmp_path), sample_rate=16000)
    corpus = load_corpus(cfg, "train", ByteTokenizer(), tmp_path / "cache")
    assert corpus.doc_offsets.tolist() == [0, 320, 800, 1040]
    model = build_model(tiny_config(vocab_size=256, mem_len=0, cmem_len=0, n_layers=3, wavenet_dilations=(1, 2, 4)))

    def logits_of(source, offsets) -> torch.Tensor:
        batches = StreamBatcher(source, offsets, batch_size=1, seg_len=64)
        return torch.cat([s.out.logits[0, s.batch.input_mask[0]] for s in stream(model, batches, batch_size=1)])

    together = logits_of(corpus.tokens, corpus.doc_offsets)  # the three files, one after another in one row
    alone = [logits_of(corpus.document(i), None) for i in range(3)]  # each file from an empty memory
    torch.testing.assert_close(together, torch.cat(alone))


def test_the_sample_rate_is_part_of_the_cache_key(tmp_path: Path) -> None:
    write_corpus(tmp_path, 16000, {"train": [0.05], "validation": [0.01], "test": [0.01]})
    cache = tmp_path / "cache"
    at16 = load_corpus(DataConfig(format="audio", path=str(tmp_path)), "train", ByteTokenizer(), cache)
    at8 = load_corpus(DataConfig(format="audio", path=str(tmp_path), sample_rate=8000), "train", ByteTokenizer(), cache)
    assert (at16.num_tokens, at8.num_tokens) == (800, 400)


def test_bad_inputs_end_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="data.tokenizer: audio is modelled"):
        DataConfig(format="audio", path=str(tmp_path), tokenizer="words")
    with pytest.raises(ConfigError, match="data.sample_rate"):
        DataConfig(format="audio", path=str(tmp_path), sample_rate=0)
    (tmp_path / "notes.txt").write_text("no audio here")
    with pytest.raises(ConfigError, match="has no sound files"):
        read_split(DataConfig(format="audio", path=str(tmp_path)), "train")
    for split in ("train", "validation", "test"):
        (tmp_path / "s" / split).mkdir(parents=True)
        (tmp_path / "s" / split / "x.wav").write_bytes(b"RIFF not really")
    with pytest.raises(ConfigError, match="is not a readable audio file"):
        read_split(DataConfig(format="audio", path=str(tmp_path / "s")), "train")


def test_a_truncated_wav_is_read_with_a_one_line_notice(tmp_path: Path) -> None:
    """A WAV whose copy stopped half-way was read to its end without a word."""
    full, cut = tmp_path / "full.wav", tmp_path / "cut.wav"
    sf.write(full, tone(0.5, 8000), 8000, subtype="PCM_16")
    cut.write_bytes(full.read_bytes()[: 44 + 4000])  # the header and 2000 of the 4000 samples
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(read_audio(full, 8000)) == 4000  # a whole file: no notice
    with pytest.warns(TruncatedAudioWarning) as caught:
        assert len(read_audio(cut, 8000)) == 2000
    (message,) = [str(w.message) for w in caught]
    assert "\n" not in message and "truncated" in message and "8,000 bytes" in message and "4,000" in message


def test_train_evaluate_and_generate_audio_from_the_command_line(tmp_path: Path, capsys) -> None:
    """A WaveNet trained on a folder of WAV files reports bits per sample and writes a WAV continuation (and its
    plot) at the run's sample rate, primed with the start of a file."""
    from tests.cli_helpers import assert_one_line_error, cli_run

    write_corpus(tmp_path / "wavs", 8000, {"train": [0.3, 0.2], "validation": [0.1], "test": [0.1]})
    run = tmp_path / "run"
    sets = [
        "data.format=audio",
        f"data.path={tmp_path / 'wavs'}",
        "data.sample_rate=8000",
        "model.vocab_size=256",
        "model.d_model=8",
        "model.d_ff=8",
        "model.n_layers=3",
        "model.wavenet_dilations=[1, 2, 4]",
        "model.mem_len=0",
        "model.cmem_len=0",
        "model.seg_len=32",
        "train.steps=2",
        "train.batch_size=2",
        "train.val_every=2",
        "train.val_batches=0",
        "train.amp=none",
    ]
    code, _, err = cli_run(capsys, "train", "--run-dir", str(run), *[a for s in sets for a in ("--set", s)])
    assert code == 0, err
    code, out, err = cli_run(capsys, "evaluate", str(run), "--split", "test")
    assert code == 0 and "bits/sample over 799 samples" in out, out + err  # all but the file's first sample
    prime = tmp_path / "wavs" / "test" / "0.wav"
    wav = tmp_path / "out" / "gen.wav"
    code, out, err = cli_run(
        capsys,
        "generate",
        str(run),
        "--seconds",
        "0.05",
        "--prime",
        str(prime),
        "--prime-seconds",
        "0.02",
        "--seed",
        "0",
        "--out",
        str(wav),
    )
    assert code == 0, err
    data, rate = sf.read(wav)
    assert rate == 8000 and len(data) == 160 + 400  # 0.02 s of prompt, then 0.05 s generated
    assert wav.with_suffix(".png").is_file()
    assert "generate: 100%" in err and "400/400" in err, err  # a progress bar while it samples
    assert_one_line_error(*cli_run(capsys, "generate", str(run), "--prompt", "hi")[::2], "--prompt", "--prime")
    assert_one_line_error(*cli_run(capsys, "generate", str(run), "--out", str(wav))[::2], "--out", "exists")
    assert_one_line_error(
        *cli_run(capsys, "generate", str(run), "--prime", str(prime.parent), "--out", str(tmp_path / "x.wav"))[::2],
        "--prime",
        "is a folder",
    )
    stereo = tmp_path / "stereo.wav"
    sf.write(stereo, np.stack([tone(0.05, 8000), tone(0.05, 8000, 330.0)], axis=1), 8000)
    code, _, err = cli_run(
        capsys, "generate", str(run), "--prime", str(stereo), "--seconds", "0.01", "--out", str(tmp_path / "s.wav")
    )
    assert code == 0 and f"note: {stereo} (2 channels) averaged to mono" in err, err


def test_several_channels_are_averaged_to_mono_and_said_so(tmp_path: Path, capsys) -> None:
    write_corpus(tmp_path, 8000, {"train": [0.1, 0.1], "validation": [0.1], "test": [0.1]})
    stereo = np.stack([tone(0.1, 8000), -tone(0.1, 8000)], axis=1)  # the channels cancel: silence in mono
    sf.write(tmp_path / "train" / "2.wav", stereo, 8000, subtype="FLOAT")
    sf.write(tmp_path / "train" / "3.wav", stereo, 8000, subtype="FLOAT")
    split = read_split(DataConfig(format="audio", path=str(tmp_path), sample_rate=8000), "train")
    err = capsys.readouterr().err
    assert f"note: {tmp_path / 'train' / '2.wav'} (2 channels) and 1 more file averaged to mono" in err, err
    assert set(np.frombuffer(split.documents[2], dtype=np.uint8)) == {128}  # μ-law silence
    read_split(DataConfig(format="audio", path=str(tmp_path), sample_rate=8000), "test")
    assert "note:" not in capsys.readouterr().err


def test_a_short_clip_is_plotted_without_a_warning(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from compressive_transformer.audio.generation import AudioGeneration, plot_audio

    for n in (80, 5):  # 0.01 s at 8 kHz, and fewer samples than any spectrogram window
        gen = AudioGeneration(np.full(n // 2, 128, np.uint8), np.full(n - n // 2, 120, np.uint8), 8000)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert plot_audio(gen, tmp_path / f"clip-{n}.png").is_file()


def test_the_evaluation_bar_shows_the_unit_the_summary_uses() -> None:
    from types import SimpleNamespace

    from compressive_transformer.inference.evaluate import _sums

    shown: list[dict] = []
    bar = SimpleNamespace(disable=False, update=lambda n: None, set_postfix=lambda d: shown.append(d))
    step = SimpleNamespace(
        batch=SimpleNamespace(targets=torch.zeros(1, 4, dtype=torch.long)),
        out=SimpleNamespace(logits=torch.zeros(1, 4, 256)),
    )
    _sums([step], torch.device("cpu"), None, bar, "sample")
    assert list(shown[0]) == ["bits_per_sample"]
