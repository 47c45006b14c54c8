"""A short generated sample of each variant of a finished speech study: its seed-0 run continues the first
``--prime-seconds`` of a test file for ``--seconds``, written as a WAV (16-bit, the run's sample rate) and a PNG of
waveform and spectrogram, beside the study's results.

    python -m benchmarks.speech.samples benchmarks/speech/pilot --prime data/synth-speech-pilot/test/0000.wav
"""

from __future__ import annotations

import argparse
from pathlib import Path

from compressive_transformer.audio.generation import generate_audio, save_generation
from compressive_transformer.inference.generate import SamplingConfig
from compressive_transformer.runs.loading import load_run


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("study_out", type=Path, help="the study's --out folder (holding runs/VARIANT/seed-0)")
    p.add_argument("--prime", type=Path, required=True, help="sound file whose start every variant continues")
    p.add_argument("--prime-seconds", type=float, default=0.5)
    p.add_argument("--seconds", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=1.0)
    args = p.parse_args(argv)
    out = args.study_out / "samples"
    for run_dir in sorted((args.study_out / "runs").glob("*/seed-0")):
        variant = run_dir.parent.name
        run = load_run(run_dir, device="cpu", threads=1)
        gen = generate_audio(
            run,
            seconds=args.seconds,
            prime=args.prime,
            prime_seconds=args.prime_seconds,
            sampling=SamplingConfig(temperature=args.temperature),
            seed=args.seed,
        )
        title = f"{variant} (seed 0): {args.prime_seconds:g} s of a test file, then {args.seconds:g} s sampled (T = {args.temperature:g})"
        wav, png = save_generation(gen, out / f"{variant}.wav", title=title, replace=True)
        print(f"wrote {wav} and {png}")


if __name__ == "__main__":
    main()
