"""``compressive-transformer``: the console entry point. Each command is one module of
:mod:`compressive_transformer.commands` (its options and its ``main``); this module assembles the parser from them
and turns the mistakes a user can make into one line.

Mistakes a user can make (a missing file, an unknown key, a run that already exists, a diverged loss) end as one
``error: ...`` line on stderr with exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys

import torch.distributed

from compressive_transformer.commands import (
    analyze,
    compare,
    data,
    demo,
    evaluate,
    export,
    generate,
    import_checkpoint,
    lm_eval,
    report,
    rl,
    study,
    task,
    train,
)
from compressive_transformer.commands import range as range_
from compressive_transformer.commands.interrupted import interrupted_message
from compressive_transformer.commands.options import Parser
from compressive_transformer.core.config import ConfigError
from compressive_transformer.core.version import __version__
from compressive_transformer.runs import allocator
from compressive_transformer.training.distributed import PeerStopped
from compressive_transformer.training.trainer import TrainingError

EXIT_USER_ERROR = 2
TRAINING_COMMANDS = ("train", "rl")  # the commands that write checkpoints, whose earlier ones a failure never touches
COMMANDS = {
    m.NAME: m
    for m in (
        train,
        evaluate,
        generate,
        export,
        range_,
        compare,
        study,
        task,
        analyze,
        report,
        data,
        demo,
        import_checkpoint,
        lm_eval,
        rl,
    )
}


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="compressive-transformer",
        description="Train, evaluate and sample Compressive Transformers, Transformer-XL and Transformer-QL.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE (on the Python path or in the current directory) before the command: its register_* "
        "calls (a format, a compressor, a kernel, a model kind) then apply to the command (repeatable)",
    )
    sub = parser.add_subparsers(
        dest="command",
        required=True,
        metavar="COMMAND",
        help="run `compressive-transformer COMMAND -h` for its options",
    )
    for name, command in COMMANDS.items():
        command.add_arguments(sub.add_parser(name, help=command.HELP, description=command.DESCRIPTION))
    return parser


def say_error(message: str) -> None:
    """``error: message`` on stderr, once per command: under ``torchrun`` every process reads the same config and
    fails alike before they join, so only the main one says it; once joined, another process's error may be its
    own, and it says it with its rank."""
    rank = int(os.environ.get("RANK", "0") or 0) if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1 else 0
    if rank == 0:
        print(f"error: {message}", file=sys.stderr)
    elif torch.distributed.is_available() and torch.distributed.is_initialized():
        print(f"error: rank {rank}: {message}", file=sys.stderr)


def _trains(args: argparse.Namespace) -> bool:
    """Whether the command writes checkpoints (``train``, ``rl train``; not ``rl evaluate``)."""
    return args.command in TRAINING_COMMANDS and getattr(args, "rl_command", "train") == "train"


def leading_imports(argv: list[str]) -> list[str]:
    """The ``--import MODULE`` options given before the command: they must be imported before the parser is built,
    since its choices (``--format``) come from the tables they fill."""
    found, i = [], 0
    while i < len(argv) and argv[i].startswith("-"):
        if argv[i] == "--import" and i + 1 < len(argv):
            found.append(argv[i + 1])
            i += 1
        elif argv[i].startswith("--import="):
            found.append(argv[i].partition("=")[2])
        i += 1
    return found


def import_modules(names: list[str]) -> None:
    """Import the user's modules (the current directory first on the path, as ``python -m`` would), in one line
    when one cannot be imported."""
    if names and "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as e:  # the user's module: whatever it raises, said in one line
            first = (str(e).strip().splitlines() or [""])[0][:200]
            raise ConfigError(
                f"--import {name}: cannot be imported ({type(e).__name__}: {first}); give a module on the Python path "
                "or in the current directory (my_formats for ./my_formats.py)"
            ) from None


def command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the (sub)command ``args`` chose (``rl evaluate``'s for ``rl evaluate ...``)."""
    while True:
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        name = getattr(args, sub.dest, None) if sub is not None else None
        if sub is None or name not in sub.choices:
            return parser
        parser = sub.choices[name]


def refuse_unknown(parser: argparse.ArgumentParser, args: argparse.Namespace, unknown: list[str]) -> None:
    """Unknown arguments, said by the command's own parser (its usage, not the top level's), with the option meant
    where one is close (``--run_dir``: ``--run-dir``)."""
    own = command_parser(parser, args)
    options = [o for a in own._actions for o in a.option_strings]
    word = unknown[0].partition("=")[0]
    close = difflib.get_close_matches(word.replace("_", "-"), options, n=1, cutoff=0.6) if word.startswith("-") else []
    hint = f"; did you mean {close[0]}?" if close else f"; see `{own.prog} -h` for its options"
    own.error(f"unrecognized arguments: {' '.join(unknown)}{hint}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        import_modules(leading_imports(argv))
    except ConfigError as e:
        say_error(str(e))
        return EXIT_USER_ERROR
    parser = build_parser()
    try:
        args, unknown = parser.parse_known_args(argv)
    except ConfigError as e:  # a number outside its range
        say_error(str(e))
        return EXIT_USER_ERROR
    if unknown:
        refuse_unknown(parser, args, unknown)

    allocator.keep_freed_memory()  # a process-wide allocator setting: the command line's to make, not the library's

    try:
        COMMANDS[args.command].main(args)
    except (ConfigError, TrainingError) as e:
        if not isinstance(e, PeerStopped):  # the main process says why the run stopped
            say_error(str(e))
        return EXIT_USER_ERROR
    except OSError as e:  # a full disk, a read-only directory, a permission: the message names the path
        kept = "; the run's previous checkpoints are untouched" if _trains(args) else ""
        say_error(f"{e}{kept}")
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        run_dir = getattr(args, "run_dir", None) if _trains(args) else None
        message = interrupted_message(args.command, run_dir, seeded=getattr(args, "seeds", None) is not None)
        print(f"error: {message}", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
