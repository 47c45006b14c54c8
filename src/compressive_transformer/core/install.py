"""How this installation is run and extended from the user's shell: the command that runs the command line again,
and the command that installs an optional extra. Advice a program prints must work when pasted, so it names the
program as the user can run it (``.venv/bin/compressive-transformer`` where the environment is not activated) and
the extras through ``scripts/setup.sh`` in a checkout, which pins torch."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

SCRIPT = "compressive-transformer"
CHECKOUT = (
    Path(__file__).resolve().parents[3]
)  # the repository root of an editable install (src/compressive_transformer/core)


def _shown(path: Path) -> str:
    """``path`` relative to the working directory where it lies below it (``.venv/bin/...``), else absolute."""
    cwd = Path.cwd()
    if cwd == Path(cwd.anchor):  # below the root every path is "relative": the absolute one reads better
        return str(path)
    try:
        return str(path.relative_to(cwd))
    except ValueError:
        return str(path)


def program() -> str:
    """The command that runs this command line from the user's shell: ``compressive-transformer`` where the one on
    the PATH is this environment's, else the environment's script by its path, else ``python -m``."""
    script = Path(sys.executable).parent / SCRIPT
    found = shutil.which(SCRIPT)
    if found is not None and script.exists() and os.path.samefile(found, script):
        return SCRIPT
    if script.exists():
        return _shown(script)
    return f"{_shown(Path(sys.executable))} -m compressive_transformer.cli"


def install_hint(extra: str) -> str:
    """The command that installs the optional ``extra`` into this environment."""
    setup = CHECKOUT / "scripts" / "setup.sh"
    if setup.is_file() and (CHECKOUT / "pyproject.toml").is_file():
        return f"bash {_shown(setup)} {extra}"
    return f"{_shown(Path(sys.executable))} -m pip install 'compressive-transformer[{extra}]'"


__all__ = ["install_hint", "program"]
