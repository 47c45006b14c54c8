"""The console entry point (``compressive-transformer``), light on purpose: the command line itself
(:mod:`compressive_transformer.cli`) imports torch and every command, which takes seconds on a cold start. Ctrl-C
during those seconds used to print a ``KeyboardInterrupt`` traceback from inside ``import torch`` (or, landing inside
numpy's import, an ``ImportError``); here it ends in one line and exit code 130, as Ctrl-C does later in any command.
This module imports nothing of the package at its top (the package's ``__init__`` is lazy too)."""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType

INTERRUPTED_STARTING = "error: interrupted while starting, before the command began; nothing was done"


def _stop_starting(signum: int, frame: FrameType | None) -> None:
    """Ctrl-C while the command line is imported: nothing has been read or written yet, and an exception raised in
    the middle of an import can leave it half done, so stop the process here."""
    sys.stderr.write(INTERRUPTED_STARTING + "\n")
    sys.stderr.flush()
    os._exit(130)


def main(argv: list[str] | None = None) -> int:
    ours = threading.current_thread() is threading.main_thread() and (
        signal.getsignal(signal.SIGINT) is signal.default_int_handler  # not where Ctrl-C is ignored (a background job)
    )
    if ours:
        signal.signal(signal.SIGINT, _stop_starting)
    try:
        from compressive_transformer import cli  # torch and every command: the slow part of starting
    except KeyboardInterrupt:  # raised by something else than the signal (the handler above exits first)
        print(INTERRUPTED_STARTING, file=sys.stderr)
        return 130
    finally:
        if ours:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())
