"""Every file the program writes goes through here, so that a failure never leaves half of one, a result never
replaces another, and nothing inside a run directory follows a link out of it.

- :func:`create_file` / :func:`create_text`: a new file (a result, a user-named output), created exclusively: a name
  taken meanwhile (another process's result) gets the next free name, ``-2``, ``-3``...; nothing is replaced.
- :func:`write_text_atomic`: replacing where replacing is the point (a run's config, a rewritten log), atomically.
- :func:`check_new`: the target of a new file checked before the work, not after it.
- :func:`inside`, :func:`append_bytes`, :func:`remove`: reads, appends and deletions in a run directory resolve the
  path first and refuse, in one line, a link that leads out of it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterator

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

from compressive_transformer.core.config import ConfigError


def write_text_atomic(path: Path, text: str) -> Path:
    """Write ``text`` to a temporary file beside ``path`` and rename it into place: readers see the old file or the
    new one, never a torn one. For files whose replacing is the point (a run's config); a link at ``path`` is
    replaced itself, never what it points to."""
    return replace_file(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def replace_file(path: Path, write: Callable[[Path], None]) -> Path:
    """Replace ``path`` atomically with what ``write(tmp)`` writes into a temporary file beside it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, _mode_of(path))  # mkstemp's 0600 would hide results from the user's group
        os.close(fd)
        write(Path(tmp))
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


def next_name(path: Path, n: int) -> Path:
    """The ``n``-th name for ``path`` (``n`` >= 2): ``eval_validation.json`` -> ``eval_validation-2.json``."""
    return path.with_name(f"{path.stem}-{n}{path.suffix}")


def free_name(path: Path) -> Path:
    """``path``, or the first of ``-2``, ``-3``... that nothing holds (a dangling link holds its name too)."""
    candidate, n = path, 2
    while os.path.lexists(candidate):
        candidate, n = next_name(path, n), n + 1
    return candidate


def check_new(path: Path, what: str) -> Path:
    """Before any work: refuse ``path`` when something (a file, a folder, a link) holds it or its folder cannot be
    written, in one line starting with ``what`` (the option that named it)."""
    path = Path(path)
    if os.path.lexists(path):
        kind = "a folder" if path.is_dir() else "a link" if path.is_symlink() else "a file"
        raise ConfigError(f"{what}: {path} is {kind} that exists; give a new file name (nothing is replaced)")
    try:
        require_writable(path)
    except ConfigError:
        raise ConfigError(f"{what}: {path} cannot be written there; give a file in a folder you can write") from None
    return path


def create_file(path: Path, write: Callable[[Path], None], *, what: str = "", renumber: bool = True) -> Path:
    """Create a new file at ``path`` with what ``write(tmp)`` writes into a temporary file beside it, and return its
    name. It appears whole (a hard link of the finished file, which fails rather than replace anything); where the
    name was taken meanwhile it gets the next free one (``renumber``) or is refused. A write that fails (a full
    disk, a folder) is one line naming ``path``, with nothing left behind."""
    path = Path(path)
    label = f"{what}: " if what else ""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise ConfigError(
            f"{label}{path} cannot be written ({e.strerror or e}); give a file in a folder you can write"
        ) from None
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        os.close(fd)
        write(Path(tmp))
        return _link_new(Path(tmp), path, label, renumber)
    except OSError as e:
        raise ConfigError(f"{label}{path} could not be written ({e.strerror or e}); nothing was written") from None
    finally:
        Path(tmp).unlink(missing_ok=True)


def _link_new(tmp: Path, path: Path, label: str, renumber: bool) -> Path:
    candidate, n = path, 2
    while True:
        try:
            os.link(tmp, candidate, follow_symlinks=False)
            return candidate
        except FileExistsError:
            if not renumber:
                raise ConfigError(f"{label}{path} exists; give a new file name (nothing is replaced)") from None
            candidate, n = next_name(path, n), n + 1
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.EXDEV):
                raise
            return _copy_new(tmp, candidate, path, label, renumber)  # a filesystem without hard links


def _copy_new(tmp: Path, candidate: Path, path: Path, label: str, renumber: bool) -> Path:
    """Exclusive creation without hard links: ``O_EXCL`` on the name, then the bytes copied in."""
    n = 2
    while True:
        try:
            fd = os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o666)
            break
        except FileExistsError:
            if not renumber:
                raise ConfigError(f"{label}{path} exists; give a new file name (nothing is replaced)") from None
            candidate, n = next_name(path, n), n + 1
    try:
        with os.fdopen(fd, "wb") as out, tmp.open("rb") as src:
            shutil.copyfileobj(src, out)
    except BaseException:
        candidate.unlink(missing_ok=True)
        raise
    return candidate


def create_text(path: Path, text: str, *, what: str = "", renumber: bool = True) -> Path:
    """:func:`create_file` for UTF-8 text."""
    return create_file(path, lambda tmp: tmp.write_text(text, encoding="utf-8"), what=what, renumber=renumber)


def inside(base: Path, path: Path) -> Path:
    """``path`` resolved (every link on the way followed), after checking it stays in ``base``: one line otherwise,
    naming where it leads. What a run reads, appends to or deletes is checked with this first."""
    root, resolved = Path(base).resolve(), Path(path).resolve()
    if resolved != root and root not in resolved.parents:
        raise ConfigError(
            f"{path}: is a link that leads out of {base} (to {resolved}); replace it with a real file or folder"
        )
    return resolved


def read_utf8(path: Path, what: str, remedy: str) -> str:
    """The text of ``path``; one line naming ``what`` (the option) and the first byte that is not UTF-8 otherwise."""
    try:
        return Path(path).read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{what}: {path} is not UTF-8 text (byte {e.start} is not); {remedy}") from None


def check_links(root: Path) -> None:
    """Refuse, in one line, the first link under ``root`` that leads out of it (links that stay inside are fine):
    what a run holds is read, appended to and deleted only where the run is."""
    for folder, dirs, files in os.walk(root):  # links to folders are listed, never entered
        for name in (*dirs, *files):
            if os.path.islink(entry := os.path.join(folder, name)):
                inside(root, Path(entry))


def append_bytes(path: Path, data: bytes, *, base: Path | None = None) -> None:
    """Append ``data`` to ``path`` (created when missing), refusing a path that leads out of ``base`` (default: the
    file's own folder), on a fresh line when the file's last line was cut short."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    inside(base if base is not None else path.parent, path)
    with path.open("a+b") as f:
        size = f.seek(0, 2)
        if size:
            f.seek(size - 1)
            if f.read(1) != b"\n":
                data = b"\n" + data
        f.write(data)


def remove(path: Path, *, base: Path) -> None:
    """Delete what the program wrote at ``path`` in ``base``: a folder with what it holds, a file, or a link itself
    (never what a link points to); one line when ``path`` leads out of ``base`` through a link above it."""
    path = Path(path)
    inside(base, path.parent)
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)  # rmtree never follows a link inside the tree


__all__ = [
    "append_bytes",
    "check_links",
    "check_new",
    "create_file",
    "create_text",
    "exclusive",
    "free_name",
    "inside",
    "next_name",
    "read_utf8",
    "remove",
    "replace_file",
    "require_writable",
    "write_text_atomic",
]
