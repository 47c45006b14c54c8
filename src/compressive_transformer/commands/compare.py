"""``compressive-transformer compare``: train several variants with one budget and tabulate them."""

from __future__ import annotations

import argparse
from pathlib import Path

from compressive_transformer.commands.options import SPLITS, add_overrides
from compressive_transformer.experiments.compare import compare, results_table
from compressive_transformer.runs.rundir import fresh_run_dir

NAME = "compare"
HELP = "train several variants with one budget and tabulate them"
DESCRIPTION = (
    "Train every [variants.NAME] of a comparison spec (see configs/compare/) with the same budget, "
    "evaluate each, and write OUT/results.md and OUT/results.json (model, n_s/n_m/n_cm, window, average context "
    "length, bpc, perplexity, training tokens/s). Finished runs in OUT are reused, never overwritten."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "spec", type=Path, metavar="SPEC", help="comparison spec TOML with [base] and [variants.NAME] tables"
    )
    p.add_argument("--out", type=Path, help="output directory; default: a fresh runs/compare-<time>")
    add_overrides(p, "override a key of every variant, e.g. --set train.steps=100 (repeatable)")
    p.add_argument("--split", choices=SPLITS, help="split to evaluate (default: eval.split)")


def main(args: argparse.Namespace) -> None:
    out = args.out or fresh_run_dir("compare")
    rows = compare(args.spec, out, overrides=args.overrides, split=args.split)
    print(results_table(rows))
    print(f"wrote {out / 'results.md'} and {out / 'results.json'}")
