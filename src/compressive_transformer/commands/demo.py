"""``compressive-transformer demo``: train, evaluate and sample a small model on Python's help topics."""

from __future__ import annotations

import argparse
from pathlib import Path

from compressive_transformer.commands.options import whole
from compressive_transformer.core.install import program
from compressive_transformer.training.demo import demo

NAME = "demo"
HELP = "train, evaluate and sample a small model on the pydoc topics in about a minute on two CPU cores"
DESCRIPTION = (
    "Train a small Compressive Transformer on Python's own help topics (bytes), evaluate it and sample from it."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=whole(1), help="training steps (default: the demo config's 400)")
    p.add_argument("--run-dir", type=Path, help="run directory; default: a fresh runs/demo-<time>")


def main(args: argparse.Namespace) -> None:
    result = demo(steps=args.steps, run_dir=args.run_dir)
    print()
    print(result.validation.summary())
    print(result.references.line(result.validation.bits_per_char))
    print("sample:")
    print(result.sample)
    print()
    print(f"finished in {result.seconds:.0f} s; run directory: {result.run_dir}")
    print(f"next: {program()} generate {result.run_dir} --prompt 'def ' --temperature 0.8")
