"""Print the package's optional extras (besides dev), comma-separated: what `scripts/setup.sh all` (and so CI)
installs so that every test runs. Runs before the package and its dependencies are installed, so on Python 3.10
without tomli it reads the table's keys directly."""

from __future__ import annotations

import re
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def optional_extras(text: str) -> list[str]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            section = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
            return re.findall(r"^([A-Za-z0-9_-]+)\s*=", section, flags=re.M)
    return list(tomllib.loads(text)["project"]["optional-dependencies"])


print(",".join(name for name in optional_extras(PYPROJECT.read_text()) if name != "dev"))
