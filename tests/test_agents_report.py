"""Success curves of agent runs: episodes binned by the step they ended at, the tail past the budget in the last bin."""

from __future__ import annotations

import json
import math

from compressive_transformer.agents.report import final_success, success_curve


def _record(env_steps: int, episodes: int, successes: int) -> dict:
    return {"env_steps": env_steps, "new_episodes": episodes, "new_successes": successes}


def test_success_curve_bins_and_final() -> None:
    records = [_record(50, 4, 1), _record(100, 4, 3), _record(150, 0, 0), _record(200, 2, 2), _record(210, 2, 0)]
    curve = success_curve(records, 100, total_steps=200)
    assert curve == [0.5, 0.5]  # steps 1-100: 4 of 8; 101-200 and the 10 steps past the budget: 2 of 4
    assert math.isnan(success_curve(records[:3], 100)[1])  # no episode ended there
    assert final_success(records, 200, 0.5) == 0.5
    assert math.isnan(final_success(records[:1], 200, 0.25))


def _windowed(*rates: float, every: int = 100) -> list[dict]:
    return [{"env_steps": every * (i + 1), "success_rate": r} for i, r in enumerate(rates)]


def test_stability_counts_drops_after_solving() -> None:
    from compressive_transformer.agents.report import stability

    never = stability(_windowed(0.5, 0.55, 0.89, 0.5))
    assert never["solved_at"] is None and never["drops"] == [] and not never["stays_solved"]
    assert never["lowest_after_solving"] is None

    kept = stability(_windowed(0.5, 0.9, 0.7, 0.95))  # 0.7 is a dip, not a drop (not below 0.6)
    assert kept["solved_at"] == 200 and kept["drops"] == [] and kept["stays_solved"]
    assert kept["lowest_after_solving"] == 0.7 and kept["final"] == 0.95

    # a fall below 0.6 after >= 0.9 is a drop; a second one counts only after the run solved again
    rates = (0.5, 0.92, 0.59, 0.5, 0.55, 0.91, 0.3, 0.8, 0.4, 0.99)
    twice = stability(_windowed(*rates))
    assert twice["drops"] == [
        {"at": 300, "lowest": 0.5, "recovered_at": 600},
        {"at": 700, "lowest": 0.3, "recovered_at": 1000},
    ]
    assert not twice["stays_solved"] and twice["final"] == 0.99  # it ends solved, but it did not keep it

    fell = stability(_windowed(0.95, 0.96, 0.5))  # ends mid-drop
    assert fell["drops"] == [{"at": 300, "lowest": 0.5, "recovered_at": None}] and not fell["stays_solved"]
    late = stability(_windowed(0.5, 0.95, 0.85))  # solved and never dropped, but ends below 0.9
    assert late["drops"] == [] and not late["stays_solved"]
    edge = stability(_windowed(0.9, 0.6))  # exactly at the thresholds: solved, and 0.6 is not below 0.6
    assert edge["solved_at"] == 100 and edge["drops"] == []


def test_packed_metrics_read_back_as_written(tmp_path) -> None:
    from compressive_transformer.agents.report import PACKED, pack_metrics, read_run_metrics

    records = [{"step": i, "env_steps": 10 * i, "success_rate": i / 10} for i in range(1, 4)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    first = pack_metrics(tmp_path).read_bytes()
    assert pack_metrics(tmp_path).read_bytes() == first  # the same bytes every time: a commit does not churn
    (tmp_path / "metrics.jsonl").unlink()
    assert (tmp_path / PACKED).is_file() and read_run_metrics(tmp_path) == records
    assert read_run_metrics(tmp_path / "absent") == []
