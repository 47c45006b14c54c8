"""``compressive-transformer task``: the generated long-range tasks (``long-range``: models compared by distance at
equal attention cost, over seeds with ``--seeds``; ``train``: one model on one task from a TOML config)."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from compressive_transformer.commands.options import SEEDS, add_overrides, whole
from compressive_transformer.core.config import ConfigError
from compressive_transformer.experiments import run_long_range, run_task
from compressive_transformer.experiments.ablation import run_seeded, seeded_command
from compressive_transformer.runs.rundir import fresh_run_dir

NAME = "task"
HELP = "long-range synthetic tasks"
DESCRIPTION = "Controlled long-range tasks (passkey, associative recall, selective copy), streamed segment by segment with memory."


def add_arguments(p: argparse.ArgumentParser) -> None:
    actions = p.add_subparsers(dest="task_command", required=True, metavar="ACTION", help="what to run")
    _add_long_range(
        actions.add_parser(
            "long-range",
            help="train and score models by distance at equal attention cost",
            description="Train each model on each task, evaluate accuracy by distance, merge into OUT/results.json, "
            "and plot accuracy against distance with the theoretical ranges drawn in.",
        )
    )
    t = actions.add_parser(
        "train",
        help="one model on one task from a TOML config",
        description="Train one model on one task (configs/long_range/) and write OUT/result.json with a plot.",
    )
    t.add_argument("config", type=Path, metavar="CONFIG", help="task TOML config")
    add_overrides(t, "override a key, e.g. --set train.steps=200 (repeatable)")
    t.add_argument("--out", type=Path, required=True, help="output directory")


def _add_long_range(t: argparse.ArgumentParser) -> None:
    t.add_argument(
        "--preset",
        choices=("quick", "full"),
        default="full",
        help="training budget and task sizes (quick: seconds; default full)",
    )
    t.add_argument(
        "--tasks",
        default="passkey",
        help="comma-separated: passkey, associative_recall, selective_copy (default passkey)",
    )
    t.add_argument(
        "--models",
        default="txl,ct",
        help="comma-separated: txl, ct, ct-<compression>-<loss>, or ablation for the compression fn x loss grid (default txl,ct)",
    )
    t.add_argument("--seed", type=whole(0, SEEDS - 1), default=0, help="seed of data and initialisation (default 0)")
    t.add_argument(
        "--seeds",
        help="comma-separated seeds, e.g. 0,1,2: every (task, model, seed) cell at one budget (--budget, else the preset's ablation budget), resumable, summarised with 95%% intervals in OUT/seeds.md",
    )
    t.add_argument("--parallel", type=whole(1), default=1, help="cells trained at once with --seeds (default 1)")
    t.add_argument("--budget", type=whole(1), help="training steps per model (default: the preset's)")
    t.add_argument(
        "--out", type=Path, help="output directory (default: a fresh runs/long-range-<time>; needed with --seeds)"
    )
    t.add_argument("--threads", type=whole(1), help="torch CPU threads")


def main(args: argparse.Namespace) -> None:
    if args.task_command == "train":
        run_task(args.config, args.out, overrides=args.overrides)
        print(f"wrote {args.out / 'result.json'}")
    elif args.seeds is not None:
        _seeded(args)
    else:
        _long_range(args)


def _seeded(args: argparse.Namespace) -> None:
    try:
        seeds = tuple(int(s) for s in args.seeds.split(","))
    except ValueError:
        raise ConfigError(f"--seeds: {args.seeds!r} is not a comma-separated list of integers, e.g. 0,1,2") from None
    if args.out is None:  # the cells a rerun resumes live there: a fresh default directory would lose them
        raise ConfigError("--seeds: needs --out DIR, where each finished cell is kept and a rerun resumes them")
    tasks, models = tuple(args.tasks.split(",")), tuple(args.models.split(","))
    command = seeded_command(args.preset, args.out, tasks, models, seeds, args.budget, args.parallel)
    run_seeded(
        args.preset,
        args.out,
        tasks=tasks,
        models=models,
        seeds=seeds,
        budget=args.budget,
        parallel=args.parallel,
        threads=args.threads or 1,
        command=command,
    )
    print(f"wrote {args.out / 'seeds.json'} and {args.out / 'seeds.md'}")


def _long_range(args: argparse.Namespace) -> None:
    if args.parallel != 1:
        raise ConfigError("--parallel: only with --seeds (one seed runs its models one after another)")
    if args.threads:
        torch.set_num_threads(args.threads)
    args.out = args.out or fresh_run_dir("long-range")
    run_long_range(
        args.preset,
        args.out,
        tasks=tuple(args.tasks.split(",")),
        models=tuple(args.models.split(",")),
        seed=args.seed,
        budget=args.budget,
    )
    print(f"wrote {args.out / 'results.json'} and {args.out / 'results.md'}")
