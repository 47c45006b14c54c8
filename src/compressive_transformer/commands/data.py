"""``compressive-transformer data``: data utilities (``download``: a benchmark corpus, checksums verified;
``prepare``: a config's tokenizer and token cache built ahead of training, e.g. on a CPU machine for a GPU job)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

from compressive_transformer import data as corpora
from compressive_transformer.commands.options import add_overrides, whole
from compressive_transformer.core.config import ConfigError, RunConfig
from compressive_transformer.data.cache import cache_dir_for, cached_tokenizer, load_corpus
from compressive_transformer.data.readers import SPLITS
from compressive_transformer.data.shards import peak_rss_mib
from compressive_transformer.runs.rundir import build_config, require_empty

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
    d.add_argument("--limit", type=whole(1), help="pg19: only the first N books of each split")
    d.add_argument("--base-url", help="a mirror to download from instead of the corpus's own site")
    d.add_argument(
        "--manifest", type=Path, help="pg19: pinned manifest.json (from a previous download) every file must match"
    )
    p_ = actions.add_parser(
        "prepare",
        help="train a config's tokenizer and build its token cache, without training a model",
        description="Train the tokenizer and build the token cache a config's training reads, then stop. "
        "`train` with the same config and --run-dir (or data.cache_dir) then starts at once.",
    )
    p_.add_argument("--config", type=Path, help="TOML config (see configs/); default: the built-in tiny config")
    add_overrides(p_, "override one config key, e.g. --set data.tokenizer_sample=0 (repeatable)")
    where = p_.add_mutually_exclusive_group(required=True)
    where.add_argument("--run-dir", type=Path, help="the run directory `train --run-dir` will then use")
    where.add_argument("--cache-dir", type=Path, help="a shared cache (`train --set data.cache_dir=DIR` reads it)")


def main(args: argparse.Namespace) -> None:
    if args.data_command == "prepare":
        prepare(build_config(args.config, args.overrides), run_dir=args.run_dir, cache_dir=args.cache_dir)
        return
    path = corpora.download(args.name, args.dir, base_url=args.base_url, limit=args.limit, manifest=args.manifest)
    print(f"{args.name}: {path}")


def prepare(cfg: RunConfig, *, run_dir: Path | None, cache_dir: Path | None) -> list[str]:
    """The tokenizer and every split's cache, as ``train`` in ``run_dir`` (or with ``data.cache_dir``) will look
    for them; prints a line per split and a summary, returns the split lines."""
    start = time.perf_counter()
    if run_dir is not None:
        require_empty(run_dir, "prepare into a new --run-dir (a run keeps the tokenizer it was trained with)")
        cache = cache_dir_for(cfg.data, run_dir)
    else:
        assert cache_dir is not None
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, cache_dir=str(cache_dir)))
        cache = cache_dir
    tokenizer = cached_tokenizer(cfg.data, cache)
    lines = []
    for split in SPLITS:
        try:
            corpus = load_corpus(cfg.data, split, tokenizer, cache)
        except ConfigError as e:
            if split == "train":
                raise
            print(f"note: no {split} split ({e})", file=sys.stderr)
            continue
        line = corpus.summary or (
            f"cached {cfg.data.format} {split}: {corpus.num_docs:,} documents, {corpus.num_tokens:,} tokens (built before)"
        )
        print(line)
        lines.append(line)
    sample = getattr(tokenizer, "sample", None)
    drawn = f", trained on {sample['bytes']:,} bytes of train text" if sample else ""
    target = f"--run-dir {run_dir}" if run_dir is not None else f"--set data.cache_dir={cache}"
    print(
        f"prepared {cache} in {time.perf_counter() - start:,.1f} s (peak memory {peak_rss_mib():,.0f} MiB): "
        f"{tokenizer.kind} tokenizer, {tokenizer.vocab_size:,} ids{drawn}; train with the same config and {target}"
    )
    return lines
