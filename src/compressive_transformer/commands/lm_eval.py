"""``compressive-transformer lm-eval RUN_DIR [harness options]``: the harness's own ``lm-eval run`` with this
library's model registered first (the harness finds models only among classes already imported, never by entry
point). Every option after RUN_DIR is the harness's: ``--tasks``, ``--include_path``, ``--model_args k=v``,
``--batch_size``, ``--device``, ``--limit``, ``--output_path``, ``--log_samples`` ..."""

from __future__ import annotations

import argparse
import contextlib
import logging
import subprocess
import sys
from pathlib import Path
from typing import Iterator

from compressive_transformer.commands.options import add_run_or_export
from compressive_transformer.core.config import ConfigError
from compressive_transformer.core.install import install_hint
from compressive_transformer.core.modality import TEXT, require_modality
from compressive_transformer.harness.offline import offline_error, offline_unless_reachable
from compressive_transformer.runs.loading import read_modality

NAME = "lm-eval"
HELP = "evaluate a run with the lm-evaluation-harness (the [lm-eval] extra)"
DESCRIPTION = (
    "Run `lm-eval run` on RUN_DIR with this library's harness model; the options after RUN_DIR are the harness's own "
    "(--tasks, --include_path, --model_args, --batch_size, --limit, --output_path ...)."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_run_or_export(p)
    p.add_argument(
        "harness_args",
        nargs=argparse.REMAINDER,
        metavar="HARNESS_OPTIONS",
        help="options of `lm-eval run`, e.g. --tasks wikitext --include_path DIR --model_args mem_len=512",
    )


def _option(args: list[str], *names: str) -> str | None:
    """The value of the last ``--name VALUE`` / ``--name=VALUE`` among ``args`` (None when not given)."""
    value = None
    for i, a in enumerate(args):
        for name in names:
            if a == name and i + 1 < len(args):
                value = args[i + 1]
            elif a.startswith(name + "="):
                value = a[len(name) + 1 :]
    return value


def model_args(args: list[str]) -> dict[str, str]:
    """The ``key=value`` pairs of every ``--model_args`` (``-a``) among ``args``, merged as the harness merges them
    (``k=v,k2=v2`` or ``k=v k2=v2``; a later key wins)."""
    found: dict[str, str] = {}
    words: list[str] = []
    taking = False
    for a in args:
        if a in ("--model_args", "-a"):
            taking = True
        elif a.startswith("--model_args="):
            words.append(a.split("=", 1)[1])
            taking = False
        elif taking and not a.startswith("-"):
            words.append(a)
        else:
            taking = False
    for pair in (p for word in words for p in word.split(",") if "=" in p):
        key, value = pair.split("=", 1)
        found[key.strip()] = value.strip()
    return found


def setting_notes(harness_args: list[str]) -> list[str]:
    """One line for each setting given twice with different values: the harness's ``--batch_size`` / ``--device``
    and the same key in ``--model_args``, whose value the model uses."""
    given = model_args(harness_args)
    notes = []
    for flags, key in ((("--batch_size", "-b"), "batch_size"), (("--device",), "device")):
        value = _option(harness_args, *flags)
        if value is not None and key in given and given[key] != value:
            notes.append(
                f"note: {flags[0]} {value} and --model_args {key}={given[key]} both set the {key.replace('_', ' ')}; "
                f"the model uses --model_args {key}={given[key]}"
            )
    return notes


def harness_argv(run_dir: Path, harness_args: list[str]) -> list[str]:
    """The ``lm-eval run`` command line: this library's model with ``run=RUN_DIR`` merged into its arguments, on
    ``device=auto`` (CUDA where present, else the CPU) unless a device is asked for (the harness would otherwise pass
    its default, ``cuda:0``)."""
    if any(a == "--model" or a.startswith("--model=") for a in harness_args):
        raise ConfigError("--model: `compressive-transformer lm-eval` always evaluates RUN_DIR; drop --model")
    if "," in str(run_dir) or "=" in str(run_dir):
        raise ConfigError(f"RUN_DIR: {run_dir} contains ',' or '=', which --model_args cannot carry; rename it")
    if not run_dir.is_dir():
        raise ConfigError(f"RUN_DIR: {run_dir} is not a directory; give a run directory written by `train`")
    require_modality(read_modality(run_dir), TEXT, "lm-eval's tasks", "the harness scores text; give a text run")
    # `pretrained=` (the same as run=) is the key the harness names its output folders after
    device = _option(harness_args, "--device") is None and "device" not in model_args(harness_args)
    return [
        "lm-eval",
        "run",
        "--model",
        "compressive-transformer",
        "--model_args",
        f"pretrained={run_dir}" + (",device=auto" if device else ""),
        *harness_args,
    ]


def main(args: argparse.Namespace) -> None:
    argv = harness_argv(args.run_dir, list(args.harness_args))
    for line in setting_notes(list(args.harness_args)):
        print(line, file=sys.stderr)
    note = offline_unless_reachable()  # before the harness is imported: its Hub client reads the switch then
    quiet = note is not None and _option(args.harness_args, "--verbosity", "-v") is None
    if note is not None:
        print(
            note + (" (its INFO and WARNING lines are hidden; --verbosity INFO shows them)" if quiet else ""),
            file=sys.stderr,
        )
    try:
        import compressive_transformer.harness.model  # noqa: F401  (registers the model; needs the extra)
    except ImportError as e:
        raise ConfigError(
            f"lm-eval: the lm-evaluation-harness is not installed ({e}); {install_hint('lm-eval')}"
        ) from None
    saved = sys.argv
    sys.argv = argv  # the harness's parser reads sys.argv
    try:
        run_harness(logging.ERROR if quiet else logging.INFO)
    except OSError as e:  # offline, a dataset or file the cache does not hold (datasets raises ConnectionError)
        if note is None:
            raise
        raise ConfigError(offline_error(e)) from None
    finally:
        sys.argv = saved


def run_harness(verbosity: int = logging.INFO) -> None:
    """The harness's command line on ``sys.argv``: its ``run`` subcommand (newer 0.4 releases) or, in older 0.4
    releases, the single command that ``run`` replaced; its log at ``verbosity`` (its ``--verbosity`` or
    ``LMEVAL_LOG_LEVEL`` still win)."""
    try:
        from lm_eval._cli import HarnessCLI
        from lm_eval.utils import setup_logging
    except ImportError:
        from lm_eval.__main__ import cli_evaluate

        sys.argv.remove("run")
        cli_evaluate()
        return
    setup_logging(verbosity)
    cli = HarnessCLI()
    with quiet_git_hash():
        cli.execute(cli.parse_args())


def git_hash_quietly() -> str | None:
    """The harness's record of the working directory's git commit, asked of git with its complaint outside a
    repository (``fatal: not a git repository``) kept off the terminal."""
    try:
        return subprocess.check_output(["git", "describe", "--always"], stderr=subprocess.DEVNULL).strip().decode()
    except (OSError, subprocess.CalledProcessError):
        return None


@contextlib.contextmanager
def quiet_git_hash() -> Iterator[None]:
    """The harness's evaluator asks git through :func:`git_hash_quietly` for the block (and as before after it)."""
    import lm_eval.evaluator as evaluator

    before = getattr(evaluator, "get_git_commit_hash", None)
    if before is None:  # a harness release without it: nothing to quieten
        yield
        return
    evaluator.get_git_commit_hash = git_hash_quietly
    try:
        yield
    finally:
        evaluator.get_git_commit_hash = before
