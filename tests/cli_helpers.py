"""Running the command-line interface in-process, and the one-line error contract its tests check."""

from __future__ import annotations

import pytest

from compressive_transformer import cli

# a 6-step run of the built-in tiny config with checkpoints at 2, 4 and 6, quiet, validated and evaluated briefly
FAST = [
    "--set",
    "train.progress=false",
    "--set",
    "train.val_batches=2",
    "--set",
    "train.steps=6",
    "--set",
    "train.checkpoint_every=2",
    "--set",
    "train.keep_checkpoints=3",
    "--set",
    "eval.max_batches=2",
]


def cli_run(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of ``compressive-transformer ARGV``."""
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code: int, err: str, *fragments: str) -> None:
    """A user error: exit code 2 and one line on stderr, holding every fragment, with no traceback."""
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
