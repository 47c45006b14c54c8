"""Options several commands share, declared once so that they read the same everywhere."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Callable, NoReturn

from compressive_transformer.core.config import ConfigError

SPLITS = ("train", "validation", "test")
MAX_TOKENS = 200  # generate's default length of a text continuation


SEEDS = 2**32  # numpy's seeds: environments, data order (a training seed's range)
NUMBER_MARK = "[number] "  # starts the message of a number outside its range: the parser says it in one line


class NumberError(argparse.ArgumentTypeError):
    """A command-line number that is not one, or outside its range (said in one line by :class:`Parser`)."""

    def __init__(self, message: str) -> None:
        super().__init__(NUMBER_MARK + message)


class Parser(argparse.ArgumentParser):
    """The command line's parser: a number outside its range is a one-line :class:`ConfigError` naming the
    option and the range (as every other mistake a user can make), not a usage screen; other mistakes are argparse's
    own, with the command's usage."""

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        if NUMBER_MARK in message:
            raise ConfigError(message.removeprefix("argument ").replace(NUMBER_MARK, ""))
        super().error(message)


def _span(lo: float, hi: float | None, low_open: bool = False) -> str:
    """The range as the message says it: " from 1 up", " from 0 to 4294967295", " in (0, 1]"."""
    a, b = (str(v) if isinstance(v, int) else f"{v:g}" for v in (lo, hi if hi is not None else 0))
    if hi is None:
        return f" above {a}" if low_open else f" from {a} up"
    return f" in ({a}, {b}]" if low_open else f" from {a} to {b}"


def whole(lo: int, hi: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number from ``lo`` to ``hi`` (inclusive; no upper bound when None), the range
    said when the value is outside it (before any work, not a traceback from deep inside)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise NumberError(f"{text!r} is not a whole number; give one{_span(lo, hi)}") from None
        if value < lo or (hi is not None and value > hi):
            raise NumberError(f"{value} is out of range; give a whole number{_span(lo, hi)}")
        return value

    parse.__name__ = "whole number"
    return parse


def real(lo: float, hi: float | None = None, *, low_open: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number from ``lo`` (or above it, ``low_open``) to ``hi``, the range said when the
    value is outside it."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise NumberError(f"{text!r} is not a number; give one{_span(lo, hi, low_open)}") from None
        below = value <= lo if low_open else value < lo
        if not math.isfinite(value) or below or (hi is not None and value > hi):
            raise NumberError(f"{value:g} is out of range; give a number{_span(lo, hi, low_open)}")
        return value

    parse.__name__ = "number"
    return parse


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
    p.add_argument("--threads", type=whole(1), help="CPU threads (default: the run's train.num_threads)")


__all__ = [
    "MAX_TOKENS",
    "NumberError",
    "Parser",
    "SEEDS",
    "SPLITS",
    "add_device",
    "add_overrides",
    "add_run_or_export",
    "override",
    "real",
    "whole",
]
