"""``compressive-transformer study``: variants x seeds on one budget, measured on whole books, with intervals."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from compressive_transformer.commands.options import add_overrides, whole
from compressive_transformer.experiments.study_run import run_study

NAME = "study"
HELP = "train variants x seeds with one budget, measure them on whole books, report intervals"
DESCRIPTION = (
    "Train every [variants.NAME] of a study spec (see benchmarks/lm_study/study.toml) once per seed "
    "of [study] seeds with the same budget, measure each run on whole documents (bits per character, word "
    "perplexity, loss by how far back a word last occurred and by word frequency, attention by memory region) "
    "at its training memory and at every evaluations.NAME memory, and write OUT/results.md, OUT/results.json and "
    "plots with intervals over seeds and paired differences to the baseline. Resumable: rerun the same command "
    "after any interruption; finished runs are reused."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "spec", type=Path, metavar="SPEC", help="study spec TOML with [study], [base] and [variants.NAME] tables"
    )
    p.add_argument("--out", type=Path, help="output directory; default: the spec's directory")
    add_overrides(p, "override a key of every variant, e.g. --set train.steps=100 (repeatable)")
    p.add_argument("--parallel", type=whole(1), help="runs trained at once (default: study.parallel)")
    p.add_argument(
        "--threads",
        type=whole(1),
        help="CPU threads in all, split between parallel runs (default: study.threads, else every core)",
    )


def main(args: argparse.Namespace) -> None:
    out = args.out or args.spec.parent
    command = "compressive-transformer " + " ".join(sys.argv[1:]) if sys.argv[1:2] == ["study"] else ""
    summary = run_study(
        args.spec, out, overrides=args.overrides, parallel=args.parallel, threads=args.threads, command=command
    )
    print(
        f"{summary['runs_done']} of {summary['runs_total']} runs measured; wrote {out / 'results.md'} and {out / 'results.json'}"
    )
