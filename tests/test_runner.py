"""The experiment runner under compare, study, the long-range tasks and the ablation: threads split between cells,
results written atomically, failures either stopping the experiment or collected while the others run on."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from compressive_transformer.experiments.runner import run_cells, split_threads, write_json


@given(total=st.integers(1, 256), parallel=st.integers(1, 64))
def test_threads_are_split_without_oversubscribing(total: int, parallel: int) -> None:
    lanes, per_cell = split_threads(total, parallel)
    assert 1 <= lanes <= min(total, parallel) and per_cell >= 1 and lanes * per_cell <= total


def test_a_result_file_is_whole_or_absent(tmp_path: Path) -> None:
    path = write_json(tmp_path / "results" / "a.json", {"x": [1, 2]})
    assert json.loads(path.read_text()) == {"x": [1, 2]} and [p.name for p in path.parent.iterdir()] == ["a.json"]

    class Unwritable:
        pass

    with pytest.raises(TypeError):
        write_json(path, {"x": Unwritable()})  # fails while encoding: the old file stays
    assert json.loads(path.read_text()) == {"x": [1, 2]} and [p.name for p in path.parent.iterdir()] == ["a.json"]


@pytest.mark.parametrize("parallel", [1, 2])
def test_failures_stop_the_experiment_unless_collected(parallel: int) -> None:
    done, failed = {}, []
    run_cells(
        [4.0, -1.0, 9.0],
        math.sqrt,
        parallel=parallel,
        on_done=done.__setitem__,
        on_error=lambda cell, e: failed.append((cell, type(e))),
    )
    assert done == {4.0: 2.0, 9.0: 3.0} and failed == [(-1.0, ValueError)]
    with pytest.raises(ValueError):
        run_cells([4.0, -1.0], math.sqrt, parallel=parallel)


def test_cells_run_in_order_in_this_process() -> None:
    seen = []
    run_cells(["a", "b", "c"], lambda c: seen.append(c) or c.upper(), on_done=lambda c, r: seen.append(r))
    assert seen == ["a", "A", "b", "B", "c", "C"]
