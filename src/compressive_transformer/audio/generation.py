"""Audio out: a trained audio run continues a waveform sample by sample, written as a WAV file (μ-law decoded at
the run's sample rate) with a waveform and spectrogram plot of prompt and continuation.

The prompt is the first seconds of a given sound file (read like the training data: mono, resampled, μ-law), or
a single silent sample when none is given. Sampling is the library's :func:`~compressive_transformer.generate.generate`
with memory carried throughout, so each new sample costs the same, whatever the model kind.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from compressive_transformer.core.config import ConfigError
from compressive_transformer.core.fileio import create_file, replace_file
from compressive_transformer.data.mulaw import mulaw_decode, mulaw_encode
from compressive_transformer.data.soundfiles import downmix_note, read_audio_channels, write_wav
from compressive_transformer.inference.generate import SamplingConfig, check_sampling, generate
from compressive_transformer.runs.loading import Run
from compressive_transformer.runs.precision import generation_amp

SILENCE = int(mulaw_encode(np.zeros(1))[0])  # the code of amplitude 0


@dataclass
class AudioGeneration:
    prompt: np.ndarray  # (P,) uint8 μ-law codes of the prompt
    continuation: np.ndarray  # (N,) uint8 codes drawn by the model
    sample_rate: int

    @property
    def waveform(self) -> np.ndarray:
        """Prompt and continuation as float32 amplitudes."""
        return mulaw_decode(np.concatenate([self.prompt, self.continuation]))


def generate_audio(
    run: Run,
    *,
    seconds: float,
    prime: str | Path | None = None,
    prime_seconds: float = 1.0,
    sampling: SamplingConfig | None = None,
    seed: int | None = None,
    progress: bool = False,
) -> AudioGeneration:
    """``seconds`` of audio continuing the first ``prime_seconds`` of ``prime`` (or one silent sample), each sample
    drawn as ``sampling`` says (default temperature 1); ``progress`` shows a bar of the samples drawn (a few seconds
    of audio take minutes on a CPU)."""
    if seconds <= 0:
        raise ConfigError(f"--seconds: must be > 0, got {seconds}")
    if prime is not None and prime_seconds <= 0:
        raise ConfigError(f"--prime-seconds: must be > 0, got {prime_seconds}")
    rate = run.config.data.sample_rate
    n = int(round(seconds * rate))
    check_sampling(max_tokens=n)
    prompt = np.array([SILENCE], dtype=np.uint8) if prime is None else _prime(Path(prime), rate, prime_seconds)
    with tqdm(total=n, desc="generate", unit="sample", disable=not progress, file=sys.stderr) as bar:

        def tick(_: int) -> bool:
            bar.update(1)
            return True  # go on

        out = generate(
            run.model,
            prompt.astype(np.int64).tolist(),
            max_new_tokens=n,
            sampling=sampling,
            seed=seed,
            amp=generation_amp(run.config, next(run.model.parameters()).device),
            on_token=tick,
        )
    return AudioGeneration(prompt, np.asarray(out.tokens, dtype=np.uint8), rate)


def _prime(path: Path, rate: int, seconds: float) -> np.ndarray:
    """The μ-law codes of the first ``seconds`` of the sound file ``path`` (mono; a note when it had more channels)."""
    try:
        samples, channels = read_audio_channels(path, rate, seconds=seconds)
    except ConfigError as e:
        raise ConfigError(f"--prime: {e}") from None
    note = downmix_note([path], [channels])
    if note is not None:
        print(note, file=sys.stderr)
    return mulaw_encode(samples)


def plot_audio(gen: AudioGeneration, path: str | Path, title: str = "") -> Path:
    """Waveform above spectrogram, prompt and continuation divided by a vertical line; PNG."""
    from matplotlib.figure import Figure  # a figure of its own: pyplot's backend and figures stay as they were

    x, rate = gen.waveform, gen.sample_rate
    t = np.arange(len(x)) / rate
    split = len(gen.prompt) / rate
    fig = Figure(figsize=(8, 4.5), constrained_layout=True)
    top, bottom = fig.subplots(2, 1, sharex=True)
    top.plot(t, x, lw=0.4, color="black")
    top.set_ylim(-1, 1)
    top.set_ylabel("amplitude")
    nfft = 512  # window of the spectrogram, halved for a clip shorter than it (matplotlib warns otherwise)
    while nfft > len(x) and nfft > 16:
        nfft //= 2
    if len(x) >= nfft:
        bottom.specgram(x, NFFT=nfft, Fs=rate, noverlap=nfft * 3 // 4, cmap="magma")
    else:
        bottom.text(0.5, 0.5, "too short for a spectrogram", ha="center", va="center", transform=bottom.transAxes)
    bottom.set_ylabel("Hz")
    bottom.set_xlabel("seconds")
    for ax in (top, bottom):
        ax.axvline(split, color="tab:cyan", lw=1)
    top.set_title(title or f"prompt (left of the line) and generated continuation, {rate} Hz mu-law")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=72, format="png")
    return path


def save_generation(
    gen: AudioGeneration, wav: str | Path, title: str = "", *, replace: bool = False
) -> tuple[Path, Path]:
    """The WAV of prompt and continuation at ``wav`` and its plot beside it (same name, ``.png``); returns both.
    They are new files (a name taken meanwhile gets the next free one, nothing is replaced), or with ``replace``
    (samples regenerated in place) replace what was there atomically."""
    write = lambda tmp: write_wav(tmp, gen.waveform, gen.sample_rate)  # noqa: E731
    plot = lambda tmp: plot_audio(gen, tmp, title=title)  # noqa: E731
    if replace:
        wav = replace_file(Path(wav), write)
        return wav, replace_file(wav.with_suffix(".png"), plot)
    wav = create_file(Path(wav), write, what="--out")
    return wav, create_file(wav.with_suffix(".png"), plot, what="--out")


__all__ = [
    "AudioGeneration",
    "generate_audio",
    "plot_audio",
    "save_generation",
]
