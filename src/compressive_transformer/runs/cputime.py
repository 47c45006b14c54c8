"""The process CPU seconds a run's training took, kept in its run directory across the calls that trained it.

Wall-clock time on a shared machine counts other people's work and any pause (a process stopped with SIGSTOP keeps
its wall clock running); the process's own CPU time (``time.process_time``: user + system time of every thread of
this process) does not. With one torch thread per run it is the run's cost in core-seconds.

Each training call that returns appends one line ``{"from": step, "to": step, "seconds": s}`` to
``cpu_seconds.jsonl``. A call killed before it returns writes nothing, and the resumed call starts again from the
last checkpoint, so the lines cover the run's steps once each and count the work the run kept, not the work lost
to the kill.
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

FILE = "cpu_seconds.jsonl"


@dataclass
class Span:
    """One training call: steps ``start`` to ``end`` (set by the caller before the block ends)."""

    start: int
    end: int | None = None


@contextmanager
def counting(run_dir: str | Path, start: int) -> Iterator[Span]:
    """Count this process's CPU seconds over the block and record them for ``run_dir`` when it returns, with the
    steps it covered: ``start`` and whatever the block sets as ``span.end``. Nothing is recorded if the block
    raises or sets no end, or if it trained no step."""
    span = Span(start)
    t0 = time.process_time()
    yield span
    seconds = time.process_time() - t0
    if span.end is not None and span.end > span.start:
        record(run_dir, start=span.start, end=span.end, seconds=seconds)


def record(run_dir: str | Path, *, start: int, end: int, seconds: float) -> None:
    path = Path(run_dir) / FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps({"from": start, "to": end, "seconds": seconds}) + "\n")


def total(run_dir: str | Path) -> dict[str, float | int] | None:
    """``{"seconds", "steps", "calls"}`` summed over the recorded calls, None when nothing is recorded. A line
    whose steps overlap an earlier line's (a call that repeated steps) replaces the lines it overlaps."""
    path = Path(run_dir) / FILE
    if not path.is_file():
        return None
    spans: list[dict[str, float]] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        s = json.loads(line)
        spans = [p for p in spans if p["to"] <= s["from"] or p["from"] >= s["to"]] + [s]
    if not spans:
        return None
    return {
        "seconds": sum(float(s["seconds"]) for s in spans),
        "steps": int(sum(s["to"] - s["from"] for s in spans)),
        "calls": len(spans),
    }


def checkpoint_step(path: Path | None) -> int:
    """The step of a checkpoint directory ``step-NNNNNNNN`` (0 for none)."""
    return 0 if path is None else int(path.name.removeprefix("step-"))


__all__ = ["FILE", "Span", "checkpoint_step", "counting", "record", "total"]
