"""Options several commands share, declared once so that they read the same everywhere."""

from __future__ import annotations

import argparse
from pathlib import Path

SPLITS = ("train", "validation", "test")
MAX_TOKENS = 200  # generate's default length of a text continuation


def override(text: str) -> str:
    """One ``--set`` value: ``SECTION.KEY=VALUE`` in one word (``--set data.path my-texts`` would leave the value to
    be read as a stray argument)."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not SECTION.KEY=VALUE; write --set {text}=VALUE as one word (no spaces around '=')"
        )
    return text


def add_overrides(p: argparse.ArgumentParser, help_text: str) -> None:
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        type=override,
        metavar="SECTION.KEY=VALUE",
        help=help_text,
    )


def add_run_or_export(p: argparse.ArgumentParser) -> None:
    """The positional RUN_DIR of a command that also reads a directory written by ``export``."""
    p.add_argument(
        "run_dir",
        type=Path,
        metavar="RUN_DIR",
        help="run directory written by `train` (or a directory written by `export`)",
    )


def add_device(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--device",
        default="auto",
        help="where the model runs: auto (CUDA if present, else CPU), cpu, cuda (default auto; wherever the run was trained)",
    )
    p.add_argument("--threads", type=int, help="CPU threads (default: the run's train.num_threads)")


__all__ = ["MAX_TOKENS", "SPLITS", "add_device", "add_overrides", "add_run_or_export", "override"]
