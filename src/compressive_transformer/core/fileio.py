"""Writing user-visible files so that a failure never leaves half of one, and never after the work is done."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from compressive_transformer.core.config import ConfigError


def write_text_atomic(path: Path, text: str) -> Path:
    """Write ``text`` to a temporary file beside ``path`` and rename it into place: readers see the old file or the
    new one, never a torn one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def require_writable(path: Path) -> None:
    """Stop before any work when ``path`` cannot be written (a read-only run directory), not after it."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"):
            pass
        if path.exists() and not os.access(path, os.W_OK):
            raise PermissionError(13, "Permission denied", str(path))
    except OSError as e:
        raise ConfigError(
            f"{path}: cannot be written ({e.strerror or e}); pass --out FILE to write the result elsewhere"
        ) from None


__all__ = ["write_text_atomic", "require_writable"]
