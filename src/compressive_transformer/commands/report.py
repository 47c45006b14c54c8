"""``compressive-transformer report``: a self-contained report comparing runs (``analyze`` is the same for one run,
written into it)."""

from __future__ import annotations

import argparse
from pathlib import Path

from compressive_transformer.analysis.report import ANALYSES, write_report
from compressive_transformer.commands.options import SPLITS, add_device, whole

NAME = "report"
HELP = "a self-contained report comparing runs"
DESCRIPTION = (
    "Attention by memory region, compressibility per layer, temporal range (theoretical and "
    "measured), perplexity by word frequency and training curves, as markdown + HTML + PNG + JSON."
)


def add_arguments(p: argparse.ArgumentParser, *, many: bool = True) -> None:
    p.add_argument(
        "run_dirs",
        type=Path,
        nargs="+" if many else 1,
        metavar="RUN_DIR",
        help="run directories written by `train`",
    )
    p.add_argument(
        "--out", type=Path, required=many, help="output directory" + ("" if many else " (default RUN_DIR/analysis)")
    )
    p.add_argument(
        "--split", choices=SPLITS, default="validation", help="held-out split to analyse (default validation)"
    )
    p.add_argument("--only", help="comma-separated subset of regions, compressibility, temporal, frequency")
    p.add_argument("--max-segments", type=whole(1), default=40, help="segments streamed per analysis (default 40)")
    p.add_argument("--batch-size", type=whole(1), default=4, help="parallel streams (default 4)")
    add_device(p)


def main(args: argparse.Namespace) -> None:
    out = args.out or args.run_dirs[0] / "analysis"
    analyses = tuple(args.only.split(",")) if args.only else ANALYSES
    write_report(  # it says where it wrote the report
        args.run_dirs,
        out,
        split=args.split,
        analyses=analyses,
        max_segments=args.max_segments,
        batch_size=args.batch_size,
        device=args.device,
        threads=args.threads,
    )
