"""Print the package's optional extras (besides dev), comma-separated: what .ci/run installs so that every test runs."""

from __future__ import annotations

from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

extras = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"][
    "optional-dependencies"
]
print(",".join(name for name in extras if name != "dev"))
