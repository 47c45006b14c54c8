"""``compressive-transformer rl train CONFIG``: train an agent (or continue one with ``--resume``);
``rl evaluate RUN``: play fresh episodes with its policy (the newest checkpoint's, or with ``--best`` the best
window's)."""

from __future__ import annotations

import argparse
import importlib.util
import json
from dataclasses import asdict
from pathlib import Path

from compressive_transformer.agents.config import EVAL_EPISODES, EVAL_SEED, load_rl_config
from compressive_transformer.commands.options import SEEDS, add_overrides, whole
from compressive_transformer.core.config import ConfigError
from compressive_transformer.core.fileio import check_new, create_text
from compressive_transformer.core.install import install_hint
from compressive_transformer.runs.rundir import fresh_run_dir

RL_PACKAGES = ("gymnasium", "torchrl")  # minigrid only for env.name = "minigrid"
NAME = "rl"
HELP = "agents with a memory core (needs the [rl] extra)"
DESCRIPTION = "Train an agent whose core is a Transformer-XL, a Compressive Transformer or an LSTM."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="rl_command", required=True, metavar="ACTION", help="train or evaluate")
    p = sub.add_parser("train", help="train an agent with a memory core", description="Train an IMPALA-style agent.")
    p.add_argument("config", type=Path, nargs="?", help="TOML with [env], [core], [model], [train] (see configs/)")
    add_overrides(p, "override a key, e.g. --set train.env_steps=100000 (repeatable)")
    p.add_argument("--run-dir", type=Path, help="run directory; default: a fresh runs/rl-<config>-<time>")
    p.add_argument("--resume", action="store_true", help="continue the run in --run-dir from its newest checkpoint")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    e = sub.add_parser(
        "evaluate",
        help="play fresh episodes with a trained agent's policy",
        description="Play fresh episodes (seeded apart from training's) with an agent run's policy; report the "
        "success rate with an exact 95% interval and the mean return.",
    )
    e.add_argument("run_dir", type=Path, help="the run directory of `rl train`")
    e.add_argument("--best", action="store_true", help="the best window's weights (<run>/best), not the newest")
    e.add_argument(
        "--episodes", type=whole(1), default=EVAL_EPISODES, help=f"episodes to play (default {EVAL_EPISODES})"
    )
    e.add_argument("--envs", type=whole(1), help="environments played at once (default: the run's train.n_envs)")
    e.add_argument(
        "--seed",
        type=whole(0, SEEDS - 1),
        default=EVAL_SEED,
        help=f"the environments' first seed (default {EVAL_SEED})",
    )
    e.add_argument(
        "--json", type=Path, help="also write the result to this new JSON file (an existing one is never replaced)"
    )
    e.add_argument("--no-progress", action="store_true", help="no progress bar")


def main(args: argparse.Namespace) -> None:
    missing = [name for name in RL_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError(f"rl needs the rl extra ({missing[0]} is missing): {install_hint('rl')}")
    if args.rl_command == "evaluate":
        evaluate(args)
    else:
        train(args)


def evaluate(args: argparse.Namespace) -> None:
    from compressive_transformer.agents.evaluate import evaluate_agent  # needs the extra (gymnasium)

    if args.json is not None:
        check_new(args.json, "--json")  # before any episode is played: a result never replaces a file
    result = evaluate_agent(
        args.run_dir,
        best=args.best,
        episodes=args.episodes,
        n_envs=args.envs,
        seed=args.seed,
        progress=not args.no_progress,
    )
    low, high = result.interval
    print(
        f"{result.episodes} episodes with the weights of update {result.step} ({result.checkpoint}): success rate "
        f"{result.success_rate:.3f} (95% interval {low:.3f}-{high:.3f}), mean return {result.mean_return:.3f}"
    )
    if args.json is not None:
        record = json.dumps({**asdict(result), "checkpoint": str(result.checkpoint)}, indent=1) + "\n"
        print(f"wrote {create_text(args.json, record, what='--json')}")


def train(args: argparse.Namespace) -> None:
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
        args.run_dir = run_dir  # what Ctrl-C's advice names
    summary = train_agent(cfg, run_dir, resume=args.resume, progress=not args.no_progress)
    print(
        f"{summary.env_steps} environment steps, {summary.episodes} episodes; recent episodes: "
        f"success rate {summary.success_rate:.3f}, mean return {summary.mean_return:.3f}"
    )
    print(f"run directory: {run_dir} (checkpoint {summary.checkpoint})")
    if summary.best is not None:
        b = summary.best
        print(
            f"best policy: success rate {b.success_rate:.3f}, mean return {b.mean_return:.3f} over the {b.window} "
            f"episodes before update {b.step} ({b.path}; `rl evaluate {run_dir} --best` plays it)"
        )
    else:
        print("no best policy kept yet: fewer than train.window episodes have ended (train longer, or lower it)")
