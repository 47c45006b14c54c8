"""Options several commands share, declared once so that they read the same everywhere."""

from __future__ import annotations

import argparse

SPLITS = ("train", "validation", "test")


def add_overrides(p: argparse.ArgumentParser, help_text: str) -> None:
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE", help=help_text)


def add_device(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--device",
        default="auto",
        help="where the model runs: auto (CUDA if present, else CPU), cpu, cuda (default auto; wherever the run was trained)",
    )
    p.add_argument("--threads", type=int, help="CPU threads (default: the run's train.num_threads)")


__all__ = ["SPLITS", "add_device", "add_overrides"]
