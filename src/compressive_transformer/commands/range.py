"""``compressive-transformer range``: the temporal range and attention cost of a config."""

from __future__ import annotations

import argparse
from pathlib import Path

from compressive_transformer.commands.options import add_overrides
from compressive_transformer.core.config import ConfigError
from compressive_transformer.core.context import range_report
from compressive_transformer.runs.rundir import build_config

NAME = "range"
HELP = "print the temporal range and attention cost of a config"
DESCRIPTION = "Temporal range l x (n_m + c n_cm) and attention cost of a model config."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, help="TOML config; default: the built-in tiny config")
    add_overrides(p, "override one config key, e.g. --set model.memory.cmem_len=512 (repeatable)")


def main(args: argparse.Namespace) -> None:
    ignored = [o for o in args.overrides if not o.strip().startswith("model.")]
    if ignored:
        raise ConfigError(f"--set {ignored[0]}: range reads only the [model] table, so it would be ignored; drop it")
    print(range_report(build_config(args.config, args.overrides).model))
