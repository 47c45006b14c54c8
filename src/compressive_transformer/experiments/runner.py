"""The one experiment runner under ``compare``, ``study``, the long-range tasks and their seeded ablation.

An experiment is a grid of cells (variant or model x task x seed); each cell is trained and measured once and leaves
one result file, written atomically (:func:`write_json`), so a killed experiment loses at most the cells in flight
and the next call runs only the cells without a result (each experiment decides what "done" means for its cells).
:func:`run_cells` runs the remaining cells one after another in this process, or ``parallel`` at a time in one pool
of spawned worker processes, with the CPU threads split between them (:func:`split_threads`).
"""

from __future__ import annotations

import json
import multiprocessing
from concurrent import futures
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

from compressive_transformer.core.fileio import write_text_atomic

C = TypeVar("C")
R = TypeVar("R")
POLL_SECONDS = 10  # how often ``on_wait`` hears which cells are still running


def split_threads(total: int, parallel: int) -> tuple[int, int]:
    """``(lanes, threads_per_cell)``: at most ``parallel`` cells at once and never more cells than threads, each
    with an equal share of ``total`` threads (at least one)."""
    lanes = max(1, min(parallel, total))
    return lanes, max(1, total // lanes)


def write_json(path: Path, data: Any, *, indent: int = 1) -> Path:
    """A result file, atomically (temp file + rename): a reader sees the old file or the new one, never half."""
    return write_text_atomic(Path(path), json.dumps(data, indent=indent) + "\n")


def run_cells(
    cells: Sequence[C],
    work: Callable[[C], R],
    *,
    parallel: int = 1,
    on_done: Callable[[C, R], None] | None = None,
    on_error: Callable[[C, Exception], None] | None = None,
    on_wait: Callable[[list[C]], None] | None = None,
) -> None:
    """``work(cell)`` for every cell, in order when ``parallel`` is 1, else ``parallel`` at a time in worker
    processes (``work`` and the cells must then pickle: a module-level function and plain data). ``on_done`` sees
    each result as it arrives; ``on_wait`` the cells still running, every :data:`POLL_SECONDS` (for progress).
    A failing cell stops the experiment with its exception, unless ``on_error`` takes it (the others then run on)."""

    def finish(cell: C, result: Callable[[], R]) -> None:
        try:
            value = result()
        except Exception as e:
            if on_error is None:
                raise
            on_error(cell, e)
            return
        if on_done is not None:
            on_done(cell, value)

    if parallel <= 1:
        for cell in cells:
            finish(cell, lambda c=cell: work(c))
        return
    with futures.ProcessPoolExecutor(max_workers=parallel, mp_context=multiprocessing.get_context("spawn")) as pool:
        pending = {pool.submit(work, cell): cell for cell in cells}
        while pending:
            finished, _ = futures.wait(pending, timeout=POLL_SECONDS, return_when=futures.FIRST_COMPLETED)
            for fut in finished:
                finish(pending.pop(fut), fut.result)
            if on_wait is not None:
                on_wait(list(pending.values()))


__all__ = ["POLL_SECONDS", "run_cells", "split_threads", "write_json"]
