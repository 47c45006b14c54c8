"""``compressive-transformer analyze``: the paper's analyses of one run, written into ``RUN_DIR/analysis`` by
default; the same report as ``report``, for one run."""

from __future__ import annotations

import argparse

from compressive_transformer.commands import report

NAME = "analyze"
HELP = "the paper's analyses of one run"
DESCRIPTION = report.DESCRIPTION


def add_arguments(p: argparse.ArgumentParser) -> None:
    report.add_arguments(p, many=False)


main = report.main
