"""A run's training CPU seconds, recorded at each checkpoint in its run directory and summed over its steps."""

from __future__ import annotations

import json
import time
from pathlib import Path

from compressive_transformer.runs import cputime


def _busy(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_laps_record_the_steps_between_checkpoints_and_this_processs_cpu_seconds(tmp_path: Path) -> None:
    clock = cputime.Clock(tmp_path, 0)
    _busy(0.05)
    clock.lap(10)
    clock.lap(25)
    clock.lap(25)  # the final checkpoint re-saved: no step trained since, nothing recorded
    lines = [json.loads(x) for x in (tmp_path / cputime.FILE).read_text().splitlines()]
    assert [(x["from"], x["to"]) for x in lines] == [(0, 10), (10, 25)]
    assert lines[0]["seconds"] >= 0.05 and lines[1]["seconds"] < 0.05
    resumed = cputime.Clock(tmp_path, 25)  # a second call, resumed from the checkpoint of step 25
    resumed.lap(30)
    assert cputime.total(tmp_path)["steps"] == 30 and cputime.total(tmp_path)["laps"] == 3


def test_a_call_that_trains_nothing_records_nothing(tmp_path: Path) -> None:
    cputime.Clock(tmp_path, 30).lap(30)  # resumed a finished run
    assert cputime.total(tmp_path) is None and not (tmp_path / cputime.FILE).exists()


def test_a_call_that_repeats_steps_replaces_the_lines_it_overlaps(tmp_path: Path) -> None:
    cputime.record(tmp_path, start=0, end=100, seconds=5.0)
    cputime.record(tmp_path, start=100, end=200, seconds=7.0)
    cputime.record(tmp_path, start=100, end=300, seconds=11.0)  # trained again from step 100
    assert cputime.total(tmp_path) == {"seconds": 16.0, "steps": 300, "laps": 2}
