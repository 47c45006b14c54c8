"""An exclusive lock on a run directory, so two processes never train (or resume) one run at once.

The lock is ``fcntl.flock`` on ``<run>/.lock``: the kernel drops it when the holder exits, however it exits (a
``kill -9`` included), so a lock is never stale; the file only records the holder's pid for the message. On
platforms without ``fcntl`` the lock is a no-op.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType

from compressive_transformer.core.config import ConfigError
from compressive_transformer.core.fileio import check_links

LOCK_FILE = ".lock"

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]


class RunLocked(ConfigError):
    """Another process holds the run directory."""


class RunLock:
    """``with RunLock(run_dir): ...`` holds the run for the block; a second holder fails in one line."""

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self.fd: int | None = None

    def acquire(self) -> "RunLock":
        if fcntl is None or self.fd is not None:
            return self
        try:  # never through a link: the pid written below would land in whatever it points to
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
        except OSError as e:
            if not self.path.is_symlink():
                raise
            raise ConfigError(
                f"{self.path}: is a link ({e.strerror}); delete it (the lock file is the run's own)"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode("ascii", "replace").strip() or "another process"
            os.close(fd)
            raise RunLocked(
                f"{self.path.parent}: is in use by process {holder} (training or resuming it); wait for it to finish or stop it first"
            ) from None
        except OSError:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self.fd = fd
        try:
            check_links(self.path.parent)  # a held run is written and pruned: nothing in it may lead out of it
        except ConfigError:
            self.release()
            raise
        return self

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing drops the flock; the file stays (unlinking would race a waiting locker)
            self.fd = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()
