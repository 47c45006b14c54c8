"""``results.json`` of the long-range experiment: read, changed and written back under an exclusive lock, so several
processes can add their runs to one file."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, Iterator

from compressive_transformer.core.config import ConfigError
from compressive_transformer.core.fileio import exclusive
from compressive_transformer.experiments.runner import write_json

RESULTS_FILE = "results.json"


@contextlib.contextmanager
def locked_results(out: Path) -> Iterator[dict[str, Any]]:
    """Read results.json under an exclusive lock, let the caller change it, write it back atomically."""
    path = out / RESULTS_FILE
    with exclusive(out):
        results = _read(path)
        before = json.dumps(results, sort_keys=True)
        yield results
        if json.dumps(results, sort_keys=True) != before:
            write_json(path, results)


def _read(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(results, dict):
            raise ValueError("not an object")
    except ValueError as e:
        raise ConfigError(
            f"{path}: is not a results file ({type(e).__name__}); move it aside and rerun to measure again"
        ) from None
    return results


__all__ = ["RESULTS_FILE", "locked_results"]
