"""``compressive-transformer data``: data utilities (``download``: a benchmark corpus, checksums verified)."""

from __future__ import annotations

import argparse
from pathlib import Path

from compressive_transformer import data as corpora

NAME = "data"
HELP = "data utilities"
DESCRIPTION = "Data utilities."


def add_arguments(p: argparse.ArgumentParser) -> None:
    actions = p.add_subparsers(dest="data_command", required=True, metavar="ACTION", help="what to do with the data")
    d = actions.add_parser(
        "download",
        help="download a benchmark corpus and verify its checksum",
        description="Download a benchmark corpus into DIR.",
    )
    d.add_argument("name", choices=sorted(corpora.sources()), help="corpus to download")
    d.add_argument(
        "dir",
        type=Path,
        metavar="DIR",
        nargs="?",
        default=Path("data"),
        help="directory to download into (default data, where the configs look)",
    )
    d.add_argument("--limit", type=int, help="pg19: only the first N books of each split")
    d.add_argument("--base-url", help="a mirror to download from instead of the corpus's own site")
    d.add_argument(
        "--manifest", type=Path, help="pg19: pinned manifest.json (from a previous download) every file must match"
    )


def main(args: argparse.Namespace) -> None:
    path = corpora.download(args.name, args.dir, base_url=args.base_url, limit=args.limit, manifest=args.manifest)
    print(f"{args.name}: {path}")
