"""Success curves of agent runs: episodes binned by the step they ended at, the tail past the budget in the last bin."""

from __future__ import annotations

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
