"""Sound files in and out: any format libsndfile reads (WAV, FLAC, OGG, ...) as mono float32 at a chosen sample
rate, and WAV files written atomically. Needs the ``[audio]`` extra; without it, one line says what to install."""

from __future__ import annotations

import os
import re
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from compressive_transformer.core.config import ConfigError
from compressive_transformer.core.install import install_hint

AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".oga", ".aiff", ".aif")


def _soundfile() -> Any:
    try:
        import soundfile
    except (ImportError, OSError):  # OSError: the package is there but libsndfile is not
        raise ConfigError(f"audio: reading and writing sound files needs soundfile; {install_hint('audio')}") from None
    return soundfile


def resample(x: np.ndarray, rate_in: int, rate_out: int) -> np.ndarray:
    """Mono float32 samples at ``rate_in`` -> ``rate_out`` (soxr, high quality); ``len * rate_out / rate_in``
    samples, rounded to the nearest."""
    if rate_in == rate_out:
        return np.asarray(x, dtype=np.float32)
    try:
        import soxr
    except ImportError:
        raise ConfigError(f"audio: resampling needs soxr; {install_hint('audio')}") from None
    return soxr.resample(np.asarray(x, dtype=np.float32), rate_in, rate_out, quality="HQ").astype(np.float32)


def read_audio(path: str | Path, sample_rate: int, *, seconds: float | None = None) -> np.ndarray:
    """The file as mono float32 in [-1, 1] at ``sample_rate`` (channels averaged); ``seconds``: only its start."""
    return read_audio_channels(path, sample_rate, seconds=seconds)[0]


def read_audio_channels(path: str | Path, sample_rate: int, *, seconds: float | None = None) -> tuple[np.ndarray, int]:
    """:func:`read_audio`, and the number of channels the file had (more than one were averaged into mono)."""
    sf = _soundfile()
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path}: is a folder; give one audio file in it (WAV, FLAC, OGG)")
    if not path.is_file():
        raise ConfigError(f"{path}: does not exist; give an audio file (WAV, FLAC, OGG)")
    try:
        info = sf.info(str(path))
        frames = -1 if seconds is None else max(1, int(round(seconds * info.samplerate)))
        data, rate = sf.read(str(path), frames=frames, dtype="float32", always_2d=True)
    except (RuntimeError, sf.LibsndfileError) as e:  # libsndfile's error for an unreadable or foreign file
        raise ConfigError(f"{path}: is not a readable audio file ({e}); give a WAV, FLAC or OGG file") from None
    short = _truncated(str(getattr(info, "extra_info", "")))
    if short is not None:
        warnings.warn(
            f"{path}: truncated: its header announces {short[0]:,} bytes of samples, the file holds {short[1]:,}; "
            f"reading the {info.duration:.2f} s it has (copy it again for the whole recording)",
            TruncatedAudioWarning,
            stacklevel=2,
        )
    return resample(data.mean(axis=1), int(rate), sample_rate), int(data.shape[1])  # (frames,) mono


def downmix_note(paths: list[Path], channels: list[int]) -> str | None:
    """One line saying which files had several channels and were averaged into mono, or None when none had."""
    many = [(p, c) for p, c in zip(paths, channels) if c > 1]
    if not many:
        return None
    (first, count), more = many[0], len(many) - 1
    others = f" and {more} more file{'s' * (more > 1)}" if more else ""
    return f"note: {first} ({count} channels){others} averaged to mono; the model reads one channel"


class TruncatedAudioWarning(UserWarning):
    """A sound file ends before the end its header announces (an interrupted copy or download)."""


_SHOULD_BE = re.compile(r"^data\s*:\s*(\d+)\s*\(should be (\d+)\)", re.MULTILINE)


def _truncated(log: str) -> tuple[int, int] | None:
    """(announced, present) bytes of the sample data where libsndfile's log of the header says the file is short."""
    m = _SHOULD_BE.search(log)
    if m is None or int(m.group(2)) >= int(m.group(1)):
        return None
    return int(m.group(1)), int(m.group(2))


def write_wav(path: str | Path, samples: np.ndarray, sample_rate: int) -> Path:
    """16-bit PCM WAV of mono float samples in [-1, 1], written to a temp file and renamed into place."""
    sf = _soundfile()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp.wav")
    os.close(fd)
    try:
        sf.write(tmp, np.clip(np.asarray(samples, dtype=np.float32), -1.0, 1.0), sample_rate, subtype="PCM_16")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # an ordinary file's mode, not the temp file's 0600
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path


__all__ = [
    "AUDIO_SUFFIXES",
    "TruncatedAudioWarning",
    "downmix_note",
    "read_audio",
    "read_audio_channels",
    "resample",
    "write_wav",
]
