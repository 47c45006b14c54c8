"""``compressive-transformer rl train CONFIG``: train an agent (or continue one with ``--resume``)."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

from compressive_transformer.agents.config import load_rl_config
from compressive_transformer.commands.options import add_overrides
from compressive_transformer.core.config import ConfigError
from compressive_transformer.core.install import install_hint
from compressive_transformer.runs.rundir import fresh_run_dir

RL_PACKAGES = ("gymnasium", "torchrl")  # minigrid only for env.name = "minigrid"
NAME = "rl"
HELP = "agents with a memory core (needs the [rl] extra)"
DESCRIPTION = "Train an agent whose core is a Transformer-XL, a Compressive Transformer or an LSTM."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="rl_command", required=True, metavar="ACTION", help="what to do: train")
    p = sub.add_parser("train", help="train an agent with a memory core", description="Train an IMPALA-style agent.")
    p.add_argument("config", type=Path, nargs="?", help="TOML with [env], [core], [model], [train] (see configs/)")
    add_overrides(p, "override a key, e.g. --set train.env_steps=100000 (repeatable)")
    p.add_argument("--run-dir", type=Path, help="run directory; default: a fresh runs/rl-<config>-<time>")
    p.add_argument("--resume", action="store_true", help="continue the run in --run-dir from its newest checkpoint")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def main(args: argparse.Namespace) -> None:
    missing = [name for name in RL_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError(f"rl needs the rl extra ({missing[0]} is missing): {install_hint('rl')}")
    from compressive_transformer.agents.train import train_agent  # needs the extra (gymnasium, torchrl)

    if args.resume:
        if args.run_dir is None:
            raise ConfigError("--resume: needs --run-dir, the run to continue")
        run_dir = args.run_dir
        base = args.config if args.config is not None else run_dir / "config.toml"
        cfg = load_rl_config(base, args.overrides) if args.config is not None or args.overrides else None
    else:
        cfg = load_rl_config(args.config, args.overrides)
        run_dir = args.run_dir or fresh_run_dir(f"rl-{args.config.stem if args.config else 'default'}")
    summary = train_agent(cfg, run_dir, resume=args.resume, progress=not args.no_progress)
    print(
        f"{summary.env_steps} environment steps, {summary.episodes} episodes; recent episodes: "
        f"success rate {summary.success_rate:.3f}, mean return {summary.mean_return:.3f}"
    )
    print(f"run directory: {run_dir} (checkpoint {summary.checkpoint})")
