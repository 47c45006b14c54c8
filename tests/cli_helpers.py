"""Running the command-line interface in-process, and the one-line error contract its tests check."""

from __future__ import annotations

import resource
import subprocess
import sys

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


def cli_capped(*argv: str, memory_gib: int = 6, timeout: float = 120) -> subprocess.CompletedProcess:
    """``compressive-transformer ARGV`` in a fresh process whose address space and time are capped: for configs too
    large for memory, which once hung building layers or took the machine's memory; a regression fails, bounded."""

    def cap() -> None:
        limit = memory_gib << 30
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    command = [sys.executable, "-m", "compressive_transformer.cli", *argv]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, preexec_fn=cap)
