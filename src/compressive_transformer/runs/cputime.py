"""The process CPU seconds a run's training took, kept in its run directory across the calls that trained it.

Wall-clock time on a shared machine counts other people's work and any pause (a process stopped with SIGSTOP keeps
its wall clock running); the process's own CPU time (``time.process_time``: user + system time of every thread of
this process) does not. With one torch thread per run it is the run's cost in core-seconds.

The training loops (text and agents) keep a :class:`Clock` and, just before writing each checkpoint, append one
line ``{"from": step, "to": step, "seconds": s}`` to ``cpu_seconds.jsonl``: the CPU seconds since the previous
checkpoint of the same call. A call killed between checkpoints loses only the lap it was in, which its resumed call
trains again from the last checkpoint and records; a lap recorded for a checkpoint that was then not written (killed
or failed mid-write) is replaced when its steps are recorded again (:func:`total`). So the lines cover the run's
steps once each and count the work the run kept. Only the learner's process is counted (not an agent's actor
processes, not other ranks). A line cut short by a kill mid-write, or one that is not a lap, is skipped and said once
(:mod:`~compressive_transformer.runs.jsonl`).
"""

from __future__ import annotations

import math
import numbers
import time
from pathlib import Path
from typing import Any

from compressive_transformer.core.fileio import inside
from compressive_transformer.runs.jsonl import append_record, read_records

FILE = "cpu_seconds.jsonl"


class Clock:
    """One training call's CPU time, recorded for ``run_dir`` in laps that end at checkpoint steps."""

    def __init__(self, run_dir: str | Path, step: int) -> None:
        self.run_dir, self.step, self.t0 = Path(run_dir), step, time.process_time()
        inside(self.run_dir, self.run_dir / FILE)  # a link out of the run is refused before any training

    def lap(self, step: int) -> None:
        """Record the steps since the last lap (or the call's start) up to ``step``, about to be checkpointed.
        Nothing when no step was trained since (a final checkpoint re-saved)."""
        now = time.process_time()
        if step > self.step:
            record(self.run_dir, start=self.step, end=step, seconds=now - self.t0)
            self.step, self.t0 = step, now


def record(run_dir: str | Path, *, start: int, end: int, seconds: float) -> None:
    append_record(Path(run_dir) / FILE, {"from": start, "to": end, "seconds": seconds})


def _is_lap(record: dict[str, Any]) -> bool:
    """Whole steps ``from`` < ``to`` and a finite, non-negative number of ``seconds``."""
    start, end, seconds = record.get("from"), record.get("to"), record.get("seconds")
    steps_ok = all(isinstance(v, int) and not isinstance(v, bool) for v in (start, end)) and start < end
    return (
        steps_ok
        and isinstance(seconds, numbers.Real)
        and not isinstance(seconds, bool)
        and math.isfinite(seconds)
        and seconds >= 0
    )


def total(run_dir: str | Path) -> dict[str, float | int] | None:
    """``{"seconds", "steps", "laps"}`` summed over the recorded laps, None when nothing is recorded. A line whose
    steps overlap an earlier line's (steps trained again after a kill or a failed checkpoint) replaces the lines it
    overlaps."""
    path = Path(run_dir) / FILE
    if not path.is_file():
        return None
    spans: list[dict[str, Any]] = []
    for s in read_records(path, valid=_is_lap):
        spans = [p for p in spans if p["to"] <= s["from"] or p["from"] >= s["to"]] + [s]
    if not spans:
        return None
    return {
        "seconds": sum(float(s["seconds"]) for s in spans),
        "steps": int(sum(s["to"] - s["from"] for s in spans)),
        "laps": len(spans),
    }


__all__ = ["FILE", "Clock", "record", "total"]
