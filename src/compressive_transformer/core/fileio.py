"""Writing user-visible files so that a failure never leaves half of one, and never after the work is done."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

from compressive_transformer.core.config import ConfigError


def write_text_atomic(path: Path, text: str) -> Path:
    """Write ``text`` to a temporary file beside ``path`` and rename it into place: readers see the old file or the
    new one, never a torn one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, _mode_of(path))  # mkstemp's 0600 would hide results from the user's group
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _mode_of(path: Path) -> int:
    """The permissions a plain write would leave: those of the file being replaced, else 0666 less the umask."""
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        return 0o666 & ~_umask()


def _umask() -> int:
    """The process's umask: from /proc on Linux; elsewhere by setting it and putting it straight back (a moment in
    which another thread's new file would get no mask)."""
    try:
        status = Path("/proc/self/status").read_text(encoding="ascii")
        return int(next(line.split()[1] for line in status.splitlines() if line.startswith("Umask:")), 8)
    except (OSError, StopIteration, ValueError, IndexError):
        umask = os.umask(0)
        os.umask(umask)
        return umask


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


@contextlib.contextmanager
def exclusive(directory: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``directory`` for the block, waiting for any other holder: processes that fill one
    shared directory (a token cache, a results file) take turns. The directory itself is the lock (``flock`` on its
    descriptor), so no lock file is left beside the data, and the kernel drops it however the holder exits. Without
    ``fcntl`` (Windows) it does not lock."""
    directory.mkdir(parents=True, exist_ok=True)
    if fcntl is None:  # pragma: no cover - Windows
        yield
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing drops the lock


__all__ = ["exclusive", "write_text_atomic", "require_writable"]
