"""The audio side of ``generate``: its options, and the hook that takes over when RUN_DIR was trained on audio."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from compressive_transformer.audio.generation import generate_audio, save_generation
from compressive_transformer.commands.options import MAX_TOKENS, real
from compressive_transformer.core.config import ConfigError
from compressive_transformer.core.fileio import check_new
from compressive_transformer.core.modality import AUDIO
from compressive_transformer.inference.generate import SamplingConfig
from compressive_transformer.runs.loading import CONFIG_JSON, Run, load_run, read_modality
from compressive_transformer.runs.rundir import CONFIG_FILE

SECONDS, PRIME_SECONDS = 2.0, 1.0  # the audio options' defaults


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The audio options of ``generate`` (used when the run was trained on audio)."""
    g = parser.add_argument_group("audio runs (data.format = 'audio')")
    g.add_argument(
        "--out", type=Path, help="WAV file to write (default: RUN_DIR/generated.wav); a PNG plot lands beside it"
    )
    g.add_argument(
        "--seconds",
        type=real(0, low_open=True),
        default=SECONDS,
        help=f"seconds of audio to generate (default {SECONDS:g})",
    )
    g.add_argument("--prime", type=Path, metavar="FILE", help="continue the start of this sound file")
    g.add_argument(
        "--prime-seconds",
        type=real(0, low_open=True),
        default=PRIME_SECONDS,
        help=f"seconds of --prime to read (default {PRIME_SECONDS:g})",
    )


def is_audio_run_dir(run_dir: str | Path) -> bool:
    """Whether ``run_dir`` (a run or an export directory) models audio, read from its config before any weights."""
    path = Path(run_dir)
    if not (path / CONFIG_FILE).is_file() and not (path / CONFIG_JSON).is_file():
        return False  # no run at all: the text generator says what is wrong
    return read_modality(path) == AUDIO


def generate_command(args: Any) -> bool:
    """Handle ``generate`` when RUN_DIR is an audio run (True), else leave it to the text generator (False)."""
    if not is_audio_run_dir(args.run_dir):
        if args.out is not None or args.prime is not None:
            raise ConfigError("--out/--prime: this run models text, not audio; drop them")
        if args.seconds != SECONDS or args.prime_seconds != PRIME_SECONDS:
            raise ConfigError(
                "--seconds/--prime-seconds: this run models text, not audio; --max-tokens sets the length"
            )
        return False
    text_only = {
        "--stop": bool(args.stop),
        "--mem-len": args.mem_len is not None,
        "--cmem-len": args.cmem_len is not None,
        "--compile": args.compile,
        "--max-tokens": args.max_tokens != MAX_TOKENS,
    }
    given = [flag for flag, on in text_only.items() if on]
    if given:
        raise ConfigError(f"{given[0]}: applies to text runs; this run models audio, and --seconds sets the length")
    sampling = SamplingConfig(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)  # before the load
    _generate(args, sampling, load_run(args.run_dir, device=args.device, threads=args.threads))
    return True


def _generate(args: argparse.Namespace, sampling: SamplingConfig, run: Run) -> None:
    """``generate`` on an audio run: write the WAV and its plot, print where they are."""
    if args.prompt is not None or args.prompts_file is not None or args.load_memory or args.save_memory:
        raise ConfigError(
            "--prompt: this run models audio; prime it with --prime FILE (memory files are for text runs)"
        )
    out = args.out or (Path(args.run_dir) / "generated.wav")
    if out.suffix.lower() != ".wav":
        raise ConfigError(f"--out: {out} is not a .wav file; name the WAV file to write")
    check_new(out, "--out")  # before the generation, not after it; the plot beside it too
    check_new(out.with_suffix(".png"), "--out")
    gen = generate_audio(
        run,
        seconds=args.seconds,
        prime=args.prime,
        prime_seconds=args.prime_seconds,
        sampling=sampling,
        seed=args.seed,
        progress=True,
    )
    out, png = save_generation(gen, out)
    print(f"wrote {out} ({len(gen.prompt) / gen.sample_rate:.2f} s prompt + {args.seconds:.2f} s generated) and {png}")


__all__ = ["add_arguments", "generate_command", "is_audio_run_dir"]
