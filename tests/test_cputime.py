"""A run's training CPU seconds, recorded per training call in its run directory and summed over its steps."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from compressive_transformer.runs import cputime


def _busy(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_a_call_records_its_steps_and_this_processs_cpu_seconds(tmp_path: Path) -> None:
    with cputime.counting(tmp_path, 0) as span:
        _busy(0.05)
        span.end = 10
    lines = [json.loads(x) for x in (tmp_path / cputime.FILE).read_text().splitlines()]
    assert [(x["from"], x["to"]) for x in lines] == [(0, 10)]
    assert lines[0]["seconds"] >= 0.05
    with cputime.counting(tmp_path, 10) as span:
        span.end = 25
    total = cputime.total(tmp_path)
    assert total["steps"] == 25 and total["calls"] == 2 and total["seconds"] >= 0.05


def test_nothing_is_recorded_for_a_call_that_fails_trains_nothing_or_sets_no_end(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError):
        with cputime.counting(tmp_path, 0) as span:
            raise RuntimeError("killed")
    with cputime.counting(tmp_path, 30) as span:
        span.end = 30  # resumed a finished run
    with cputime.counting(tmp_path, 0):
        pass
    assert cputime.total(tmp_path) is None and not (tmp_path / cputime.FILE).exists()


def test_a_call_that_repeats_steps_replaces_the_lines_it_overlaps(tmp_path: Path) -> None:
    cputime.record(tmp_path, start=0, end=100, seconds=5.0)
    cputime.record(tmp_path, start=100, end=200, seconds=7.0)
    cputime.record(tmp_path, start=100, end=300, seconds=11.0)  # trained again from step 100
    assert cputime.total(tmp_path) == {"seconds": 16.0, "steps": 300, "calls": 2}


def test_checkpoint_step() -> None:
    assert cputime.checkpoint_step(Path("run/checkpoints/step-00001500")) == 1500
    assert cputime.checkpoint_step(None) == 0
