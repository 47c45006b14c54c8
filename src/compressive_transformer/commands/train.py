"""``compressive-transformer train``: train a model into a run directory, or resume one."""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path

from compressive_transformer.commands.options import add_overrides
from compressive_transformer.core.config import ConfigError
from compressive_transformer.runs.machine import resolve_device
from compressive_transformer.runs.rundir import build_config, fresh_run_dir
from compressive_transformer.training.distributed import from_main
from compressive_transformer.training.workflows import train_run

NAME = "train"
HELP = "train a model (or resume a run)"
DESCRIPTION = "Train a model into a run directory."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, help="TOML config (see configs/); default: the built-in tiny config")
    add_overrides(p, "override one config key, e.g. --set train.steps=500 (repeatable)")
    p.add_argument(
        "--run-dir",
        type=Path,
        help="run directory; default: a fresh runs/<config>-<time> (one for all torchrun processes)",
    )
    p.add_argument("--resume", action="store_true", help="continue the run in --run-dir from its newest checkpoint")
    p.add_argument(
        "--init-from",
        type=Path,
        metavar="RUN_OR_EXPORT",
        help="start from the weights of this run or export (parameters in both are copied, new ones listed; "
        'train.freeze = ["model"] trains only the new compressor) and use its tokenizer',
    )


def main(args: argparse.Namespace) -> None:
    if args.resume and args.init_from is not None:
        raise ConfigError("--init-from: starts a new run; a resumed run continues from its own checkpoints")
    if args.resume:
        if args.run_dir is None:
            raise ConfigError("--resume: needs --run-dir, the run to continue")
        cfg = build_config(args.config, args.overrides) if args.config is not None else None
        summary = train_run(cfg, args.run_dir, resume=True, overrides=args.overrides)
        run_dir = args.run_dir
    else:
        cfg = build_config(args.config, args.overrides)
        if args.init_from is not None:
            cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, init_from=str(args.init_from)))
        fresh = lambda: fresh_run_dir(args.config.stem if args.config else "tiny")  # noqa: E731
        if args.run_dir is None and int(os.environ.get("WORLD_SIZE", "1")) > 1:  # torchrun: one name for all
            args.run_dir = from_main(fresh, resolve_device(cfg.train.device))
        # kept on args: the Ctrl-C message names the run directory that was left
        run_dir = args.run_dir = args.run_dir or fresh()
        summary = train_run(cfg, run_dir)
    if int(os.environ.get("RANK", "0")) != 0:  # the main process reports for all
        return
    if summary.validation is not None:
        print(summary.validation.summary())
    print(f"run directory: {run_dir} (step {summary.step}, checkpoint {summary.checkpoint})")
