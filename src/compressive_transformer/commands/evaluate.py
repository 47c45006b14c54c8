"""``compressive-transformer evaluate``: score a split, a user's text files or another corpus with a trained run."""

from __future__ import annotations

import argparse
from pathlib import Path

from compressive_transformer.commands.options import SPLITS, add_device, add_overrides
from compressive_transformer.core.config import ConfigError
from compressive_transformer.core.modality import AUDIO, TEXT, format_modality, require_modality
from compressive_transformer.data.formats import path_formats
from compressive_transformer.inference.text_eval import (
    check_text_overrides,
    corpus_source,
    evaluate_source,
    files_source,
)
from compressive_transformer.inference.workflows import evaluate_run_to
from compressive_transformer.runs.loading import load_run, read_modality

NAME = "evaluate"
HELP = "score a split, your own text files or another corpus with a trained run"
DESCRIPTION = (
    "Streaming evaluation with memory carried through each document: loss in nats per token, bits per "
    "token, bits per character and byte of the text, word perplexity (word and subword tokenizers). A split "
    "writes RUN_DIR/eval_<split>.json; --text and --data write RUN_DIR/eval_text-<name>.json / "
    "eval_data-<format>-<dir>-<split>.json; each under a name no earlier result holds (-2, -3, ... when taken)."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="run directory written by `train`")
    p.add_argument("--split", choices=SPLITS, help="split to evaluate (default: eval.split of the run)")
    p.add_argument(
        "--text",
        type=Path,
        nargs="+",
        metavar="FILE",
        help="score these files (each one whole, memory carried through it) with the run's tokenizer",
    )
    p.add_argument(
        "--allow-binary", action="store_true", help="score --text files that are not text (a byte-level run only)"
    )
    p.add_argument("--data", type=Path, metavar="DIR", help="score a split of another corpus (with --format)")
    p.add_argument("--format", choices=path_formats(), help="the corpus format of --data")
    add_overrides(p, "override an eval key, e.g. --set eval.mem_len=1024 (repeatable)")
    p.add_argument(
        "--checkpoint", type=Path, help="checkpoint directory to evaluate (default: the newest that verifies)"
    )
    p.add_argument(
        "--out",
        type=Path,
        help="a new file to write the result JSON to (default: in RUN_DIR, under a name no earlier result holds)",
    )
    add_device(p)


def main(args: argparse.Namespace) -> None:
    if args.allow_binary and args.text is None:
        raise ConfigError("--allow-binary: applies to --text FILE only; drop it")
    if args.text is None and args.data is None:
        _evaluate_split(args)
        return
    if args.text is not None and args.data is not None:
        raise ConfigError("--text and --data: give one of them")
    if args.data is not None and args.format is None:
        raise ConfigError(f"--data: needs --format ({', '.join(path_formats())})")
    if args.text is not None and args.format is not None:
        raise ConfigError("--format: applies to --data DIR only; drop it with --text")
    check_text_overrides(args.overrides, split=args.split, what="--text" if args.text is not None else "--data")
    check_input_modality(args)
    run = load_run(
        args.run_dir, device=args.device, checkpoint=args.checkpoint, threads=args.threads, overrides=args.overrides
    )
    if args.text is not None:
        source = files_source(args.text, run.tokenizer.kind, allow_binary=args.allow_binary)
    else:
        source = corpus_source(run, args.data, args.format, args.split or run.config.eval.split)
    result, path = evaluate_source(run, source, out=args.out)
    print(result.summary())
    print(f"wrote {path}")


def check_input_modality(args: argparse.Namespace) -> None:
    """Text files for a text run, a corpus of the run's modality for --data: one line otherwise, before any weights
    are loaded."""
    modality = read_modality(args.run_dir)
    if args.text is not None:
        require_modality(modality, TEXT, "--text FILE", "score sound files with --data DIR --format audio")
    else:
        remedy = "give --format audio and a folder of sound files" if modality == AUDIO else "give a text format"
        require_modality(modality, format_modality(args.format), f"--data DIR --format {args.format}", remedy)


def _evaluate_split(args: argparse.Namespace) -> None:
    if args.format is not None:
        raise ConfigError("--format: applies to --data DIR only; add --data DIR or drop --format")
    result, out = evaluate_run_to(
        args.run_dir,
        split=args.split,
        overrides=args.overrides,
        checkpoint=args.checkpoint,
        out=args.out,
        device=args.device,
        threads=args.threads,
    )
    print(result.summary())
    print(f"wrote {out}")
