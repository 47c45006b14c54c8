"""``compressive-transformer import transfo-xl SRC OUT``: a checkpoint of another library as an export directory."""

from __future__ import annotations

import argparse
from pathlib import Path

from compressive_transformer.commands.options import whole
from compressive_transformer.core.config import ConfigError
from compressive_transformer.core.install import program
from compressive_transformer.runs.interop.transfo_xl import import_transfo_xl

SOURCES = ("transfo-xl",)
NAME = "import"
HELP = "convert a checkpoint of another library (transfo-xl) into an export directory"
DESCRIPTION = (
    "Convert a Transformer-XL checkpoint saved by Hugging Face transformers into an export directory that evaluate, "
    "generate, export and train --init-from accept."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source_kind", choices=SOURCES, metavar="KIND", help="what SRC holds: transfo-xl")
    p.add_argument(
        "src", type=Path, metavar="SRC", help="directory saved by transformers (config.json, weights, vocabulary)"
    )
    p.add_argument("out", type=Path, metavar="OUT", help="new export directory to write")
    p.add_argument(
        "--seg-len", type=whole(1), default=128, help="segment length for evaluation (default 128, as the paper)"
    )
    p.add_argument(
        "--vocab",
        type=Path,
        help="vocabulary as text, one word per line in id order (default: SRC/vocab.txt, else SRC/vocab.pkl read "
        "with plain containers and strings only)",
    )
    p.add_argument(
        "--data-path",
        default="data/wikitext-103",
        help="WikiText-103 directory recorded for `evaluate` (default data/wikitext-103)",
    )
    p.add_argument(
        "--empty-memory",
        action="store_true",
        help="start from an empty memory (the original code) instead of transformers' mem_len zero-filled slots",
    )


def main(args: argparse.Namespace) -> None:
    if args.seg_len < 1:
        raise ConfigError(f"--seg-len: must be >= 1, got {args.seg_len}")
    out = import_transfo_xl(
        args.src,
        args.out,
        seg_len=args.seg_len,
        data_path=args.data_path,
        vocab=args.vocab,
        empty_memory=args.empty_memory,
    )
    print(
        f"wrote {out}, an export directory; evaluate it with `{program()} evaluate {out} --text FILE --out "
        f"{out.name}-eval.json` or generate from it with `{program()} generate {out} --prompt TEXT`"
    )
