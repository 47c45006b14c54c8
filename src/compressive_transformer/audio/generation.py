"""Audio out: a trained audio run continues a waveform sample by sample, written as a WAV file (μ-law decoded at
the run's sample rate) with a waveform and spectrogram plot of prompt and continuation.

The prompt is the first seconds of a given sound file (read like the training data: mono, resampled, μ-law), or
a single silent sample when none is given. Sampling is the library's :func:`~compressive_transformer.generate.generate`
with memory carried throughout, so each new sample costs the same, whatever the model kind.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from compressive_transformer.core.config import ConfigError
from compressive_transformer.core.fileio import require_writable
from compressive_transformer.data.mulaw import mulaw_decode, mulaw_encode
from compressive_transformer.data.soundfiles import downmix_note, read_audio_channels, write_wav
from compressive_transformer.runs.loading import Run
from compressive_transformer.runs.precision import generation_amp
from compressive_transformer.training.generate import check_sampling, generate

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
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    progress: bool = False,
) -> AudioGeneration:
    """``seconds`` of audio continuing the first ``prime_seconds`` of ``prime`` (or one silent sample); ``progress``
    shows a bar of the samples drawn (a few seconds of audio take minutes on a CPU)."""
    if seconds <= 0:
        raise ConfigError(f"--seconds: must be > 0, got {seconds}")
    if prime is not None and prime_seconds <= 0:
        raise ConfigError(f"--prime-seconds: must be > 0, got {prime_seconds}")
    rate = run.config.data.sample_rate
    n = int(round(seconds * rate))
    check_sampling(max_tokens=n, temperature=temperature, top_k=top_k, top_p=top_p)
    prompt = np.array([SILENCE], dtype=np.uint8) if prime is None else _prime(Path(prime), rate, prime_seconds)
    with tqdm(total=n, desc="generate", unit="sample", disable=not progress, file=sys.stderr) as bar:

        def tick(_: int) -> bool:
            bar.update(1)
            return True  # go on

        out = generate(
            run.model,
            prompt.astype(np.int64).tolist(),
            max_new_tokens=n,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x, rate = gen.waveform, gen.sample_rate
    t = np.arange(len(x)) / rate
    split = len(gen.prompt) / rate
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 4.5), sharex=True, constrained_layout=True)
    top.plot(t, x, lw=0.4, color="black")
    top.set_ylim(-1, 1)
    top.set_ylabel("amplitude")
    bottom.specgram(x, NFFT=512, Fs=rate, noverlap=384, cmap="magma")
    bottom.set_ylabel("Hz")
    bottom.set_xlabel("seconds")
    for ax in (top, bottom):
        ax.axvline(split, color="tab:cyan", lw=1)
    top.set_title(title or f"prompt (left of the line) and generated continuation, {rate} Hz mu-law")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=72)
    plt.close(fig)
    return path


def save_generation(gen: AudioGeneration, wav: str | Path, title: str = "") -> Path:
    """The WAV of prompt and continuation at ``wav``, and its plot beside it (same name, ``.png``), which is returned."""
    wav = write_wav(wav, gen.waveform, gen.sample_rate)
    return plot_audio(gen, wav.with_suffix(".png"), title=title)


def main(args: argparse.Namespace, run: Run) -> None:
    """``generate`` on an audio run: write the WAV and its plot, print where they are."""
    if args.prompt is not None or args.prompts_file is not None or args.load_memory or args.save_memory:
        raise ConfigError(
            "--prompt: this run models audio; prime it with --prime FILE (memory files are for text runs)"
        )
    out = args.out or (Path(args.run_dir) / "generated.wav")
    if out.suffix.lower() != ".wav":
        raise ConfigError(f"--out: {out} is not a .wav file; name the WAV file to write")
    if out.exists():
        raise ConfigError(f"--out: {out} exists; choose a new file")
    require_writable(out)  # before the generation, not after it
    gen = generate_audio(
        run,
        seconds=args.seconds,
        prime=args.prime,
        prime_seconds=args.prime_seconds,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        progress=True,
    )
    png = save_generation(gen, out)
    print(f"wrote {out} ({len(gen.prompt) / gen.sample_rate:.2f} s prompt + {args.seconds:.2f} s generated) and {png}")


__all__ = [
    "AudioGeneration",
    "generate_audio",
    "plot_audio",
    "save_generation",
]
