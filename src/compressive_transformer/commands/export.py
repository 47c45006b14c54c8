"""``compressive-transformer export``: write a run as a Hugging Face-style directory."""

from __future__ import annotations

import argparse
from pathlib import Path

from compressive_transformer.runs.export import export_run

NAME = "export"
HELP = "write a run as a Hugging Face-style directory"
DESCRIPTION = (
    "Write OUT_DIR/config.json, model.safetensors and tokenizer.json; load it back with "
    "compressive_transformer.from_pretrained(OUT_DIR). OUT_DIR must be new or empty."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="run directory written by `train`")
    p.add_argument("out_dir", type=Path, metavar="OUT_DIR", help="directory to write (new or empty)")
    p.add_argument("--checkpoint", type=Path, help="checkpoint directory to export (default: the newest)")


def main(args: argparse.Namespace) -> None:
    out = export_run(args.run_dir, args.out_dir, checkpoint=args.checkpoint)
    print(
        f"wrote {out} (config.json, model.safetensors, tokenizer.json); load it with compressive_transformer.from_pretrained"
    )
