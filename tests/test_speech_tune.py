"""The tuned speech comparison's pre-registered rules (benchmarks/speech/tune.py): the sweep's choice and its
extension past an edge, the seeds the CT - TXL interval asks for, and the specs written from fair.toml's arms."""

from __future__ import annotations

import pytest

from benchmarks.speech import tune
from compressive_transformer.core.config import load_toml


def test_the_sweep_rule_extends_past_an_edge_and_takes_the_best() -> None:
    assert tune.beyond({3e-4: 4.8, 1e-3: 4.1, 3e-3: 4.3}) is None  # inside the grid: nothing more
    assert tune.beyond({3e-4: 4.8, 1e-3: 4.1, 3e-3: 4.0}) == 1e-2
    assert tune.beyond({3e-4: 4.0, 1e-3: 4.1, 3e-3: 4.3}) == 1e-4
    assert tune.chosen({3e-4: 4.8, 1e-3: 4.1, 3e-3: 4.0, 1e-2: 4.05}) == 3e-3
    assert tune.chosen({3e-4: 4.8, 1e-3: 4.1, 3e-3: 4.0, 1e-2: 3.9}) == 1e-2
    with pytest.raises(SystemExit, match="lr 1e-2 first"):
        tune.chosen({3e-4: 4.8, 1e-3: 4.1, 3e-3: 4.0})
    with pytest.raises(SystemExit, match="has not finished"):
        tune.beyond({3e-4: 4.8, 1e-3: 4.1})


def test_more_seeds_only_while_the_interval_is_wider_than_the_margin() -> None:
    assert tune.LEVEL == pytest.approx(1 - 0.05 / 3)
    assert tune.seeds_needed([0.01, 0.02, 0.015, 0.012, 0.018]) == 5  # SD 0.004: far within +-0.1
    wide = [-0.08, 0.1, 0.0, -0.09, 0.12]  # SD 0.097: t(4) x SD / sqrt(5) = 0.17 at 98.3%
    n = tune.seeds_needed(wide)
    assert 5 < n <= tune.MAX_SEEDS
    assert tune.seeds_needed([-1.0, 1.0, -1.0, 1.0, 0.0]) == tune.MAX_SEEDS  # never enough: the cap


def test_the_specs_are_fair_tomls_arms_at_the_swept_rates() -> None:
    sweep = load_toml(tune.HERE / "lr-sweep.toml")
    fair = load_toml(tune.HERE / "fair.toml")
    assert sweep["base"] == fair["base"] and sweep["study"]["seeds"] == [0]
    assert sweep["study"]["splits"] == ["validation"]  # the test split is not seen by the choice
    for arm in tune.TRANSFORMERS:
        for lr in tune.GRID:
            v = sweep["variants"][f"{arm}-lr{tune.lr_name(lr)}"]
            assert v["model"] == fair["variants"][arm]["model"] and v["train"]["lr"] == lr
    assert tune.lr_name(1e-2) == "1e-2" and tune.lr_name(3e-4) == "3e-4"
