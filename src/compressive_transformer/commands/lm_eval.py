"""``compressive-transformer lm-eval RUN_DIR [harness options]``: the harness's own ``lm-eval run`` with this
library's model registered first (the harness finds models only among classes already imported, never by entry
point). Every option after RUN_DIR is the harness's: ``--tasks``, ``--include_path``, ``--model_args k=v``,
``--batch_size``, ``--device``, ``--limit``, ``--output_path``, ``--log_samples`` ..."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

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


def harness_argv(run_dir: Path, harness_args: list[str]) -> list[str]:
    """The ``lm-eval run`` command line: this library's model with ``run=RUN_DIR`` merged into its arguments."""
    if any(a == "--model" or a.startswith("--model=") for a in harness_args):
        raise ConfigError("--model: `compressive-transformer lm-eval` always evaluates RUN_DIR; drop --model")
    if "," in str(run_dir) or "=" in str(run_dir):
        raise ConfigError(f"RUN_DIR: {run_dir} contains ',' or '=', which --model_args cannot carry; rename it")
    if not run_dir.is_dir():
        raise ConfigError(f"RUN_DIR: {run_dir} is not a directory; give a run directory written by `train`")
    require_modality(read_modality(run_dir), TEXT, "lm-eval's tasks", "the harness scores text; give a text run")
    # `pretrained=` (the same as run=) is the key the harness names its output folders after
    return [
        "lm-eval",
        "run",
        "--model",
        "compressive-transformer",
        "--model_args",
        f"pretrained={run_dir}",
        *harness_args,
    ]


def main(args: argparse.Namespace) -> None:
    argv = harness_argv(args.run_dir, list(args.harness_args))
    note = offline_unless_reachable()  # before the harness is imported: its Hub client reads the switch then
    if note is not None:
        print(note, file=sys.stderr)
    try:
        import compressive_transformer.harness.model  # noqa: F401  (registers the model; needs the extra)
    except ImportError as e:
        raise ConfigError(
            f"lm-eval: the lm-evaluation-harness is not installed ({e}); {install_hint('lm-eval')}"
        ) from None
    saved = sys.argv
    sys.argv = argv  # the harness's parser reads sys.argv
    try:
        run_harness()
    except OSError as e:  # offline, a dataset or file the cache does not hold (datasets raises ConnectionError)
        if note is None:
            raise
        raise ConfigError(offline_error(e)) from None
    finally:
        sys.argv = saved


def run_harness() -> None:
    """The harness's command line on ``sys.argv``: its ``run`` subcommand (newer 0.4 releases) or, in older 0.4
    releases, the single command that ``run`` replaced."""
    try:
        from lm_eval._cli import HarnessCLI
        from lm_eval.utils import setup_logging
    except ImportError:
        from lm_eval.__main__ import cli_evaluate

        sys.argv.remove("run")
        cli_evaluate()
        return
    setup_logging()
    cli = HarnessCLI()
    cli.execute(cli.parse_args())
