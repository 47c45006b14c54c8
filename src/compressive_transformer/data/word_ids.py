"""Word ids of texts, and a pool of processes computing them: the word tokenizer's lookups are Python's (the
``tokenizers`` library's word-level model is slower here, and its whitespace is not ``str.split()``'s), so the
GIL holds them to one core unless other processes share the work. This module imports only numpy: a worker starts
in a fraction of a second."""

from __future__ import annotations

import ctypes
import itertools
import multiprocessing
import os
import signal
import sys
from concurrent.futures import ProcessPoolExecutor
from typing import Sequence

import numpy as np

PR_SET_PDEATHSIG = 1  # Linux prctl: the signal a process receives when the thread that forked it ends
_WORKER_VOCAB: tuple[dict[str, int], int] | None = None  # set in each worker process by its initializer


def word_ids(texts: Sequence[str], index: dict[str, int], unk: int) -> list[np.ndarray]:
    """Each text's words (``str.split()``) as ids, ``unk`` for words not in ``index``; ``map`` with the dict's own
    ``get`` runs the lookups in C, with no Python bytecode per word."""
    out = []
    for text in texts:
        words = text.split()
        out.append(np.fromiter(map(index.get, words, itertools.repeat(unk)), dtype=np.int64, count=len(words)))
    return out


def _init(index: dict[str, int], unk: int, parent: int) -> None:
    global _WORKER_VOCAB
    _WORKER_VOCAB = (index, unk)
    _die_with(parent)


def _die_with(parent: int) -> None:
    """Make this worker end when the process that started it ends, however it ends: a build killed with SIGKILL
    must not leave its workers waiting forever on a queue whose other end every sibling still holds open."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the parent ended before the signal was asked for
        os._exit(1)


def _worker_ids(texts: list[str]) -> list[np.ndarray]:
    assert _WORKER_VOCAB is not None
    return word_ids(texts, *_WORKER_VOCAB)


class WordPool:
    """:func:`word_ids` over a batch, split across one process per core (or in this process with one core)."""

    def __init__(self, index: dict[str, int], unk: int, workers: int | None = None) -> None:
        self.index, self.unk = index, unk
        self.workers = (
            workers or len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        )
        self._pool: ProcessPoolExecutor | None = None

    def start(self) -> None:
        """Start the worker processes now: a process forked while other threads run may inherit a lock one of
        them held, so a caller about to start threads starts the pool first."""
        if self.workers <= 1 or self._pool is not None:
            return
        # fork, as torch's DataLoader does on Linux: the workers inherit the vocabulary instead of unpickling it,
        # and a script calling this needs no `if __name__ == "__main__"` guard (spawn would run it again)
        ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
        self._pool = ProcessPoolExecutor(
            self.workers, mp_context=ctx, initializer=_init, initargs=(self.index, self.unk, os.getpid())
        )
        self._pool.submit(int).result()  # a forking executor starts all its workers at its first task

    def __call__(self, texts: Sequence[str]) -> list[np.ndarray]:
        if self.workers <= 1 or len(texts) < 2:
            return word_ids(texts, self.index, self.unk)
        self.start()
        assert self._pool is not None
        n = min(len(texts), 2 * self.workers)
        bounds = [round(i * len(texts) / n) for i in range(n + 1)]
        parts = self._pool.map(_worker_ids, [list(texts[a:b]) for a, b in zip(bounds, bounds[1:])])
        return [ids for part in parts for ids in part]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None
